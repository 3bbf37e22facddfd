// The operator API's tensors and scalars (libnnopbase.so, meta.cpp), as libopapi.so's operators
// (ops.cpp) read them. Host-side descriptions only: the data is device memory the caller owns.
#pragma once

#include <cstdint>
#include <vector>

#include "aclnn/acl_meta.h"

struct aclTensor {
  std::vector<int64_t> view;
  std::vector<int64_t> strides;
  std::vector<int64_t> storage;
  aclDataType dtype;
  int64_t offset;  // in elements
  aclFormat format;
  void *data;
};

struct aclScalar {
  aclDataType dtype;
  double value;  // every type npusim's operators take fits a double exactly
};

struct aclIntArray {
  std::vector<int64_t> values;
};

namespace npusim::aclnn {

// Bytes per element, or 0 for a type npusim's operators do not take.
size_t element_size(aclDataType t);
// Elements in a view; -1 if a dimension is negative or it overflows.
int64_t element_count(const aclTensor &t);
// True if the tensor's view is dense row-major (the only layout npusim's operators take).
bool contiguous(const aclTensor &t);

}  // namespace npusim::aclnn

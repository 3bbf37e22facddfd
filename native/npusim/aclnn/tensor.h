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

// Bytes per element, or 0 for a type npusim does not take.
inline size_t element_size(aclDataType t) {
  switch (t) {
    case ACL_FLOAT: case ACL_INT32: case ACL_UINT32: return 4;
    case ACL_FLOAT16: case ACL_BF16: case ACL_INT16: case ACL_UINT16: return 2;
    case ACL_INT8: case ACL_UINT8: case ACL_BOOL: return 1;
    case ACL_INT64: case ACL_UINT64: case ACL_DOUBLE: return 8;
    default: return 0;
  }
}

// Elements in a view; -1 if a dimension is negative or it overflows.
inline int64_t element_count(const aclTensor &t) {
  int64_t n = 1;
  for (int64_t d : t.view)
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// True if the tensor's view is dense row-major (the only layout npusim's operators take).
inline bool contiguous(const aclTensor &t) {
  int64_t want = 1;
  for (size_t i = t.view.size(); i-- > 0;) {
    if (t.view[i] != 1 && t.strides[i] != want) return false;
    want *= t.view[i];
  }
  return true;
}

}  // namespace npusim::aclnn

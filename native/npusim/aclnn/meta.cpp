// libnnopbase.so: tensors, scalars and int arrays of the operator API (aclnn/acl_meta.h).
#include <cstring>
#include <new>

#include "tensor.h"


namespace {

double read_scalar(const void *value, aclDataType t) {
  switch (t) {
    case ACL_FLOAT: { float v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_DOUBLE: { double v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_INT32: { int32_t v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_INT64: { int64_t v; std::memcpy(&v, value, sizeof v); return static_cast<double>(v); }
    case ACL_UINT32: { uint32_t v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_INT8: { int8_t v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_UINT8: case ACL_BOOL: { uint8_t v; std::memcpy(&v, value, sizeof v); return v; }
    case ACL_INT16: { int16_t v; std::memcpy(&v, value, sizeof v); return v; }
    default: return 0;
  }
}

}  // namespace

extern "C" {

aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum, aclDataType dataType, const int64_t *stride,
                           int64_t offset, aclFormat format, const int64_t *storageDims, uint64_t storageDimsNum,
                           void *tensorData) {
  if ((viewDims == nullptr && viewDimsNum > 0) || (storageDims == nullptr && storageDimsNum > 0) || offset < 0 ||
      viewDimsNum > 8 || storageDimsNum > 8)
    return nullptr;
  auto *t = new (std::nothrow) aclTensor{};
  if (t == nullptr) return nullptr;
  t->view.assign(viewDims, viewDims + viewDimsNum);
  if (stride != nullptr) {
    t->strides.assign(stride, stride + viewDimsNum);
  } else {  // dense row-major
    t->strides.assign(viewDimsNum, 1);
    for (size_t i = viewDimsNum; i-- > 1;) t->strides[i - 1] = t->strides[i] * viewDims[i];
  }
  t->storage.assign(storageDims, storageDims + storageDimsNum);
  t->dtype = dataType;
  t->offset = offset;
  t->format = format;
  t->data = tensorData;
  return t;
}

aclScalar *aclCreateScalar(void *value, aclDataType dataType) {
  if (value == nullptr || npusim::aclnn::element_size(dataType) == 0) return nullptr;
  return new (std::nothrow) aclScalar{dataType, read_scalar(value, dataType)};
}

aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size) {
  if (value == nullptr && size > 0) return nullptr;
  auto *a = new (std::nothrow) aclIntArray{};
  if (a != nullptr) a->values.assign(value, value + size);
  return a;
}

aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
  if (tensor == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  delete tensor;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyScalar(const aclScalar *scalar) {
  if (scalar == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  delete scalar;
  return ACLNN_SUCCESS;
}

aclnnStatus aclDestroyIntArray(const aclIntArray *array) {
  if (array == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  delete array;
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetViewShape(const aclTensor *tensor, int64_t **viewDims, uint64_t *viewDimsNum) {
  if (tensor == nullptr || viewDims == nullptr || viewDimsNum == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  // The caller frees *viewDims with delete[] (as CANN documents).
  *viewDims = new int64_t[tensor->view.size() + 1];
  std::memcpy(*viewDims, tensor->view.data(), tensor->view.size() * sizeof(int64_t));
  *viewDimsNum = tensor->view.size();
  return ACLNN_SUCCESS;
}

aclnnStatus aclGetDataType(const aclTensor *tensor, aclDataType *dataType) {
  if (tensor == nullptr || dataType == nullptr) return ACLNN_ERR_PARAM_NULLPTR;
  *dataType = tensor->dtype;
  return ACLNN_SUCCESS;
}

}  // extern "C"

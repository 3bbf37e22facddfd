// aclDataBuffer: a description of memory (an address and a size, host or device) that CANN's
// model and operator calls take. It owns neither: destroying it leaves the memory alone.
#include <cstdint>
#include <new>

#include "acl/acl_base.h"

struct aclDataBuffer {
  void *data;
  size_t size;
};

extern "C" {

aclDataBuffer *aclCreateDataBuffer(void *data, size_t size) {
  return new (std::nothrow) aclDataBuffer{data, size};  // (NULL, 0) is a valid empty buffer in CANN
}

aclError aclDestroyDataBuffer(const aclDataBuffer *dataBuffer) {
  if (dataBuffer == nullptr) return ACL_ERROR_INVALID_PARAM;
  delete dataBuffer;
  return ACL_SUCCESS;
}

aclError aclUpdateDataBuffer(aclDataBuffer *dataBuffer, void *data, size_t size) {
  if (dataBuffer == nullptr) return ACL_ERROR_INVALID_PARAM;
  dataBuffer->data = data;
  dataBuffer->size = size;
  return ACL_SUCCESS;
}

void *aclGetDataBufferAddr(const aclDataBuffer *dataBuffer) { return dataBuffer != nullptr ? dataBuffer->data : nullptr; }

size_t aclGetDataBufferSizeV2(const aclDataBuffer *dataBuffer) { return dataBuffer != nullptr ? dataBuffer->size : 0; }

// The deprecated 32-bit size: a larger buffer's size does not fit, and reads as 0 then.
uint32_t aclGetDataBufferSize(const aclDataBuffer *dataBuffer) {
  const size_t size = aclGetDataBufferSizeV2(dataBuffer);
  return size <= UINT32_MAX ? static_cast<uint32_t>(size) : 0;
}

}  // extern "C"

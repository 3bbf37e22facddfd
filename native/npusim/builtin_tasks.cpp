// Built-in stream tasks that need no kernel: aclrtValueWrite / aclrtValueWait (streams, threads or
// processes synchronizing through a 64-bit word of device memory).
#include "runtime.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

aclError value_task(proto::TaskKind kind, void *devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  if (devAddr == nullptr) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Task t{};
  t.kind = kind;
  t.dst = reinterpret_cast<uint64_t>(devAddr);
  t.target = value;
  t.value = static_cast<int32_t>(flag);
  return submit(t, s);  // an address outside device memory, or not 8-byte aligned: ACL_ERROR_INVALID_PARAM
}

}  // namespace

extern "C" {

aclError aclrtValueWrite(void *devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  if (flag != 0) return ACL_ERROR_INVALID_PARAM;  // reserved
  return value_task(proto::TaskKind::ValueWrite, devAddr, value, flag, stream);
}

aclError aclrtValueWait(void *devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  if (flag > ACL_STREAM_WAIT_VALUE_NOR) return ACL_ERROR_INVALID_PARAM;
  return value_task(proto::TaskKind::ValueWait, devAddr, value, flag, stream);
}

}  // extern "C"

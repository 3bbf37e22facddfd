// Built-in stream tasks, client side: aclrtValueWrite / aclrtValueWait and aclrtReduceAsync queue
// daemon tasks (builtin_tasks.cpp) in stream order.
#include "runtime.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

aclError queue_task(const proto::Task &t, aclrtStream stream, const char *api) {
  CallScope scope;
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, api); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = submit(t, s); rc != ACL_SUCCESS)
    return note_error(rc, std::string(api) + ": the device refused the task (an address outside an allocation?)");
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtValueWrite(void *devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  if (devAddr == nullptr || flag != 0) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtValueWrite: NULL address or flag not 0");
  proto::Task t{};
  t.kind = proto::TaskKind::ValueWrite;
  t.dst = reinterpret_cast<uint64_t>(devAddr);
  t.target = value;
  return queue_task(t, stream, "aclrtValueWrite");
}

aclError aclrtValueWait(void *devAddr, uint64_t value, uint32_t flag, aclrtStream stream) {
  if (devAddr == nullptr || flag > ACL_STREAM_WAIT_VALUE_NOR)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtValueWait: NULL address or unknown ACL_STREAM_WAIT_VALUE_* mode");
  proto::Task t{};
  t.kind = proto::TaskKind::ValueWait;
  t.dst = reinterpret_cast<uint64_t>(devAddr);
  t.target = value;
  t.value = static_cast<int32_t>(flag);
  return queue_task(t, stream, "aclrtValueWait");
}

aclError aclrtReduceAsync(void *dst, const void *src, uint64_t count, aclrtReduceKind kind, aclDataType type,
                          aclrtStream stream, void *reserve) {
  if (dst == nullptr || src == nullptr || reserve != nullptr || kind < ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM ||
      kind > ACL_RT_MEMCPY_SDMA_AUTOMATIC_EQUAL)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtReduceAsync: NULL buffer, reserve not NULL or unknown kind");
  const size_t es = aclDataTypeSize(type);
  if (es == 0 || es > 4 || type == ACL_BOOL || count % es != 0)
    return note_error(ACL_ERROR_INVALID_PARAM,
                      "aclrtReduceAsync: count must be whole elements of an 8-, 16- or 32-bit integer, fp16, bf16 or float type");
  proto::Task t{};
  t.kind = proto::TaskKind::Reduce;
  t.dst = reinterpret_cast<uint64_t>(dst);
  t.src = reinterpret_cast<uint64_t>(src);
  t.size = count;
  t.m = static_cast<uint64_t>(kind);
  t.n = static_cast<uint64_t>(type);
  return count == 0 ? ACL_SUCCESS : queue_task(t, stream, "aclrtReduceAsync");
}

}  // extern "C"

// Built-in stream tasks, client side: aclrtValueWrite / aclrtValueWait and aclrtReduceAsync queue
// daemon tasks (builtin_tasks.cpp) in stream order.
#include <algorithm>
#include <cstring>

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

aclError aclrtRandomNumAsync(const aclrtRandomNumTaskInfo *taskInfo, const aclrtStream stream, void *reserve) {
  if (taskInfo == nullptr || reserve != nullptr || taskInfo->randomResultAddr == nullptr ||
      taskInfo->randomCounterAddr == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtRandomNumAsync: NULL task info, result or counter, or reserve not NULL");
  const aclrtRandomNumFuncParaInfo &f = taskInfo->randomNumFuncParaInfo;
  // The parameters this function reads: a dropout ratio, or two of the distribution.
  const aclrtRandomParaInfo *params[2] = {nullptr, nullptr};
  switch (f.funcType) {
    case ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK: params[0] = &f.paramInfo.dropoutBitmaskInfo.dropoutRation; break;
    case ACL_RT_RANDOM_NUM_FUNC_TYPE_UNIFORM_DIS:
      params[0] = &f.paramInfo.uniformDisInfo.min;
      params[1] = &f.paramInfo.uniformDisInfo.max;
      break;
    case ACL_RT_RANDOM_NUM_FUNC_TYPE_NORMAL_DIS:
    case ACL_RT_RANDOM_NUM_FUNC_TYPE_TRUNCATED_NORMAL_DIS:
      params[0] = &f.paramInfo.normalDisInfo.mean;
      params[1] = &f.paramInfo.normalDisInfo.stddev;
      break;
    default: return note_error(ACL_ERROR_INVALID_PARAM, "aclrtRandomNumAsync: unknown function type");
  }
  for (const aclrtRandomParaInfo *p : {params[0], params[1], &taskInfo->randomSeed, &taskInfo->randomNum})
    if (p != nullptr && p->isAddr != 0)
      return note_error(ACL_ERROR_FEATURE_UNSUPPORTED, "aclrtRandomNumAsync: npusim takes parameters by value (isAddr 0)");
  proto::Task t{};
  t.kind = proto::TaskKind::RandomNum;
  t.dst = reinterpret_cast<uint64_t>(taskInfo->randomResultAddr);
  t.src = reinterpret_cast<uint64_t>(taskInfo->randomCounterAddr);
  std::memcpy(&t.src2, taskInfo->randomSeed.valueOrAddr, sizeof(t.src2));
  std::memcpy(&t.size, taskInfo->randomNum.valueOrAddr, sizeof(t.size));
  t.m = static_cast<uint64_t>(taskInfo->dataType);
  t.n = static_cast<uint64_t>(f.funcType);
  // A parameter's bytes, as many as its type has (the rest of valueOrAddr may be anything).
  auto bits = [&](const aclrtRandomParaInfo *p) {
    uint64_t v = 0;
    if (p != nullptr) std::memcpy(&v, p->valueOrAddr, std::min<size_t>(std::max<size_t>(aclDataTypeSize(taskInfo->dataType), 1), 8));
    return v;
  };
  t.k = bits(params[0]);
  t.target = bits(params[1]);
  return queue_task(t, stream, "aclrtRandomNumAsync");
}

}  // extern "C"

// Floating-point overflow controls: the device's saturation mode and each stream's overflow
// switch and status. npusim's kernels compute in host IEEE arithmetic and do not flag overflow,
// so a stream's overflow status is always 0 ("no overflow"); the settings are kept and reported.
#include <map>

#include "runtime.h"

using namespace npusim::rt;

namespace {

// Guarded by runtime().mu: saturation mode per device (CANN default: saturation).
std::map<int32_t, aclrtFloatOverflowMode> &sat_modes() {
  static auto *m = new std::map<int32_t, aclrtFloatOverflowMode>;
  return *m;
}

}  // namespace

extern "C" {

aclError aclrtSetDeviceSatMode(aclrtFloatOverflowMode mode) {
  if (mode != ACL_RT_OVERFLOW_MODE_SATURATION && mode != ACL_RT_OVERFLOW_MODE_INFNAN)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetDeviceSatMode: mode must be SATURATION or INFNAN");
  Runtime &r = runtime();
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  sat_modes()[d] = mode;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceSatMode(aclrtFloatOverflowMode *mode) {
  if (mode == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetDeviceSatMode: mode is NULL");
  Runtime &r = runtime();
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  auto it = sat_modes().find(d);
  *mode = it == sat_modes().end() ? ACL_RT_OVERFLOW_MODE_SATURATION : it->second;
  return ACL_SUCCESS;
}

aclError aclrtSetStreamOverflowSwitch(aclrtStream stream, uint32_t flag) {
  if (flag > 1) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamOverflowSwitch: flag must be 0 or 1");
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtSetStreamOverflowSwitch"); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  s->overflow_switch = flag;
  return ACL_SUCCESS;
}

aclError aclrtGetStreamOverflowSwitch(aclrtStream stream, uint32_t *flag) {
  if (flag == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetStreamOverflowSwitch: flag is NULL");
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtGetStreamOverflowSwitch"); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  *flag = s->overflow_switch;
  return ACL_SUCCESS;
}

// Queues the write of the stream's status (0: no overflow) into outputAddr, in stream order.
aclError aclrtGetOverflowStatus(void *outputAddr, size_t outputSize, aclrtStream stream) {
  if (outputAddr == nullptr || outputSize == 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetOverflowStatus: no output buffer");
  return aclrtMemsetAsync(outputAddr, outputSize, 0, outputSize, stream);
}

aclError aclrtResetOverflowStatus(aclrtStream stream) {
  StreamObj *s = nullptr;
  return stream_for(stream, &s, "aclrtResetOverflowStatus");  // nothing was flagged: nothing to clear
}

}  // extern "C"

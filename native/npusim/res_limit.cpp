// Resource limits (aclrt*ResLimit): how many cube / vector cores kernels may use, per device,
// per stream, or through a stream a thread "uses". npusim's kernels take them as the most blocks
// that run at once (kernel_objects.h: effective_cores). The limits live in this process only.
#include <map>

#include "kernel_objects.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

// What one simulated device has (an Ascend 910B-like part).
constexpr uint32_t kCores[2] = {24, 48};  // ACL_RT_DEV_RES_CUBE_CORE, ACL_RT_DEV_RES_VECTOR_CORE

struct Limits {
  uint32_t cores[2] = {kCores[0], kCores[1]};
};

// Guarded by runtime().mu.
std::map<int32_t, Limits> g_device;
std::map<StreamObj *, Limits> g_stream;
thread_local StreamObj *t_stream = nullptr;  // aclrtUseStreamResInCurrentThread

bool type_ok(aclrtDevResLimitType type) { return type == ACL_RT_DEV_RES_CUBE_CORE || type == ACL_RT_DEV_RES_VECTOR_CORE; }

int32_t device_ok(int32_t deviceId) {
  Runtime &r = runtime();
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  if (deviceId < 0 || static_cast<uint32_t>(deviceId) >= r.pool.device_count) return ACL_ERROR_RT_INVALID_DEVICEID;
  return ACL_SUCCESS;
}

uint32_t device_limit(int32_t device, int type) {
  auto it = g_device.find(device);
  return it == g_device.end() ? kCores[type] : it->second.cores[type];
}

}  // namespace

namespace npusim::rt {

uint32_t effective_cores(StreamObj *stream) {
  std::lock_guard<std::mutex> g(runtime().mu);
  auto it = g_stream.find(stream);
  uint32_t n = it != g_stream.end() ? it->second.cores[1] : device_limit(stream->device, 1);
  return n == 0 ? 1 : n;
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtGetDeviceResLimit(int32_t deviceId, aclrtDevResLimitType type, uint32_t *value) {
  if (value == nullptr || !type_ok(type)) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (int32_t rc = device_ok(deviceId); rc != ACL_SUCCESS) return rc;
  *value = device_limit(deviceId, type);
  return ACL_SUCCESS;
}

aclError aclrtSetDeviceResLimit(int32_t deviceId, aclrtDevResLimitType type, uint32_t value) {
  if (!type_ok(type) || value == 0 || value > kCores[type]) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (int32_t rc = device_ok(deviceId); rc != ACL_SUCCESS) return rc;
  g_device[deviceId].cores[type] = value;
  return ACL_SUCCESS;
}

aclError aclrtResetDeviceResLimit(int32_t deviceId) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (int32_t rc = device_ok(deviceId); rc != ACL_SUCCESS) return rc;
  g_device.erase(deviceId);
  return ACL_SUCCESS;
}

aclError aclrtGetStreamResLimit(aclrtStream stream, aclrtDevResLimitType type, uint32_t *value) {
  if (value == nullptr || !type_ok(type)) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  auto it = g_stream.find(s);
  *value = it != g_stream.end() ? it->second.cores[type] : device_limit(s->device, type);
  return ACL_SUCCESS;
}

aclError aclrtSetStreamResLimit(aclrtStream stream, aclrtDevResLimitType type, uint32_t value) {
  if (!type_ok(type) || value == 0 || value > kCores[type]) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  auto [it, fresh] = g_stream.try_emplace(s);
  if (fresh) it->second = Limits{{device_limit(s->device, 0), device_limit(s->device, 1)}};
  it->second.cores[type] = value;
  return ACL_SUCCESS;
}

aclError aclrtResetStreamResLimit(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  g_stream.erase(s);
  return ACL_SUCCESS;
}

aclError aclrtUseStreamResInCurrentThread(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  t_stream = s;
  return ACL_SUCCESS;
}

aclError aclrtUnuseStreamResInCurrentThread(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  if (t_stream != s) return ACL_ERROR_INVALID_PARAM;
  t_stream = nullptr;
  return ACL_SUCCESS;
}

aclError aclrtGetResInCurrentThread(aclrtDevResLimitType type, uint32_t *value) {
  if (value == nullptr || !type_ok(type)) return ACL_ERROR_INVALID_PARAM;
  if (t_stream != nullptr) return aclrtGetStreamResLimit(t_stream, type, value);
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  const int32_t d = current_device();
  if (d < 0) return ACL_ERROR_RT_CONTEXT_NULL;
  *value = device_limit(d, type);
  return ACL_SUCCESS;
}

}  // extern "C"

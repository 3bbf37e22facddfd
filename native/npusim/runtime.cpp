// Process-wide runtime state, initialization and device management.
#include "runtime.h"

#include "contexts.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "capture.h"
#include "kernel_objects.h"
#include "trust.h"
#include "va.h"
#include "wire.h"

namespace npusim::rt {

namespace {
thread_local int32_t t_device = -1;
}  // namespace

Runtime &runtime() {
  // Never destroyed: threads may still be inside the runtime while the process exits.
  static Runtime *r = new Runtime;
  return *r;
}

CallScope::CallScope() {
  Runtime &r = runtime();
  std::unique_lock<std::mutex> l(r.mu);
  const auto self = std::this_thread::get_id();
  // A locked process that is behind a peer's collective runs on until it caught up (the free pass).
  r.gate_cv.wait(l, [&] {
    return r.state == State::Running || r.locker == self ||
           (r.state == State::Locked && (r.hccl_behind || r.hccl_recv_owed));
  });
  ++r.inflight;
}

CallScope::CallScope(const void *hccl_comm) {
  Runtime &r = runtime();
  std::unique_lock<std::mutex> l(r.mu);
  const auto self = std::this_thread::get_id();
  r.gate_cv.wait(l, [&] {
    return r.state == State::Running || r.locker == self || (r.state == State::Locked && hccl_admits(hccl_comm));
  });
  ++r.inflight;
}

CallScope::CallScope(const void *hccl_comm, bool send, uint32_t peer) {
  Runtime &r = runtime();
  std::unique_lock<std::mutex> l(r.mu);
  const auto self = std::this_thread::get_id();
  r.gate_cv.wait(l, [&] {
    return r.state == State::Running || r.locker == self ||
           (r.state == State::Locked && hccl_admits_p2p(hccl_comm, send, peer));
  });
  ++r.inflight;
}

CallScope::~CallScope() {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  --r.inflight;
  r.gate_cv.notify_all();
}

int32_t current_device() {
  if (ContextObj *c = thread_context()) return c->device;
  return t_device >= 0 ? t_device : runtime().current_device;
}

aclError active_device(Runtime &r, int32_t *device) {
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclInit was not called");
  *device = current_device();
  if (r.devices.count(*device) == 0)
    return note_error(ACL_ERROR_RT_CONTEXT_NULL, "no current context: call aclrtSetDevice first");
  return ACL_SUCCESS;
}

void set_thread_device(int32_t device) { t_device = device; }

int32_t resolve_stream(aclrtStream stream, StreamObj **out) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  if (stream == nullptr) {
    // The default stream of the current context.
    ContextObj *c = owning_context(r);
    if (c == nullptr || r.devices.count(c->device) == 0)
      return note_error(ACL_ERROR_RT_CONTEXT_NULL, "no current context: call aclrtSetDevice first");
    *out = c->default_stream;
    return ACL_SUCCESS;
  }
  auto *s = static_cast<StreamObj *>(stream);
  if (r.streams.count(s) == 0) return note_error(ACL_ERROR_INVALID_PARAM, "not a live stream");
  *out = s;
  return ACL_SUCCESS;
}

bool peer_ok(int32_t a, int32_t b) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  return a == b || r.peers.count({a, b}) > 0 || r.peers.count({b, a}) > 0;
}

int32_t submit(const proto::Task &task, StreamObj *stream) {
  int32_t captured = ACL_SUCCESS;
  if (capture_task(task, {}, stream, &captured)) return captured;  // recorded into a model (model_ri.cpp)
  proto::Request rq = wire::request(stream ? proto::Op::Enqueue : proto::Op::Exec);
  rq.task = task;
  if (stream == nullptr) return runtime().pool.call(rq);
  rq.stream = stream->id;
  proto::Reply rp{};
  int32_t rc = runtime().pool.call(rq, &rp);
  if (rc == ACL_SUCCESS) note_task(stream, rp.value[0], nullptr, nullptr);
  return rc;
}

void release_device(int32_t device) {
  Runtime &r = runtime();
  std::vector<StreamObj *> streams;
  std::vector<uint64_t> addrs;
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (StreamObj *s : r.streams)
      if (s->device == device) streams.push_back(s);
    for (auto &[va, a] : r.allocs)
      if (a.device == device) addrs.push_back(va);
  }
  proto::Request sync = wire::request(proto::Op::DeviceSync);
  sync.device = device;
  r.pool.call(sync);
  for (StreamObj *s : streams) {
    proto::Request rq = wire::request(proto::Op::StreamDestroy);
    rq.stream = s->id;
    rq.flags = 1;
    r.pool.call(rq);
  }
  for (uint64_t va : addrs) {
    proto::Request rq = wire::request(proto::Op::Free);
    rq.addr = va;
    r.pool.call(rq);
  }
  std::lock_guard<std::mutex> g(r.mu);
  for (StreamObj *s : streams) {
    r.streams.erase(s);
    delete s;
  }
  for (uint64_t va : addrs) r.allocs.erase(va);
  // Peer access stays: CANN keeps it in the driver (halDeviceEnableP2P) and a reset never
  // disables it; only aclrtDeviceDisablePeerAccess (or aclFinalize here) ends it.
  end_contexts(r, device);
  r.devices.erase(device);
  if (r.current_device == device) r.current_device = -1;
}

}  // namespace npusim::rt

using namespace npusim;
using namespace npusim::rt;

extern "C" {

aclError aclInit(const char *configPath) {
  Runtime &r = runtime();
  CallScope scope;
  if (configPath != nullptr && configPath[0] != '\0') {
    struct stat st {};
    if (::stat(configPath, &st) != 0) return ACL_ERROR_INVALID_FILE;
  }
  std::lock_guard<std::mutex> g(r.mu);
  if (r.initialized) return ACL_ERROR_REPEAT_INITIALIZE;
  r.socket_path = trust::socket_from_env();
  std::string why;
  struct stat dst {};
  if (::lstat(trust::dir_of(r.socket_path).c_str(), &dst) != 0 && errno == ENOENT) {
    std::fprintf(stderr, "npusim: no device daemon answers on %s (start npusimd or set NPUSIM_SOCKET)\n",
                 r.socket_path.c_str());
    return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
  }
  if (!trust::dir_trusted(trust::dir_of(r.socket_path), ::geteuid(), &why)) {
    std::fprintf(stderr, "npusim: refusing the socket %s: %s\n", r.socket_path.c_str(), why.c_str());
    return ACL_ERROR_RT_NO_PERMISSION;
  }
  if (int32_t rc = r.pool.open(r.socket_path); rc != ACL_SUCCESS) {
    if (rc == ACL_ERROR_RT_DRV_INTERNAL_ERROR)
      std::fprintf(stderr, "npusim: no device daemon answers on %s (start npusimd or set NPUSIM_SOCKET)\n",
                   r.socket_path.c_str());
    return rc;
  }
  r.initialized = true;
  ++r.epoch;
  load_dump_config(configPath);  // dump.cpp
  start_ctl();  // by-pid checkpoint requests (ctl.cpp)
  return ACL_SUCCESS;
}

aclError aclFinalize() {
  Runtime &r = runtime();
  CallScope scope;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_REPEAT_FINALIZE;
    r.initialized = false;
  }
  r.pool.call(wire::request(proto::Op::Release));
  r.pool.close_all();
  drop_backups();
  forget_kernel_objects();  // binary.cpp: the daemon's binaries went with the session
  std::lock_guard<std::mutex> g(r.mu);
  for (StreamObj *s : r.streams) delete s;
  for (EventObj *e : r.events) delete e;
  r.streams.clear();
  r.events.clear();
  r.allocs.clear();
  r.devices.clear();
  r.peers.clear();
  end_contexts(r, -1);
  r.current_device = -1;
  set_thread_device(-1);
  set_thread_context(nullptr);
  return ACL_SUCCESS;
}

aclError aclrtSetDevice(int32_t deviceId) {
  Runtime &r = runtime();
  CallScope scope;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || static_cast<uint32_t>(deviceId) >= r.pool.device_count) return ACL_ERROR_RT_INVALID_DEVICEID;
    auto it = r.devices.find(deviceId);
    if (it != r.devices.end()) {
      ++it->second.refs;
      r.current_device = deviceId;
      set_thread_device(deviceId);
      set_thread_context(it->second.default_stream->ctx);  // the device's default context
      return ACL_SUCCESS;
    }
  }
  proto::Request rq = wire::request(proto::Op::StreamCreate);
  rq.device = deviceId;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  auto *s = new StreamObj{static_cast<uint32_t>(rp.value[0]), deviceId, true};
  r.streams.insert(s);
  DeviceCtx &ctx = r.devices[deviceId];
  ctx.default_stream = s;
  ++ctx.refs;
  r.current_device = deviceId;
  set_thread_device(deviceId);
  set_thread_context(make_default_context(r, deviceId, s));
  return ACL_SUCCESS;
}

static aclError reset_device(int32_t deviceId, bool force) {
  Runtime &r = runtime();
  CallScope scope;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (deviceId < 0 || static_cast<uint32_t>(deviceId) >= r.pool.device_count) return ACL_ERROR_RT_INVALID_DEVICEID;
    auto it = r.devices.find(deviceId);
    if (it == r.devices.end()) return ACL_SUCCESS;
    if (!force && --it->second.refs > 0) return ACL_SUCCESS;
  }
  release_device(deviceId);
  if (current_device() == deviceId) set_thread_device(-1);
  return ACL_SUCCESS;
}

aclError aclrtResetDevice(int32_t deviceId) { return reset_device(deviceId, false); }

aclError aclrtResetDeviceForce(int32_t deviceId) { return reset_device(deviceId, true); }

aclError aclrtGetDevice(int32_t *deviceId) {
  if (deviceId == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  int32_t d = current_device();
  if (d < 0 || r.devices.count(d) == 0) return ACL_ERROR_RT_CONTEXT_NULL;
  *deviceId = d;
  return ACL_SUCCESS;
}

aclError aclrtGetDeviceCount(uint32_t *count) {
  if (count == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  *count = r.pool.device_count;
  return ACL_SUCCESS;
}

aclError aclrtSynchronizeDevice(void) { return aclrtSynchronizeDeviceWithTimeout(-1); }

// timeout: -1 waits for ever, else ms; ACL_ERROR_RT_STREAM_SYNC_TIMEOUT when a stream is busy then.
aclError aclrtSynchronizeDeviceWithTimeout(int32_t timeout) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeDeviceWithTimeout: timeout is -1 or >= 0 ms");
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::DeviceSync);
  rq.device = d;
  if (timeout >= 0) {
    rq.flags = proto::kSyncTimed;
    rq.timeout_ms = timeout;
  }
  return r.pool.call(rq);
}

aclError aclrtGetMemInfo(aclrtMemAttr attr, size_t *free, size_t *total) {
  if (free == nullptr || total == nullptr || attr < ACL_DDR_MEM || attr > ACL_MEM_P2P_HUGE1G)
    return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::MemInfo);
  rq.device = d;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  *free = rp.value[0];
  *total = rp.value[1];
  return ACL_SUCCESS;
}

aclError aclrtDeviceCanAccessPeer(int32_t *canAccessPeer, int32_t deviceId, int32_t peerDeviceId) {
  if (canAccessPeer == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  const int32_t n = static_cast<int32_t>(r.pool.device_count);
  if (deviceId < 0 || deviceId >= n || peerDeviceId < 0 || peerDeviceId >= n) return ACL_ERROR_RT_INVALID_DEVICEID;
  if (deviceId == peerDeviceId) return ACL_ERROR_INVALID_PARAM;
  *canAccessPeer = 1;  // every simulated device pair is linked
  return ACL_SUCCESS;
}

aclError aclrtDeviceEnablePeerAccess(int32_t peerDeviceId, uint32_t flags) {
  Runtime &r = runtime();
  CallScope scope;
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  if (flags != 0) return ACL_ERROR_INVALID_PARAM;
  const int32_t d = current_device();
  if (r.devices.count(d) == 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (peerDeviceId < 0 || static_cast<uint32_t>(peerDeviceId) >= r.pool.device_count)
    return ACL_ERROR_RT_INVALID_DEVICEID;
  if (peerDeviceId == d) return ACL_ERROR_INVALID_PARAM;
  r.peers.insert({d, peerDeviceId});
  return ACL_SUCCESS;
}

aclError aclrtDeviceDisablePeerAccess(int32_t peerDeviceId) {
  Runtime &r = runtime();
  CallScope scope;
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  const int32_t d = current_device();
  if (r.devices.count(d) == 0) return ACL_ERROR_RT_CONTEXT_NULL;
  if (r.peers.erase({d, peerDeviceId}) == 0) return ACL_ERROR_INVALID_PARAM;
  return ACL_SUCCESS;
}

}  // extern "C"

// The CANN snapshot API: Lock / Backup / Restore / Unlock and stage callbacks.
//
// Backup has every resource kind (resources.h: memory, streams, events, ...) save itself, then
// releases the device entirely (daemon resources freed, every connection closed), so CRIU sees an
// ordinary process. Restore reconnects to whatever daemon now answers on the remembered socket and
// has each kind re-create itself behind the handles the application holds, in the kinds' order.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "acl/npusim.h"
#include "direct.h"
#include "npusnap/states.h"
#include "resources.h"
#include "runtime.h"
#include "trust.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr int64_t kLockTimeoutMs = 60000;  // CANN waits 60 s for the process to quiesce

int64_t lock_timeout_ms() {
  const char *env = std::getenv("NPUSIM_LOCK_TIMEOUT_MS");  // tests shorten it
  return env != nullptr && env[0] != '\0' ? std::max(0LL, std::atoll(env)) : kLockTimeoutMs;
}

const char *state_name(State s) {
  switch (s) {
    case State::Running: return NPUSNAP_STATE_RUNNING;
    case State::Locked: return NPUSNAP_STATE_LOCKED;
    default: return NPUSNAP_STATE_BACKED_UP;
  }
}

// Calls each callback of stage once per open device.
int32_t invoke(aclrtSnapShotStage stage) {
  Runtime &r = runtime();
  std::vector<std::pair<aclrtSnapShotCallBack, void *>> cbs;
  std::vector<int32_t> devices;
  {
    std::lock_guard<std::mutex> g(r.mu);
    cbs = r.callbacks[stage];
    for (auto &[d, ctx] : r.devices) devices.push_back(d);
  }
  for (auto &[cb, args] : cbs)
    for (int32_t d : devices)
      if (cb(d, args) != 0) return ACL_ERROR_SNAPSHOT_CALLBACK_FAILED;
  return ACL_SUCCESS;
}

int32_t device_backup() {
  Runtime &r = runtime();
  if (!r.pool.connected()) return ACL_SUCCESS;  // no device in use: nothing to save
  SnapshotPass pass;
  {
    std::lock_guard<std::mutex> g(r.mu);
    pass.external = data_path().next_external;  // the daemon has exported the data already
  }
  for (const ResourceKind *k : resource_kinds())
    if (k->backup != nullptr)
      if (int32_t rc = k->backup(pass); rc != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
  r.pool.call(wire::request(proto::Op::Release));
  r.pool.close_all();
  return ACL_SUCCESS;
}

int32_t restore_resources() {
  Runtime &r = runtime();
  SnapshotPass pass;
  {
    std::lock_guard<std::mutex> g(r.mu);
    pass.external = data_path().backup_external;
    for (auto &[d, ctx] : r.devices)
      if (static_cast<uint32_t>(d) >= r.pool.device_count) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  for (const ResourceKind *k : resource_kinds())
    if (k->restore != nullptr)
      if (int32_t rc = k->restore(pass); rc != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  // Restored processes are LOCKED: say so to the daemon, which then allows an export or import,
  // and after an external backup refuses our Unlock until the data has been imported.
  proto::Request rq = wire::request(proto::Op::Quiesce);
  rq.flags = pass.external ? proto::kQuiesceAwaitingImport : proto::kQuiesceLocked;
  if (r.pool.call(rq) != ACL_SUCCESS && pass.external) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  return ACL_SUCCESS;
}

// At Lock, once quiet: every kind must be one the snapshot can carry.
int32_t check_resources() {
  for (const ResourceKind *k : resource_kinds()) {
    std::string why;
    if (k->check != nullptr)
      if (int32_t rc = k->check(&why); rc != ACL_SUCCESS) {
        note_error("snapshot: cannot carry " + std::string(k->name) + (why.empty() ? "" : ": " + why));
        return rc;
      }
  }
  return ACL_SUCCESS;
}

bool bad_pid(int pid) { return pid != static_cast<int>(::getpid()); }

}  // namespace

namespace npusim::rt {

int32_t device_restore() {
  Runtime &r = runtime();
  std::string path;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_SUCCESS;
    path = r.socket_path;
  }
  if (r.pool.open(path) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  if (int32_t rc = restore_resources(); rc != ACL_SUCCESS) {
    r.pool.call(wire::request(proto::Op::Release));  // leave nothing half-restored on the device
    r.pool.close_all();
    return rc;
  }
  drop_backups();
  {
    std::lock_guard<std::mutex> g(r.mu);
    data_path().backup_external = false;
  }
  return ACL_SUCCESS;
}

void drop_backups() {
  for (const ResourceKind *k : resource_kinds())
    if (k->drop != nullptr) k->drop();
}

void register_kind(const ResourceKind *kind) {
  auto &all = const_cast<std::vector<const ResourceKind *> &>(resource_kinds());
  all.insert(std::upper_bound(all.begin(), all.end(), kind, [](auto *a, auto *b) { return a->order < b->order; }), kind);
}

const std::vector<const ResourceKind *> &resource_kinds() {
  static std::vector<const ResourceKind *> all;  // filled at load time, before any call
  return all;
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtSnapShotProcessLock(int pid, void *reserve) {
  if (bad_pid(pid) || reserve != nullptr) return ACL_ERROR_INVALID_PARAM;
  return npusim::rt::snapshot_lock(lock_timeout_ms());
}

aclError npusimSnapShotProcessLockTimeout(int pid, int32_t timeoutMs) {
  if (bad_pid(pid) || timeoutMs <= 0) return ACL_ERROR_INVALID_PARAM;
  return npusim::rt::snapshot_lock(timeoutMs);
}

// A process restored on another host reconnects to that host's daemon (the restoring npusnap
// knows it), never to the stale NPUSIM_SOCKET of its environment. Only while BACKED_UP: no
// connection is open then, and device_restore() opens the new one.
int npusimSnapShotUseDaemon(const char *socket) {
  if (socket == nullptr || socket[0] != '/') return ACL_ERROR_INVALID_PARAM;
  std::string why;
  if (!trust::dir_trusted(trust::dir_of(socket), ::geteuid(), &why))
    return note_error(ACL_ERROR_RT_NO_PERMISSION,
                      "snapshot: refusing the daemon socket " + std::string(socket) + ": " + why);
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (r.state != State::BackedUp) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  r.socket_path = socket;
  return ACL_SUCCESS;
}

}  // extern "C"

// The Lock itself, with the caller's timeout (the by-pid control listener passes its own).
int32_t npusim::rt::snapshot_lock(int64_t timeout_ms) {
  Runtime &r = runtime();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.state != State::Running) return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
  }
  if (int32_t rc = invoke(ACL_RT_SNAPSHOT_LOCK_PRE); rc != ACL_SUCCESS) return rc;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  {
    std::unique_lock<std::mutex> l(r.mu);
    if (r.state != State::Running) return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
    r.state = State::Locked;
    r.locker = std::this_thread::get_id();
    // New device calls now wait at the gate; let the ones already inside finish. A process that
    // holds HCCL communicators first runs on to its peers' collectives (the free pass).
    bool ready = false;
    std::string waiting;  // what the free pass still waits for, for the timeout's message
    std::string refused;  // a broken communicator: the lock can never complete
    bool drained = false;  // the loop ended after a drain (its result in rc)
    int32_t drain_rc = ACL_SUCCESS;
    for (;;) {
      l.unlock();
      hccl_lock_poll(&ready, &waiting, &refused);
      l.lock();
      if (!refused.empty()) break;
      if (ready && r.inflight == 0) {
        l.unlock();
        int32_t rc = ACL_SUCCESS;
        if (r.pool.connected()) {
          // Then all queued device work.
          proto::Request rq = wire::request(proto::Op::Drain);
          const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
          rq.timeout_ms = std::max<int64_t>(0, left.count());
          rc = r.pool.call(rq);
        }
        // A Send whose Recv was not issued lives only in the root: not a consistent point yet;
        // poll on (the Recv's free pass opens) and drain again.
        const bool matched = rc != ACL_SUCCESS || hccl_lock_mail(&waiting);
        l.lock();
        if (matched) {
          drained = true;
          drain_rc = rc;
          break;
        }
      }
      const auto next = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(10));
      r.gate_cv.wait_until(l, next);
      if (std::chrono::steady_clock::now() >= deadline) break;
    }
    if (!refused.empty()) {
      l.unlock();
      hccl_lock_end(true);
      note_error("snapshot: lock refused: " + refused);
      l.lock();
      r.state = State::Running;  // the process untouched, as after a timeout
      r.locker = std::thread::id();
      r.gate_cv.notify_all();
      return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
    }
    if (drained) {
      l.unlock();
      int32_t rc = drain_rc;
      if (rc == ACL_SUCCESS) rc = check_resources();
      hccl_lock_end(rc != ACL_SUCCESS);
      l.lock();
      if (rc == ACL_SUCCESS) return ACL_SUCCESS;
      if (rc != ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT) rc = ACL_ERROR_SNAPSHOT_LOCK_FAILED;
      r.state = State::Running;
      r.locker = std::thread::id();
      r.gate_cv.notify_all();
      return rc;
    }
    l.unlock();
    hccl_lock_end(true);
    if (!waiting.empty()) note_error("snapshot: lock timed out: " + waiting);
    l.lock();
    r.state = State::Running;  // timed out: back to RUNNING, the process untouched
    r.locker = std::thread::id();
    r.gate_cv.notify_all();
  }
  return ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT;
}

extern "C" {

aclError aclrtSnapShotProcessBackup(int pid, aclrtSnapShotBackupArgs *args) {
  if (bad_pid(pid) || (args != nullptr && args->backupFlags != 0)) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.state != State::Locked) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
  }
  if (int32_t rc = invoke(ACL_RT_SNAPSHOT_BACKUP_PRE); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = device_backup(); rc != ACL_SUCCESS) {
    drop_backups();  // the device is untouched: stay LOCKED
    return rc;
  }
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.state = State::BackedUp;
    data_path().backup_external = data_path().next_external;  // the setting is for one backup
    data_path().next_external = false;
  }
  return invoke(ACL_RT_SNAPSHOT_BACKUP_POST);
}

aclError aclrtSnapShotProcessRestore(int pid, aclrtSnapShotRestoreArgs *args) {
  if (bad_pid(pid) || (args != nullptr && args->restoreFlags != 0)) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (r.state != State::BackedUp) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  if (int32_t rc = invoke(ACL_RT_SNAPSHOT_RESTORE_PRE); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = device_restore(); rc != ACL_SUCCESS) return rc;  // still BACKED_UP: may be retried
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.state = State::Locked;
  }
  return invoke(ACL_RT_SNAPSHOT_RESTORE_POST);
}

aclError aclrtSnapShotProcessUnlock(int pid, void *reserve) {
  if (bad_pid(pid) || reserve != nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  State s;
  {
    std::lock_guard<std::mutex> g(r.mu);
    s = r.state;
  }
  if (s == State::Running) return ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
  // Unlocking a backed-up process puts its device state back first, so it can carry on.
  bool external;
  {
    std::lock_guard<std::mutex> g(r.mu);
    external = data_path().backup_external;
  }
  // An external backup's data lives in files: only restore external + import can bring it back.
  if (s == State::BackedUp && external) return ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
  if (s == State::BackedUp && device_restore() != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
  if (s == State::Locked) hccl_lock_end(true);  // the peers' roots no longer count this rank as locking
  if (r.pool.connected()) {
    // The daemon refuses while an import is awaited or an export/import runs.
    proto::Request rq = wire::request(proto::Op::Quiesce);
    rq.flags = proto::kQuiesceUnlocking;
    if (r.pool.call(rq) == ACL_ERROR_SNAPSHOT_UNLOCK_FAILED) return ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
  }
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.state = State::Running;
    r.locker = std::thread::id();
    r.gate_cv.notify_all();
  }
  return invoke(ACL_RT_SNAPSHOT_UNLOCK_POST);
}

aclError aclrtSnapShotCallbackRegister(aclrtSnapShotStage stage, aclrtSnapShotCallBack callback, void *args) {
  if (stage < ACL_RT_SNAPSHOT_LOCK_PRE || stage > ACL_RT_SNAPSHOT_UNLOCK_POST || callback == nullptr)
    return ACL_ERROR_RT_PARAM_INVALID;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  auto &list = r.callbacks[stage];
  if (std::any_of(list.begin(), list.end(), [&](auto &e) { return e.first == callback; }))
    return ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED;
  list.emplace_back(callback, args);
  return ACL_SUCCESS;
}

aclError aclrtSnapShotCallbackUnregister(aclrtSnapShotStage stage, aclrtSnapShotCallBack callback) {
  if (stage < ACL_RT_SNAPSHOT_LOCK_PRE || stage > ACL_RT_SNAPSHOT_UNLOCK_POST || callback == nullptr)
    return ACL_ERROR_RT_PARAM_INVALID;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  auto &list = r.callbacks[stage];
  auto it = std::find_if(list.begin(), list.end(), [&](auto &e) { return e.first == callback; });
  if (it == list.end()) return ACL_ERROR_RT_PARAM_INVALID;
  list.erase(it);
  return ACL_SUCCESS;
}

int npusimSnapshotInfo(char *buf, size_t len) {
  if (buf == nullptr) return -ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  const bool connected = r.pool.connected();
  std::ostringstream o;
  {
    std::lock_guard<std::mutex> g(r.mu);
    uint64_t bytes = 0;
    for (auto &[va, a] : r.allocs) bytes += a.size;
    o << "{\"state\": \"" << state_name(r.state) << "\", \"devices\": [";
    bool first = true;
    for (auto &[d, ctx] : r.devices) {
      o << (first ? "" : ", ") << d;
      first = false;
    }
    o << "], \"allocations\": " << r.allocs.size() << ", \"bytes\": " << bytes << ", \"streams\": " << r.streams.size()
      << ", \"events\": " << r.events.size() << ", \"connected\": " << (connected ? "true" : "false") << ", \"direct\": true, \"data_path\": \""
      << (data_path().backup_external ? "external" : "in-process") << "\", \"resources\": {";
    first = true;
    for (const ResourceKind *k : resource_kinds()) {
      o << (first ? "" : ", ") << "\"" << k->name << "\": " << (k->count != nullptr ? k->count() : 0);
      first = false;
    }
    o << "}, \"communicators\": " << hccl_describe() << "}";
  }
  const std::string s = o.str();
  if (s.size() + 1 > len) return -ACL_ERROR_INVALID_PARAM;
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return static_cast<int>(s.size());
}

}  // extern "C"

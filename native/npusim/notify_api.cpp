// Notifies: a flag one stream sets (aclrtRecordNotify) and another waits for and clears
// (aclrtWaitAndResetNotify), also across processes (IPC notify, by key). Handles are objects of
// this process; the snapshot (kind "notify") carries whether each one is recorded, and an IPC
// notify as IPC memory is carried (ipc_api.cpp): importers checkpointed first, the exporter
// publishing its key again on restore, importers importing it again.
#include <string>
#include <vector>

#include "ipc_key.h"
#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct NotifyObj {
  uint32_t id;         // the daemon's, renewed by Restore
  uint32_t public_id;  // aclrtGetNotifyId: stable for the handle's life
  int32_t device;
  uint64_t exported = 0;  // share number of its key (0: not exported)
  bool export_any_pid = false;
  std::vector<int32_t> export_pids;  // whitelisted: again on restore
  uint64_t imported = 0;  // share number it was imported from (0: created here)
  bool recorded = false;  // saved by Backup
};

// Guarded by runtime().mu.
struct NotifyState {
  std::set<NotifyObj *> live;
  uint32_t next_public = 1;
};

NotifyState &notifies() {
  static NotifyState *s = new NotifyState;
  return *s;
}

int32_t check_notify(aclrtNotify notify, NotifyObj **out) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  auto *n = static_cast<NotifyObj *>(notify);
  if (n == nullptr || notifies().live.count(n) == 0) return ACL_ERROR_INVALID_PARAM;
  *out = n;
  return ACL_SUCCESS;
}

NotifyObj *adopt(uint32_t id, int32_t device, uint64_t imported) {
  std::lock_guard<std::mutex> g(runtime().mu);
  auto *n = new NotifyObj;
  n->id = id;
  n->public_id = notifies().next_public++;
  n->device = device;
  n->imported = imported;
  notifies().live.insert(n);
  return n;
}

aclError notify_task(aclrtNotify notify, aclrtStream stream, proto::TaskKind kind, uint32_t timeout) {
  CallScope scope;
  NotifyObj *n = nullptr;
  StreamObj *s = nullptr;
  if (int32_t rc = check_notify(notify, &n); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Task t{};
  t.kind = kind;
  t.event = n->id;
  t.target = timeout;
  return submit(t, s);
}

}  // namespace

extern "C" {

aclError aclrtCreateNotify(aclrtNotify *notify, uint64_t flag) {
  if (notify == nullptr || (flag != ACL_NOTIFY_DEFAULT && flag != ACL_NOTIFY_DEVICE_USE_ONLY))
    return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(wire::request(proto::Op::NotifyCreate), &rp); rc != ACL_SUCCESS) return rc;
  *notify = adopt(static_cast<uint32_t>(rp.value[0]), d, 0);
  return ACL_SUCCESS;
}

aclError aclrtDestroyNotify(aclrtNotify notify) {
  CallScope scope;
  NotifyObj *n = nullptr;
  if (int32_t rc = check_notify(notify, &n); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::NotifyDestroy);
  rq.event = n->id;
  rq.value[0] = n->imported;
  if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  notifies().live.erase(n);
  delete n;
  return ACL_SUCCESS;
}

aclError aclrtRecordNotify(aclrtNotify notify, aclrtStream stream) {
  return notify_task(notify, stream, proto::TaskKind::RecordNotify, 0);
}

aclError aclrtWaitAndResetNotify(aclrtNotify notify, aclrtStream stream, uint32_t timeout) {
  return notify_task(notify, stream, proto::TaskKind::WaitNotify, timeout);
}

aclError aclrtGetNotifyId(aclrtNotify notify, uint32_t *notifyId) {
  if (notifyId == nullptr) return ACL_ERROR_INVALID_PARAM;
  NotifyObj *n = nullptr;
  if (int32_t rc = check_notify(notify, &n); rc != ACL_SUCCESS) return rc;
  *notifyId = n->public_id;
  return ACL_SUCCESS;
}

aclError aclrtNotifyBatchReset(aclrtNotify *list, size_t num) {
  if (list == nullptr || num == 0) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  std::vector<NotifyObj *> objs;
  for (size_t i = 0; i < num; ++i) {
    NotifyObj *n = nullptr;
    if (int32_t rc = check_notify(list[i], &n); rc != ACL_SUCCESS) return rc;
    objs.push_back(n);
  }
  for (NotifyObj *n : objs) {
    proto::Request rq = wire::request(proto::Op::NotifyReset);
    rq.event = n->id;
    if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
}

aclError aclrtNotifyGetExportKey(aclrtNotify notify, char *key, size_t len, uint64_t flags) {
  if (key == nullptr || (flags != ACL_RT_NOTIFY_EXPORT_FLAG_DEFAULT &&
                         flags != ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION))
    return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  NotifyObj *n = nullptr;
  if (int32_t rc = check_notify(notify, &n); rc != ACL_SUCCESS) return rc;
  if (n->imported != 0) return ACL_ERROR_INVALID_PARAM;
  char probe[64];
  if (format_key("notify", ~0ULL, probe, sizeof(probe)) != ACL_SUCCESS || std::strlen(probe) + 1 > len)
    return ACL_ERROR_INVALID_PARAM;  // too short for any key
  proto::Request rq = wire::request(proto::Op::NotifyExport);
  rq.event = n->id;
  rq.flags = flags == ACL_RT_NOTIFY_EXPORT_FLAG_DISABLE_PID_VALIDATION ? 1 : 0;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  format_key("notify", rp.value[0], key, len);
  std::lock_guard<std::mutex> g(runtime().mu);
  n->exported = rp.value[0];
  n->export_any_pid = rq.flags == 1;
  return ACL_SUCCESS;
}

aclError aclrtNotifySetImportPid(aclrtNotify notify, int32_t *pid, size_t num) {
  if (pid == nullptr || num == 0) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  NotifyObj *n = nullptr;
  if (int32_t rc = check_notify(notify, &n); rc != ACL_SUCCESS) return rc;
  if (n->exported == 0) return ACL_ERROR_INVALID_PARAM;  // export it first
  if (int32_t rc = set_pids(proto::Op::NotifySetPids, n->exported, pid, num); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  n->export_pids.insert(n->export_pids.end(), pid, pid + num);
  return ACL_SUCCESS;
}

aclError aclrtNotifyImportByKey(aclrtNotify *notify, const char *key, uint64_t flags) {
  if (notify == nullptr || (flags != ACL_RT_NOTIFY_IMPORT_FLAG_DEFAULT &&
                            flags != ACL_RT_NOTIFY_IMPORT_FLAG_ENABLE_PEER_ACCESS))
    return ACL_ERROR_INVALID_PARAM;
  const uint64_t k = parse_key("notify", key);
  if (k == 0) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::NotifyImport);
  rq.value[0] = k;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;  // gone, or not whitelisted
  *notify = adopt(static_cast<uint32_t>(rp.value[0]), d, k);
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot: each notify comes back under a new daemon id, recorded if it was.
namespace {

std::vector<NotifyObj *> all_notifies() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return std::vector<NotifyObj *>(notifies().live.begin(), notifies().live.end());
}

// An exporter whose importers still run is refused (they may record it after its state is saved).
int32_t check_notifies(std::string *why) {
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    bool exports = false;
    for (NotifyObj *n : notifies().live) exports = exports || n->exported != 0;
    if (!exports) return ACL_SUCCESS;
  }
  return check_importers(2, "notify", why);
}

int32_t backup_notifies(const SnapshotPass &) {
  for (NotifyObj *n : all_notifies()) {
    proto::Request rq = wire::request(proto::Op::NotifyQuery);
    rq.event = n->id;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    n->recorded = rp.value[0] != 0;
  }
  return ACL_SUCCESS;
}

// Own notifies first (and their exports): this process may import its own keys.
int32_t restore_notifies(const SnapshotPass &) {
  std::vector<NotifyObj *> all = all_notifies();
  for (NotifyObj *n : all) {
    if (n->imported != 0) continue;
    proto::Request rq = wire::request(proto::Op::NotifyCreate);
    rq.value[0] = n->recorded ? 1 : 0;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    n->id = static_cast<uint32_t>(rp.value[0]);
    if (n->exported == 0) continue;
    proto::Request ex = wire::request(proto::Op::NotifyExport);
    ex.event = n->id;
    ex.flags = n->export_any_pid ? 1 : 0;
    ex.value[1] = n->exported;
    if (runtime().pool.call(ex) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;  // its number is taken
    if (!n->export_pids.empty() &&
        set_pids(proto::Op::NotifySetPids, n->exported, n->export_pids.data(), n->export_pids.size()) != ACL_SUCCESS)
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  for (NotifyObj *n : all) {
    if (n->imported == 0) continue;
    proto::Request rq = wire::request(proto::Op::NotifyImport);
    rq.value[0] = n->imported;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) {
      note_error("snapshot: cannot import IPC notify again: restore the exporting process first");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    n->id = static_cast<uint32_t>(rp.value[0]);
  }
  return ACL_SUCCESS;
}

const ResourceKind kNotify{"notify", 42, check_notifies, backup_notifies, restore_notifies, nullptr,
                           [] { return notifies().live.size(); }};
NPUSIM_RESOURCE_KIND(kNotify);

}  // namespace

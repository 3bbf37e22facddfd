// Memory shared between processes: IPC memory (a range of an aclrtMalloc allocation, by key) and
// physical memory (an aclrtMallocPhysical handle, by shareable handle). The daemon keeps the
// whitelist (ipc.cpp); an import maps the exporter's memory into this process's window.
//
// The snapshot carries sharing when both sides are checkpointed, importers first: the exporter's
// memory holds the data, so an exporter whose importers still run is refused at Lock (their
// writes after its checkpoint would be lost), while an importer saves nothing of it. Restore
// goes the other way: a restored exporter publishes its keys again under the same numbers, with
// their whitelists, and a restored importer imports them again at its old addresses (kind
// "ipc memory"; before "mappings", which maps imported physical memory again).
#include <cstring>
#include <string>
#include <vector>

#include "ipc_key.h"
#include "resources.h"
#include "runtime.h"
#include "va.h"
#include "vmm.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct IpcImport {
  uint64_t addr;  // where it is mapped here
  uint64_t size;
};

struct IpcExport {
  uint64_t number;  // the share's number in the daemon (the key's hex)
  uint64_t addr, size;
  bool any_pid;
  std::vector<int32_t> pids;
};

// Guarded by runtime().mu.
struct IpcState {
  std::map<std::string, IpcExport> exported;  // by key
  std::map<std::string, IpcImport> imported;
};

IpcState &ipc() {
  static IpcState *s = new IpcState;
  return *s;
}

// The share number in a V2 shareable handle of shareType (0 if it is not one).
uint64_t share_of(const void *shareableHandle, aclrtMemSharedHandleType shareType) {
  if (shareableHandle == nullptr) return 0;
  if (shareType == ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT) return *static_cast<const uint64_t *>(shareableHandle);
  if (shareType != ACL_MEM_SHARE_HANDLE_TYPE_FABRIC) return 0;
  aclrtMemFabricHandle h;
  std::memcpy(&h, shareableHandle, sizeof(h));
  h.data[sizeof(h.data) - 1] = 0;
  return parse_key("fabric", reinterpret_cast<const char *>(h.data));
}

bool initialized() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return runtime().initialized;
}

}  // namespace

extern "C" {

aclError aclrtIpcMemGetExportKey(void *devPtr, size_t size, char *key, size_t len, uint64_t flags) {
  if (devPtr == nullptr || size == 0 || key == nullptr || flags > ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
    return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  proto::Request rq = wire::request(proto::Op::IpcExport);
  rq.addr = reinterpret_cast<uint64_t>(devPtr);
  rq.size = size;
  rq.flags = flags == ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION ? 1 : 0;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;  // not inside one allocation
  char buf[64];
  format_key("ipcmem", rp.value[0], buf, sizeof(buf));
  if (int32_t rc = format_key("ipcmem", rp.value[0], key, len); rc != ACL_SUCCESS) {
    proto::Request close = wire::request(proto::Op::IpcClose);
    close.value[0] = rp.value[0];
    runtime().pool.call(close);
    return rc;  // the key does not fit into len bytes
  }
  std::lock_guard<std::mutex> g(runtime().mu);
  ipc().exported[buf] = IpcExport{rp.value[0], rq.addr, rq.size, rq.flags == 1, {}};
  return ACL_SUCCESS;
}

aclError aclrtIpcMemSetImportPid(const char *key, int32_t *pid, size_t num) {
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  uint64_t n = 0;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    auto it = key != nullptr ? ipc().exported.find(key) : ipc().exported.end();
    if (it == ipc().exported.end()) return ACL_ERROR_INVALID_PARAM;  // not a key this process exported
    n = it->second.number;
  }
  if (int32_t rc = set_pids(proto::Op::IpcSetPids, n, pid, num); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (auto it = ipc().exported.find(key); it != ipc().exported.end())
    it->second.pids.insert(it->second.pids.end(), pid, pid + num);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemImportByKey(void **devPtr, const char *key, uint64_t flags) {
  if (devPtr == nullptr || flags > ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS) return ACL_ERROR_INVALID_PARAM;
  const uint64_t n = parse_key("ipcmem", key);
  if (n == 0) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  proto::Request rq = wire::request(proto::Op::IpcImport);
  rq.value[0] = n;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;  // gone, or not whitelisted
  std::lock_guard<std::mutex> g(runtime().mu);
  ipc().imported[key] = IpcImport{rp.value[0], rp.value[1]};
  *devPtr = reinterpret_cast<void *>(rp.value[0]);
  return ACL_SUCCESS;
}

aclError aclrtIpcMemClose(const char *key) {
  if (key == nullptr) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  proto::Request rq = wire::request(proto::Op::IpcClose);
  bool exporter = false;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (auto it = ipc().imported.find(key); it != ipc().imported.end()) {
      rq.addr = it->second.addr;
    } else if (auto ex = ipc().exported.find(key); ex != ipc().exported.end()) {
      exporter = true;
    } else {
      return ACL_ERROR_INVALID_PARAM;
    }
  }
  rq.value[0] = parse_key("ipcmem", key);
  if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (exporter)
    ipc().exported.erase(key);
  else
    ipc().imported.erase(key);
  return ACL_SUCCESS;
}

aclError aclrtMemExportToShareableHandle(aclrtDrvMemHandle handle, aclrtMemHandleType handleType, uint64_t flags,
                                         uint64_t *shareableHandle) {
  if (shareableHandle == nullptr || handleType != ACL_MEM_HANDLE_TYPE_NONE ||
      flags > ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION)
    return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  auto *p = static_cast<PhysObj *>(handle);
  proto::Request rq = wire::request(proto::Op::ShareExport);
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
    // Only memory this process allocated, once: CANN shares "the handle created by the process itself".
    if (p == nullptr || vmm().phys.count(p) == 0 || p->imported != 0 || p->exported != 0)
      return ACL_ERROR_INVALID_PARAM;
    rq.addr = p->addr;
  }
  rq.flags = flags == ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION ? 1 : 0;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  p->exported = rp.value[0];
  p->export_any_pid = rq.flags == 1;
  *shareableHandle = rp.value[0];
  return ACL_SUCCESS;
}

aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum) {
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  // The daemon checks that this process exported it.
  if (int32_t rc = set_pids(proto::Op::ShareSetPids, shareableHandle, pid, pidNum); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  for (PhysObj *p : vmm().phys)
    if (p->exported == shareableHandle) p->export_pids.insert(p->export_pids.end(), pid, pid + pidNum);
  return ACL_SUCCESS;
}

aclError aclrtMemImportFromShareableHandle(uint64_t shareableHandle, int32_t deviceId, aclrtDrvMemHandle *handle) {
  if (handle == nullptr || shareableHandle == 0 || deviceId < 0) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  proto::Request rq = wire::request(proto::Op::ShareImport);
  rq.value[0] = shareableHandle;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;  // gone, or not whitelisted
  auto *p = new PhysObj;
  p->imported = shareableHandle;
  p->size = rp.value[0];
  p->device = static_cast<int32_t>(rp.value[1]);
  std::lock_guard<std::mutex> g(runtime().mu);
  vmm().phys.insert(p);
  *handle = p;
  return ACL_SUCCESS;
}

aclError aclrtMemExportToShareableHandleV2(aclrtDrvMemHandle handle, uint64_t flags,
                                           aclrtMemSharedHandleType shareType, void *shareableHandle) {
  if (shareableHandle == nullptr ||
      (shareType != ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT && shareType != ACL_MEM_SHARE_HANDLE_TYPE_FABRIC))
    return ACL_ERROR_INVALID_PARAM;
  uint64_t n = 0;
  if (aclError rc = aclrtMemExportToShareableHandle(handle, ACL_MEM_HANDLE_TYPE_NONE, flags, &n); rc != ACL_SUCCESS)
    return rc;
  if (shareType == ACL_MEM_SHARE_HANDLE_TYPE_DEFAULT) {
    *static_cast<uint64_t *>(shareableHandle) = n;
    return ACL_SUCCESS;
  }
  aclrtMemFabricHandle h{};
  format_key("fabric", n, reinterpret_cast<char *>(h.data), sizeof(h.data));
  std::memcpy(shareableHandle, &h, sizeof(h));
  return ACL_SUCCESS;
}

aclError aclrtMemImportFromShareableHandleV2(void *shareableHandle, aclrtMemSharedHandleType shareType,
                                             uint64_t flags, aclrtDrvMemHandle *handle) {
  if (flags != 0) return ACL_ERROR_INVALID_PARAM;
  const uint64_t n = share_of(shareableHandle, shareType);
  return n == 0 ? ACL_ERROR_INVALID_PARAM : aclrtMemImportFromShareableHandle(n, 0, handle);
}

aclError aclrtMemSetPidToShareableHandleV2(void *shareableHandle, aclrtMemSharedHandleType shareType, int32_t *pid,
                                           size_t pidNum) {
  const uint64_t n = share_of(shareableHandle, shareType);
  return n == 0 ? ACL_ERROR_INVALID_PARAM : aclrtMemSetPidToShareableHandle(n, pid, pidNum);
}

}  // extern "C"

namespace {

// An exporter whose importers still run cannot be carried: they would go on writing memory whose
// saved copy is already taken. Checkpoint the importers first.
int32_t check_ipc(std::string *why) {
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    bool exports = !ipc().exported.empty();
    for (PhysObj *p : vmm().phys) exports = exports || p->exported != 0;
    if (!exports) return ACL_SUCCESS;
  }
  return check_importers(1, "memory", why);
}

int32_t republish(proto::Op op, uint64_t addr, uint64_t size, bool any_pid, uint64_t number,
                  const std::vector<int32_t> &pids, proto::Op pid_op) {
  proto::Request rq = wire::request(op);
  rq.addr = addr;
  rq.size = size;
  rq.flags = any_pid ? 1 : 0;
  rq.value[1] = number;
  if (runtime().pool.call(rq) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;  // its number is taken
  if (!pids.empty() && set_pids(pid_op, number, pids.data(), pids.size()) != ACL_SUCCESS)
    return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  return ACL_SUCCESS;
}

int32_t restore_ipc(const SnapshotPass &) {
  Runtime &r = runtime();
  std::vector<std::pair<std::string, IpcExport>> exports;
  std::vector<std::pair<std::string, IpcImport>> imports;
  std::vector<PhysObj *> phys;
  {
    std::lock_guard<std::mutex> g(r.mu);
    exports.assign(ipc().exported.begin(), ipc().exported.end());
    imports.assign(ipc().imported.begin(), ipc().imported.end());
    phys.assign(vmm().phys.begin(), vmm().phys.end());
  }
  // Exports first: this process may import its own keys.
  for (auto &[key, ex] : exports)
    if (int32_t rc = republish(proto::Op::IpcExport, ex.addr, ex.size, ex.any_pid, ex.number, ex.pids,
                               proto::Op::IpcSetPids);
        rc != ACL_SUCCESS)
      return rc;
  for (PhysObj *p : phys)
    if (p->exported != 0)
      if (int32_t rc = republish(proto::Op::ShareExport, p->addr, 0, p->export_any_pid, p->exported, p->export_pids,
                                 proto::Op::ShareSetPids);
          rc != ACL_SUCCESS)
        return rc;
  for (auto &[key, im] : imports) {
    proto::Request rq = wire::request(proto::Op::IpcImport);
    rq.value[0] = parse_key("ipcmem", key.c_str());
    rq.value[1] = im.addr;
    proto::Reply rp{};
    if (r.pool.call(rq, &rp) != ACL_SUCCESS || rp.value[0] != im.addr) {
      note_error("snapshot: cannot import IPC memory " + key + " again: restore the exporting process first");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
  }
  for (PhysObj *p : phys) {
    if (p->imported == 0) continue;
    proto::Request rq = wire::request(proto::Op::ShareImport);
    rq.value[0] = p->imported;
    if (r.pool.call(rq) != ACL_SUCCESS) {
      note_error("snapshot: cannot import shareable handle " + std::to_string(p->imported) +
                 " again: restore the exporting process first");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
  }
  return ACL_SUCCESS;
}

// Order 13: after physical memory (12), before the mappings (14) of imported physical memory.
const ResourceKind kIpc{"ipc memory", 13, check_ipc, nullptr, restore_ipc, nullptr, [] {
                          size_t n = ipc().exported.size() + ipc().imported.size();
                          for (PhysObj *p : vmm().phys) n += (p->exported != 0) + (p->imported != 0);
                          return n;
                        }};
NPUSIM_RESOURCE_KIND(kIpc);

}  // namespace

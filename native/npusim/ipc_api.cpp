// Memory shared between processes: IPC memory (a range of an aclrtMalloc allocation, by key) and
// physical memory (an aclrtMallocPhysical handle, by shareable handle). The daemon keeps the
// whitelist (ipc.cpp); an import maps the exporter's memory into this process's window.
//
// The snapshot cannot carry sharing yet: the other side lives in another process that is
// checkpointed on its own, so kind "ipc" refuses at Lock (the process runs on).
#include <string>

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
  uint64_t addr;
  uint64_t size;
};

// Guarded by runtime().mu.
struct IpcState {
  std::map<std::string, uint64_t> exported;   // key -> share number
  std::map<std::string, IpcImport> imported;  // key -> where it is mapped here
};

IpcState &ipc() {
  static IpcState *s = new IpcState;
  return *s;
}

bool initialized() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return runtime().initialized;
}

// One request per pid: the daemon whitelists them for share number n.
int32_t set_pids(proto::Op op, uint64_t n, const int32_t *pid, size_t num) {
  if (pid == nullptr || num == 0) return ACL_ERROR_INVALID_PARAM;
  for (size_t i = 0; i < num; ++i) {
    if (pid[i] <= 0) return ACL_ERROR_INVALID_PARAM;
    proto::Request rq = wire::request(op);
    rq.value[0] = n;
    rq.value[1] = static_cast<uint64_t>(pid[i]);
    if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
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
  ipc().exported[buf] = rp.value[0];
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
    n = it->second;
  }
  return set_pids(proto::Op::IpcSetPids, n, pid, num);
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
  *shareableHandle = rp.value[0];
  return ACL_SUCCESS;
}

aclError aclrtMemSetPidToShareableHandle(uint64_t shareableHandle, int32_t *pid, size_t pidNum) {
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  return set_pids(proto::Op::ShareSetPids, shareableHandle, pid, pidNum);  // the daemon checks the owner
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

}  // extern "C"

namespace {

// Sharing spans two processes that CRIU dumps one at a time, and the daemon's share table does not
// survive a restart: refuse rather than restore one side alone.
int32_t check_ipc(std::string *why) {
  std::lock_guard<std::mutex> g(runtime().mu);
  size_t shared = 0, imported = 0;
  for (PhysObj *p : vmm().phys) {
    if (p->exported != 0) ++shared;
    if (p->imported != 0) ++imported;
  }
  shared += ipc().exported.size();
  imported += ipc().imported.size();
  if (shared == 0 && imported == 0) return ACL_SUCCESS;
  *why = std::to_string(shared) + " memory export(s) and " + std::to_string(imported) +
         " import(s) shared with other processes (aclrtIpcMemClose / aclrtFreePhysical them before a checkpoint)";
  return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
}

const ResourceKind kIpc{"ipc memory", 41, check_ipc, nullptr, nullptr, nullptr, [] {
                          size_t n = ipc().exported.size() + ipc().imported.size();
                          for (PhysObj *p : vmm().phys) n += (p->exported != 0) + (p->imported != 0);
                          return n;
                        }};
NPUSIM_RESOURCE_KIND(kIpc);

}  // namespace

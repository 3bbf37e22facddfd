// Device and host memory: allocation, copies and memsets.
#include <sys/mman.h>

#include <cstring>

#include "resources.h"
#include "runtime.h"
#include "va.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

bool is_dev(const void *p) { return va::is_device(reinterpret_cast<uint64_t>(p)); }
int32_t dev_of(const void *p) { return static_cast<int32_t>(va::device_of(reinterpret_cast<uint64_t>(p))); }

// Checks a copy request and turns it into a task. *host_only is set for host-to-host copies,
// which never reach the device.
int32_t make_copy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                  proto::Task *t, bool *host_only) {
  if (dst == nullptr || src == nullptr || count > destMax) return ACL_ERROR_INVALID_PARAM;
  const bool d = is_dev(dst), s = is_dev(src);
  switch (kind) {
    case ACL_MEMCPY_DEFAULT: break;  // direction from the addresses
    case ACL_MEMCPY_HOST_TO_HOST: if (d || s) return ACL_ERROR_INVALID_PARAM; break;
    case ACL_MEMCPY_HOST_TO_DEVICE:
    case ACL_MEMCPY_HOST_TO_BUF_TO_DEVICE: if (!d || s) return ACL_ERROR_INVALID_PARAM; break;
    case ACL_MEMCPY_DEVICE_TO_HOST: if (d || !s) return ACL_ERROR_INVALID_PARAM; break;
    case ACL_MEMCPY_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INNER_DEVICE_TO_DEVICE:
    case ACL_MEMCPY_INTER_DEVICE_TO_DEVICE: if (!d || !s) return ACL_ERROR_INVALID_PARAM; break;
    default: return ACL_ERROR_INVALID_PARAM;
  }
  *host_only = !d && !s;
  *t = proto::Task{};
  t->dst = reinterpret_cast<uint64_t>(dst);
  t->src = reinterpret_cast<uint64_t>(src);
  t->size = count;
  if (d && s) {
    if (t->dst % 64 != 0 || t->src % 64 != 0) return ACL_ERROR_RT_ADDR_UNALIGNED;
    if (!peer_ok(dev_of(dst), dev_of(src))) return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;  // enable peer access first
    t->kind = proto::TaskKind::DeviceToDevice;
  } else {
    t->kind = d ? proto::TaskKind::HostToDevice : proto::TaskKind::DeviceToHost;
  }
  return ACL_SUCCESS;
}

bool initialized() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return runtime().initialized;
}

}  // namespace

extern "C" {

aclError aclrtMalloc(void **devPtr, size_t size, aclrtMemMallocPolicy policy) {
  if (devPtr == nullptr || size == 0 || (policy & 0xff) > ACL_MEM_MALLOC_HUGE1G_ONLY_P2P)
    return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::Malloc);
  rq.device = d;
  rq.size = size;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  r.allocs[rp.value[0]] = Alloc{va::round_size(size), d};
  *devPtr = reinterpret_cast<void *>(rp.value[0]);
  return ACL_SUCCESS;
}

aclError aclrtFree(void *devPtr) {
  Runtime &r = runtime();
  CallScope scope;
  const uint64_t a = reinterpret_cast<uint64_t>(devPtr);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (r.allocs.count(a) == 0) return ACL_ERROR_INVALID_PARAM;
  }
  proto::Request rq = wire::request(proto::Op::Free);
  rq.addr = a;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  r.allocs.erase(a);
  return ACL_SUCCESS;
}

// Host memory is plain private anonymous memory: it is part of the process image, so CRIU saves
// and restores it at the same address like any other memory.
aclError aclrtMallocHost(void **hostPtr, size_t size) {
  if (hostPtr == nullptr || size == 0) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  void *p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return ACL_ERROR_BAD_ALLOC;
  // Huge pages roughly double the speed of the daemon's process_vm_readv/writev on this buffer,
  // as pinned host memory speeds up DMA on real hardware.
  if (size >= (2u << 20)) ::madvise(p, size, MADV_HUGEPAGE);
  std::lock_guard<std::mutex> g(r.mu);
  r.host_allocs[p] = size;
  *hostPtr = p;
  return ACL_SUCCESS;
}

aclError aclrtFreeHost(void *hostPtr) {
  Runtime &r = runtime();
  CallScope scope;
  std::lock_guard<std::mutex> g(r.mu);
  auto it = r.host_allocs.find(hostPtr);
  if (it == r.host_allocs.end()) return ACL_ERROR_INVALID_PARAM;
  ::munmap(it->first, it->second);
  r.host_allocs.erase(it);
  return ACL_SUCCESS;
}

aclError aclrtMemcpy(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind) {
  CallScope scope;
  proto::Task t;
  bool host_only = false;
  if (int32_t rc = make_copy(dst, destMax, src, count, kind, &t, &host_only); rc != ACL_SUCCESS) return rc;
  if (host_only) {
    std::memmove(dst, src, count);
    return ACL_SUCCESS;
  }
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  return count == 0 ? ACL_SUCCESS : submit(t, nullptr);
}

aclError aclrtMemcpyAsync(void *dst, size_t destMax, const void *src, size_t count, aclrtMemcpyKind kind,
                          aclrtStream stream) {
  CallScope scope;
  proto::Task t;
  bool host_only = false;
  if (int32_t rc = make_copy(dst, destMax, src, count, kind, &t, &host_only); rc != ACL_SUCCESS) return rc;
  if (host_only) return ACL_ERROR_INVALID_PARAM;  // AscendCL refuses asynchronous host-to-host copies
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  return count == 0 ? ACL_SUCCESS : submit(t, s);
}

static aclError memset_impl(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream,
                            bool async) {
  // CANN decides host or device by the address (acl_rt.h: "the system determines whether it is
  // host or device according to the address").
  if (devPtr == nullptr || count > maxCount) return ACL_ERROR_INVALID_PARAM;
  if (!is_dev(devPtr) && !async) {
    std::memset(devPtr, value, count);
    return ACL_SUCCESS;
  }
  proto::Task t{};
  t.kind = is_dev(devPtr) ? proto::TaskKind::Memset : proto::TaskKind::HostMemset;
  t.dst = reinterpret_cast<uint64_t>(devPtr);
  t.size = count;
  t.value = value;
  StreamObj *s = nullptr;
  if (async) {
    if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  } else if (!initialized()) {
    return ACL_ERROR_UNINITIALIZE;
  }
  return count == 0 ? ACL_SUCCESS : submit(t, s);
}

aclError aclrtMemset(void *devPtr, size_t maxCount, int32_t value, size_t count) {
  CallScope scope;
  return memset_impl(devPtr, maxCount, value, count, nullptr, false);
}

aclError aclrtMemsetAsync(void *devPtr, size_t maxCount, int32_t value, size_t count, aclrtStream stream) {
  CallScope scope;
  return memset_impl(devPtr, maxCount, value, count, stream, true);
}

}  // extern "C"

// Snapshot: each allocation's data goes to private anonymous host memory and comes back to the
// same device address (after a daemon restart too: MallocAt).
namespace {

void unmap_backup(Alloc &a) {
  if (a.backup != nullptr) ::munmap(a.backup, a.size);
  a.backup = nullptr;
}

std::vector<std::pair<uint64_t, Alloc *>> all_allocs() {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  std::vector<std::pair<uint64_t, Alloc *>> out;
  for (auto &[va, a] : r.allocs) out.emplace_back(va, &a);
  return out;
}

int32_t backup_memory(const SnapshotPass &pass) {
  if (pass.external) return ACL_SUCCESS;  // the daemon has written the data to files
  for (auto &[va, a] : all_allocs()) {
    unmap_backup(*a);
    void *p = ::mmap(nullptr, a->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    a->backup = p;
    proto::Task t{};
    t.kind = proto::TaskKind::DeviceToHost;
    t.dst = reinterpret_cast<uint64_t>(p);
    t.src = va;
    t.size = a->size;
    if (submit(t, nullptr) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
  }
  return ACL_SUCCESS;
}

int32_t restore_memory(const SnapshotPass &pass) {
  Runtime &r = runtime();
  for (auto &[va, a] : all_allocs()) {
    proto::Request rq = wire::request(proto::Op::MallocAt);
    rq.flags = pass.external ? proto::kMallocForImport : 0;  // the import commits its pages as it fills them
    rq.device = a->device;
    rq.addr = va;
    rq.size = a->size;
    if (r.pool.call(rq) != ACL_SUCCESS || (a->backup == nullptr && !pass.external)) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    if (pass.external) continue;  // the daemon imports the data (npusimDaemonImport) before Unlock
    proto::Task t{};
    t.kind = proto::TaskKind::HostToDevice;
    t.dst = va;
    t.src = reinterpret_cast<uint64_t>(a->backup);
    t.size = a->size;
    if (submit(t, nullptr) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  return ACL_SUCCESS;
}

void drop_memory() {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  for (auto &[va, a] : r.allocs) unmap_backup(a);
}

const ResourceKind kMemory{"memory", 10, nullptr, backup_memory, restore_memory, drop_memory,
                           [] { return runtime().allocs.size(); }};
NPUSIM_RESOURCE_KIND(kMemory);

}  // namespace

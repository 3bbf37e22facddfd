// Virtual memory: address reservations, physical allocations and the mappings between them.
//
// A physical allocation is daemon memory at an address of this process's window that the
// application never sees; a mapping shows part of it at a reserved address, and copies and
// kernels through that address reach it. The snapshot re-creates all three at the same addresses
// behind the same handles (kinds "reservations", "physical memory", "mappings").
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "resources.h"
#include "runtime.h"
#include "va.h"
#include "vmm.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace npusim::rt {
VmmState &vmm() {
  static VmmState *s = new VmmState;  // never destroyed, like the runtime
  return *s;
}
}  // namespace npusim::rt

namespace {

bool device_ok(uint32_t device) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  return r.initialized && device < r.pool.device_count;
}

// The mapping that starts at va.
Mapping *mapping_at(uint64_t va) {
  auto it = vmm().mappings.find(va);
  return it == vmm().mappings.end() ? nullptr : &it->second;
}

uint64_t addr_of(const void *p) { return reinterpret_cast<uint64_t>(p); }

}  // namespace

extern "C" {

aclError aclrtMemGetAllocationGranularity(aclrtPhysicalMemProp *prop, aclrtMemGranularityOptions option,
                                          size_t *granularity) {
  if (prop == nullptr || granularity == nullptr) return ACL_ERROR_INVALID_PARAM;
  if (option != ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM && option != ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return ACL_ERROR_INVALID_PARAM;
  *granularity = kVmmGranularity;  // device memory comes in huge pages
  return ACL_SUCCESS;
}

aclError aclrtReserveMemAddress(void **virPtr, size_t size, size_t alignment, void *expectPtr, uint64_t flags) {
  if (virPtr == nullptr || size == 0 || size % kVmmGranularity != 0 || expectPtr != nullptr)
    return ACL_ERROR_INVALID_PARAM;
  if (alignment != 0 && (alignment & (alignment - 1)) != 0) return ACL_ERROR_INVALID_PARAM;
  (void)flags;  // page type: every page of npusim is the same
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::Reserve);
  rq.device = d;
  rq.size = size;
  rq.value[0] = alignment > kVmmGranularity ? alignment : kVmmGranularity;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  vmm().reservations[rp.value[0]] = Reservation{size, d};
  *virPtr = reinterpret_cast<void *>(rp.value[0]);
  return ACL_SUCCESS;
}

aclError aclrtReleaseMemAddress(void *virPtr) {
  Runtime &r = runtime();
  CallScope scope;
  const uint64_t va = addr_of(virPtr);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (vmm().reservations.count(va) == 0) return ACL_ERROR_INVALID_PARAM;
  }
  proto::Request rq = wire::request(proto::Op::Unreserve);
  rq.addr = va;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;  // still mapped: unmap first
  std::lock_guard<std::mutex> g(r.mu);
  vmm().reservations.erase(va);
  return ACL_SUCCESS;
}

aclError aclrtMallocPhysical(aclrtDrvMemHandle *handle, size_t size, const aclrtPhysicalMemProp *prop,
                             uint64_t flags) {
  if (handle == nullptr || prop == nullptr || size == 0 || size % kVmmGranularity != 0 || flags != 0)
    return ACL_ERROR_INVALID_PARAM;
  if (prop->location.type != ACL_MEM_LOCATION_TYPE_DEVICE || prop->allocationType != ACL_MEM_ALLOCATION_TYPE_PINNED)
    return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  if (!device_ok(prop->location.id)) return runtime().initialized ? ACL_ERROR_RT_INVALID_DEVICEID : ACL_ERROR_UNINITIALIZE;
  proto::Request rq = wire::request(proto::Op::Malloc);
  rq.device = static_cast<int32_t>(prop->location.id);
  rq.size = size;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  auto *p = new PhysObj;
  p->addr = rp.value[0];
  p->size = size;
  p->device = rq.device;
  std::lock_guard<std::mutex> g(r.mu);
  vmm().phys.insert(p);
  *handle = p;
  return ACL_SUCCESS;
}

aclError aclrtFreePhysical(aclrtDrvMemHandle handle) {
  Runtime &r = runtime();
  CallScope scope;
  auto *p = static_cast<PhysObj *>(handle);
  uint64_t shared = 0;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (p == nullptr || vmm().phys.count(p) == 0 || p->maps > 0) return ACL_ERROR_INVALID_PARAM;  // unmap first
    shared = p->imported != 0 ? p->imported : p->exported;
  }
  if (shared != 0) {  // an import ends; an export is withdrawn (imports made from it stay valid)
    proto::Request rq = wire::request(proto::Op::ShareRelease);
    rq.value[0] = shared;
    if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  }
  if (p->imported == 0) {
    proto::Request rq = wire::request(proto::Op::Free);
    rq.addr = p->addr;
    if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  }
  std::lock_guard<std::mutex> g(r.mu);
  vmm().phys.erase(p);
  delete p;
  return ACL_SUCCESS;
}

aclError aclrtMapMem(void *virPtr, size_t size, size_t offset, aclrtDrvMemHandle handle, uint64_t flags) {
  if (virPtr == nullptr || size == 0 || flags != 0 || size % kVmmGranularity != 0 || offset % kVmmGranularity != 0)
    return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  auto *p = static_cast<PhysObj *>(handle);
  proto::Request rq = wire::request(proto::Op::Map);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (p == nullptr || vmm().phys.count(p) == 0) return ACL_ERROR_INVALID_PARAM;
    rq.flags = p->imported != 0 ? 1 : 0;
    rq.value[0] = p->imported != 0 ? p->imported : p->addr;
  }
  rq.addr = addr_of(virPtr);
  rq.size = size;
  rq.value[1] = offset;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;  // outside a reservation, or mapped already
  std::lock_guard<std::mutex> g(r.mu);
  // MapMem grants read-write access on the mapping's device, as CANN's does.
  vmm().mappings[rq.addr] = Mapping{size, p, offset, ACL_RT_MEM_ACCESS_FLAGS_READWRITE};
  ++p->maps;
  return ACL_SUCCESS;
}

aclError aclrtUnmapMem(void *virPtr) {
  Runtime &r = runtime();
  CallScope scope;
  const uint64_t va = addr_of(virPtr);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (mapping_at(va) == nullptr) return ACL_ERROR_INVALID_PARAM;
  }
  proto::Request rq = wire::request(proto::Op::Unmap);
  rq.addr = va;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  --mapping_at(va)->phys->maps;
  vmm().mappings.erase(va);
  return ACL_SUCCESS;
}

aclError aclrtMemSetAccess(void *virPtr, size_t size, aclrtMemAccessDesc *desc, size_t count) {
  if (virPtr == nullptr || size == 0 || desc == nullptr || count == 0) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  // The range is one mapping or several back to back.
  std::vector<Mapping *> covered;
  for (uint64_t va = addr_of(virPtr), end = va + size; va < end;) {
    Mapping *m = mapping_at(va);
    if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
    covered.push_back(m);
    va += m->size;
  }
  for (size_t i = 0; i < count; ++i) {
    const aclrtMemAccessDesc &d = desc[i];
    if (d.location.type != ACL_MEM_LOCATION_TYPE_DEVICE || d.location.id >= r.pool.device_count)
      return ACL_ERROR_INVALID_PARAM;
    if (d.flags != ACL_RT_MEM_ACCESS_FLAGS_NONE && d.flags != ACL_RT_MEM_ACCESS_FLAGS_READ &&
        d.flags != ACL_RT_MEM_ACCESS_FLAGS_READWRITE)
      return ACL_ERROR_INVALID_PARAM;
  }
  for (Mapping *m : covered)
    for (size_t i = 0; i < count; ++i)
      if (static_cast<int32_t>(desc[i].location.id) == m->phys->device) m->access = desc[i].flags;
  return ACL_SUCCESS;
}

aclError aclrtMemGetAccess(void *virPtr, aclrtMemLocation *location, uint64_t *flag) {
  if (virPtr == nullptr || location == nullptr || flag == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  const uint64_t va = addr_of(virPtr);
  auto it = vmm().mappings.upper_bound(va);
  if (it == vmm().mappings.begin()) return ACL_ERROR_INVALID_PARAM;
  --it;
  if (va - it->first >= it->second.size) return ACL_ERROR_INVALID_PARAM;
  const bool own_device = location->type == ACL_MEM_LOCATION_TYPE_DEVICE &&
                          static_cast<int32_t>(location->id) == it->second.phys->device;
  *flag = own_device ? it->second.access : uint64_t{ACL_RT_MEM_ACCESS_FLAGS_NONE};
  return ACL_SUCCESS;
}

aclError aclrtDeviceGetBareTgid(int32_t *pid) {
  if (pid == nullptr) return ACL_ERROR_INVALID_PARAM;
  *pid = static_cast<int32_t>(::getpid());  // the daemon names clients by their pid (SO_PEERCRED)
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot: reservations and mappings are re-created at their addresses; a physical allocation's
// data goes to private anonymous host memory and comes back at its (hidden) address.
namespace {

template <typename T, typename F>
std::vector<std::pair<uint64_t, T>> copy_of(const std::map<uint64_t, T> &live, F) {
  std::lock_guard<std::mutex> g(runtime().mu);
  return std::vector<std::pair<uint64_t, T>>(live.begin(), live.end());
}

std::vector<PhysObj *> own_phys() {
  std::lock_guard<std::mutex> g(runtime().mu);
  std::vector<PhysObj *> out;
  for (PhysObj *p : vmm().phys)
    if (p->imported == 0) out.push_back(p);
  return out;
}

int32_t restore_reservations(const SnapshotPass &) {
  for (auto &[va, res] : copy_of(vmm().reservations, 0)) {
    proto::Request rq = wire::request(proto::Op::ReserveAt);
    rq.device = res.device;
    rq.addr = va;
    rq.size = res.size;
    if (runtime().pool.call(rq) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  return ACL_SUCCESS;
}

void unmap_backup(PhysObj *p) {
  if (p->backup != nullptr) ::munmap(p->backup, p->size);
  p->backup = nullptr;
}

int32_t backup_physical(const SnapshotPass &pass) {
  if (pass.external) return ACL_SUCCESS;  // the daemon has written the data to files
  for (PhysObj *p : own_phys()) {
    unmap_backup(p);
    void *b = ::mmap(nullptr, p->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b == MAP_FAILED) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    p->backup = b;
    proto::Task t{};
    t.kind = proto::TaskKind::DeviceToHost;
    t.dst = addr_of(b);
    t.src = p->addr;
    t.size = p->size;
    if (submit(t, nullptr) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
  }
  return ACL_SUCCESS;
}

int32_t restore_physical(const SnapshotPass &pass) {
  for (PhysObj *p : own_phys()) {
    proto::Request rq = wire::request(proto::Op::MallocAt);
    rq.flags = pass.external ? proto::kMallocForImport : 0;  // the import commits its pages as it fills them
    rq.device = p->device;
    rq.addr = p->addr;
    rq.size = p->size;
    if (runtime().pool.call(rq) != ACL_SUCCESS || (p->backup == nullptr && !pass.external))
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    if (pass.external) continue;  // the daemon imports the data before Unlock
    proto::Task t{};
    t.kind = proto::TaskKind::HostToDevice;
    t.dst = p->addr;
    t.src = addr_of(p->backup);
    t.size = p->size;
    if (submit(t, nullptr) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  return ACL_SUCCESS;
}

void drop_physical() {
  std::lock_guard<std::mutex> g(runtime().mu);
  for (PhysObj *p : vmm().phys) unmap_backup(p);
}

int32_t restore_mappings(const SnapshotPass &) {
  for (auto &[va, m] : copy_of(vmm().mappings, 0)) {
    proto::Request rq = wire::request(proto::Op::Map);
    rq.addr = va;
    rq.size = m.size;
    rq.flags = m.phys->imported != 0 ? 1 : 0;  // imported again by kind "ipc memory"
    rq.value[0] = m.phys->imported != 0 ? m.phys->imported : m.phys->addr;
    rq.value[1] = m.offset;
    if (runtime().pool.call(rq) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  return ACL_SUCCESS;
}

// Imported physical memory belongs to another process, which saves and restores its data; kind
// "ipc memory" (13) imports it again before the mappings (14) are re-created.
const ResourceKind kReservations{"reservations", 11, nullptr, nullptr, restore_reservations, nullptr,
                                 [] { return vmm().reservations.size(); }};
const ResourceKind kPhysical{"physical", 12, nullptr, backup_physical, restore_physical, drop_physical,
                             [] { return vmm().phys.size(); }};
const ResourceKind kMappings{"mappings", 14, nullptr, nullptr, restore_mappings, nullptr,
                             [] { return vmm().mappings.size(); }};
NPUSIM_RESOURCE_KIND(kReservations);
NPUSIM_RESOURCE_KIND(kPhysical);
NPUSIM_RESOURCE_KIND(kMappings);

}  // namespace

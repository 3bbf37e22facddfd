// Host registration (aclrtHostRegister / aclrtHostRegisterV2 / aclrtHostGetDevicePointer /
// aclrtHostUnregister): host memory the device reaches in place, through a device address.
//
// Registering moves the pages of the range (rounded out to whole pages) into a memfd mapped over
// them at the same address (the content is copied first, so the program sees no change) and lends
// that memfd to the daemon (host_mem.cpp), where it becomes an allocation of the session: copies,
// memsets and kernels on the device address read and write the process's own pages. Unregistering
// turns the range back into private memory with the same content.
//
// Kind "host registrations": the data is the process's memory (CRIU dumps the shared mapping and
// the memfd the runtime keeps open), so Backup saves nothing; Restore lends the memfd again at the
// same device address, and the range is shared with the device again.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct Registration {
  char *user;        // the pointer registered
  uint64_t size;     // as registered
  char *start;       // the pages: [start, start + len)
  size_t len;
  int32_t device;
  uint64_t dev = 0;  // the device address of start
  int fd = -1;       // the memfd behind the pages (kept open: Restore lends it again)
};

std::mutex g_mu;  // guards g_regs (also across the daemon calls of a registration: nothing they call takes it)
std::map<char *, Registration> g_regs;  // by start

size_t page_size() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// The registration whose pages hold [p, p + n), or null (g_mu held).
Registration *covering(const char *p, uint64_t n) {
  auto it = g_regs.upper_bound(const_cast<char *>(p));
  if (it == g_regs.begin()) return nullptr;
  Registration &r = std::prev(it)->second;
  return p >= r.start && p + n <= r.start + r.len ? &r : nullptr;
}

bool overlaps(const char *start, size_t len) {
  for (auto &[s, r] : g_regs)
    if (start < r.start + r.len && r.start < start + len) return true;
  return false;
}

int32_t lend(Registration &r, uint64_t at) {
  proto::Request rq = wire::request(proto::Op::HostRegister);
  rq.device = r.device;
  rq.addr = at;
  rq.size = r.len;
  rq.value[0] = static_cast<uint64_t>(r.fd);
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  r.dev = rp.value[0];
  return ACL_SUCCESS;
}

// Puts [start, start + len) into a fresh memfd mapped over it; the memfd, or -1 (errno set).
int share_pages(char *start, size_t len) {
  const int fd = ::memfd_create("npusim-host", MFD_CLOEXEC);
  if (fd < 0) return -1;
  size_t done = 0;
  bool ok = ::ftruncate(fd, static_cast<off_t>(len)) == 0;
  while (ok && done < len) {
    const ssize_t n = ::pwrite(fd, start + done, len - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += static_cast<size_t>(n);
  }
  // MAP_FIXED swaps the pages in one step: every pointer into the range stays valid.
  if (!ok || ::mmap(start, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The reverse: the range becomes private anonymous memory with the content it has now.
void unshare_pages(const Registration &r) {
  std::vector<char> copy(r.start, r.start + r.len);
  if (::mmap(r.start, r.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED)
    std::memcpy(r.start, copy.data(), r.len);
  ::close(r.fd);
}

aclError do_register(void *ptr, uint64_t size, uint32_t flags, void **devPtr, const char *api) {
  if (ptr == nullptr || size == 0) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": ptr is NULL or size is 0");
  if ((flags & ACL_HOST_REG_IOMEMORY) != 0)
    return note_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, std::string(api) + ": npusim has no IO memory to register");
  CallScope scope;
  Runtime &rt = runtime();
  Registration r{};
  if (aclError rc = active_device(rt, &r.device); rc != ACL_SUCCESS) return rc;
  r.user = static_cast<char *>(ptr);
  r.size = size;
  const uintptr_t page = page_size(), p = reinterpret_cast<uintptr_t>(ptr);
  r.start = reinterpret_cast<char *>(p / page * page);
  r.len = (p + size + page - 1) / page * page - p / page * page;
  std::lock_guard<std::mutex> g(g_mu);
  if (overlaps(r.start, r.len))
    return note_error(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, std::string(api) + ": the range (or a page of it) is registered already");
  if ((r.fd = share_pages(r.start, r.len)) < 0)
    return note_error(ACL_ERROR_BAD_ALLOC, std::string(api) + ": cannot share the range with the device: " + std::strerror(errno));
  if (int32_t rc = lend(r, 0); rc != ACL_SUCCESS) {
    unshare_pages(r);
    return note_error(rc, std::string(api) + ": the device did not take the range");
  }
  g_regs[r.start] = r;
  if (devPtr != nullptr) *devPtr = reinterpret_cast<void *>(r.dev + static_cast<uint64_t>(r.user - r.start));
  return ACL_SUCCESS;
}

int32_t restore_registrations(const SnapshotPass &) {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto &[start, r] : g_regs)
    if (int32_t rc = lend(r, r.dev); rc != ACL_SUCCESS) return rc;
  return ACL_SUCCESS;
}

size_t count_registrations() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_regs.size();
}

const ResourceKind kHostRegistrations{"host registrations", 32, nullptr, nullptr, restore_registrations, nullptr,
                                      count_registrations};
NPUSIM_RESOURCE_KIND(kHostRegistrations);

}  // namespace

extern "C" {

aclError aclrtHostRegister(void *ptr, uint64_t size, aclrtHostRegisterType type, void **devPtr) {
  if (devPtr == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: devPtr is NULL");
  if (type != ACL_HOST_REGISTER_MAPPED && type != ACL_HOST_REGISTER_IOMEMORY && type != ACL_HOST_REGISTER_READONLY)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegister: unknown register type");
  return do_register(ptr, size, static_cast<uint32_t>(type) | ACL_HOST_REG_MAPPED, devPtr, "aclrtHostRegister");
}

aclError aclrtHostRegisterV2(void *ptr, uint64_t size, uint32_t flag) {
  const uint32_t known = ACL_HOST_REG_MAPPED | ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY | ACL_HOST_REG_PINNED;
  if ((flag & ~known) != 0) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtHostRegisterV2: unknown flag bits");
  return do_register(ptr, size, flag, nullptr, "aclrtHostRegisterV2");
}

aclError aclrtHostGetDevicePointer(void *pHost, void **pDevice, uint32_t flag) {
  if (pHost == nullptr || pDevice == nullptr || flag != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtHostGetDevicePointer: pHost or pDevice is NULL, or flag is not 0");
  std::lock_guard<std::mutex> g(g_mu);
  Registration *r = covering(static_cast<char *>(pHost), 1);
  if (r == nullptr) return note_error(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, "aclrtHostGetDevicePointer: not registered host memory");
  *pDevice = reinterpret_cast<void *>(r->dev + static_cast<uint64_t>(static_cast<char *>(pHost) - r->start));
  return ACL_SUCCESS;
}

aclError aclrtHostUnregister(void *ptr) {
  CallScope scope;
  Registration r{};
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = std::find_if(g_regs.begin(), g_regs.end(), [&](const auto &e) { return e.second.user == ptr; });
    if (ptr == nullptr || it == g_regs.end())
      return note_error(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, "aclrtHostUnregister: not a registered pointer");
    r = it->second;
    g_regs.erase(it);
  }
  // Work queued on the range finishes first (the device's view of the pages goes away).
  proto::Request sync = wire::request(proto::Op::DeviceSync);
  sync.device = r.device;
  runtime().pool.call(sync);
  proto::Request rq = wire::request(proto::Op::Free);
  rq.addr = r.dev;
  runtime().pool.call(rq);  // gone already after aclrtResetDevice: nothing left to free
  unshare_pages(r);
  return ACL_SUCCESS;
}

}  // extern "C"

#include "device_state.h"

#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <fstream>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <map>
#include <random>
#include <sstream>

#include "acl/acl_base.h"
#include "builtin_tasks.h"
#include "cow.h"
#include "kernel_host.h"
#include "lazy.h"
#include "va.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace npusim {

namespace {
std::atomic<uint64_t> g_serial{1};

// The memory of freed allocations, kept for the next allocation of the same size, as a device
// keeps its own: given back to the host, it would be faulted in page by page again, which on a VM
// whose hypervisor takes freed pages back (free page reporting) runs at 0.5-1.9 GiB/s (the
// development VM), slower than the disk a restore's import reads (a 4 GiB restore: 3.8-4.4 s ->
// 2.7-3.1). An allocation that takes it zeroes it first (it held another client's data). It is
// kept MADV_FREE: the host reclaims it when it runs short (the next write then faults a zero page
// in), never the OOM killer's business. The daemon keeps no more than its devices' capacity beside
// what is allocated (DeviceState::anonymous_memory trims it to that).
class FreedMemory {
 public:
  void set_limit(uint64_t bytes) {
    std::lock_guard<std::mutex> g(mu_);
    limit_ = bytes;
  }
  // From ~Buffer, under any lock: kept within the limit, else unmapped.
  void give(char *base, size_t mapped) {
    if (::madvise(base, mapped, MADV_FREE) == 0) {
      std::lock_guard<std::mutex> g(mu_);
      if (bytes_ + mapped <= limit_) {
        kept_.emplace(mapped, base);
        bytes_ += mapped;
        return;
      }
    }
    ::munmap(base, mapped);
  }
  // A kept mapping of exactly mapped bytes (not zeroed), or null.
  char *take(size_t mapped) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = kept_.find(mapped);
    if (it == kept_.end()) return nullptr;
    char *base = it->second;
    kept_.erase(it);
    bytes_ -= mapped;
    return base;
  }
  // Unmaps kept mappings, the largest first, until at most keep bytes are kept.
  void trim(uint64_t keep) {
    std::vector<std::pair<size_t, char *>> gone;
    {
      std::lock_guard<std::mutex> g(mu_);
      while (bytes_ > keep && !kept_.empty()) {
        auto last = std::prev(kept_.end());
        gone.push_back(*last);
        bytes_ -= last->first;
        kept_.erase(last);
      }
    }
    for (auto [mapped, base] : gone) ::munmap(base, mapped);
  }
  uint64_t bytes() {
    std::lock_guard<std::mutex> g(mu_);
    return bytes_;
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, char *> kept_;  // by size
  uint64_t bytes_ = 0, limit_ = 0;
};

FreedMemory &freed_memory() {
  static FreedMemory *f = new FreedMemory;  // never destroyed: buffers may be freed while the daemon exits
  return *f;
}
}  // namespace

Buffer::Buffer(uint64_t va_, uint64_t size_, uint32_t device_, char *base_, size_t mapped_, int fd_)
    : va(va_), size(size_), device(device_), base(base_), mapped(mapped_), fd(fd_), serial(g_serial++) {
  if (mapped_ != 0) dirty::init(*this);
}

Buffer::~Buffer() {
  if (mapped != 0 && fd < 0 && !lent)
    freed_memory().give(base, mapped);  // the daemon's anonymous memory (map_device_memory)
  else if (mapped != 0)
    ::munmap(base, mapped);
  if (fd >= 0) ::close(fd);
}

std::shared_mutex &memory_swap() {
  static std::shared_mutex mu;
  return mu;
}

namespace {

// Device memory is committed when allocated, as on real hardware, so that copies into it run at
// memory speed instead of taking page faults. It is anonymous memory (huge pages where possible)
// until its client uses kernels; then it is a memfd (fd set), which the client's kernel runner maps
// (kernel_host.cpp). Shared memory gets huge pages only where the system's shmem THP setting
// allows, so only clients that need it pay for it.
// commit: fault every page in now (the kernel zeroes them), so that a full host fails here, cleanly.
char *map_device_memory(uint64_t size, size_t *mapped, int *fd, bool commit = true) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  *mapped = (size + page - 1) / page * page;
  void *p = MAP_FAILED;
  if (fd == nullptr) {
    p = ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  } else {
    *fd = ::memfd_create("npusim-device", MFD_CLOEXEC);
    if (*fd < 0) return nullptr;
    if (::ftruncate(*fd, static_cast<off_t>(*mapped)) == 0)
      p = ::mmap(nullptr, *mapped, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  }
  auto fail = [&] {
    if (fd != nullptr) ::close(*fd);
    return nullptr;
  };
  if (p == MAP_FAILED) return fail();
  if (*mapped >= (2u << 20)) ::madvise(p, *mapped, MADV_HUGEPAGE);
  if (commit && ::madvise(p, *mapped, MADV_POPULATE_WRITE) != 0) {
    ::munmap(p, *mapped);  // out of memory: the device is full
    return fail();
  }
  return static_cast<char *>(p);
}

// Moves b's data into a fresh memfd mapped at the same address (memory_swap held exclusively).
bool move_to_memfd(Buffer &b) {
  size_t mapped = 0;
  int fd = -1;
  char *tmp = map_device_memory(b.mapped, &mapped, &fd);
  if (tmp == nullptr) return false;
  std::memcpy(tmp, b.base, b.mapped);
  ::munmap(tmp, mapped);
  // MAP_FIXED replaces the anonymous pages in one step: every pointer into base stays valid.
  if (::mmap(b.base, b.mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    ::close(fd);
    return false;
  }
  b.fd = fd;
  return true;
}

bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }

std::string json_string(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

// Field n of /proc/PID/stat (3: state, 4: ppid, 22: start time), 0 if the process is gone.
uint64_t stat_field(pid_t pid, int n) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::istringstream in(text.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= n && in >> field; ++i)
    if (i == n) return std::strtoull(field.c_str(), nullptr, 10);
  return 0;
}

// With the pid, the start time names one process.
uint64_t start_time(pid_t pid) { return stat_field(pid, 22); }

// A zombie or a process that is gone: its connections closed because it ended, not for a Backup.
bool exited(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] == 'Z' || text[paren + 2] == 'X';
}

DeviceState::DeviceState(uint32_t devices, uint64_t memory, std::string socket_path)
    : memory_(memory),
      socket_path_(std::move(socket_path)),
      used_(devices, 0),
      window_owner_(devices, std::vector<pid_t>(va::kWindows, 0)) {
  freed_memory().set_limit(memory * devices);
}

char *DeviceState::anonymous_memory(uint64_t size, size_t *mapped, bool *commit) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), rounded = (size + page - 1) / page * page;
  if (char *base = freed_memory().take(rounded)) {
    *mapped = rounded;  // as map_device_memory rounds it
    std::memset(base, 0, *mapped);  // in place already: zeroing it costs no page faults
    *commit = true;
    return base;
  }
  make_room(size);
  return map_device_memory(size, mapped, nullptr, *commit);
}

void DeviceState::make_room(uint64_t size) {
  uint64_t allocated = 0;
  for (uint64_t u : used_) allocated += u;
  const uint64_t capacity = memory_ * used_.size(), room = capacity > allocated + size ? capacity - allocated - size : 0;
  freed_memory().trim(room);  // with the new memory, the daemon holds at most its devices' capacity
}

std::shared_ptr<Session> DeviceState::join(pid_t pid) {
  std::lock_guard<std::mutex> g(mu_);
  auto &s = sessions_[pid];
  if (!s) {
    s = std::make_shared<Session>();
    s->pid = pid;
    s->kernels = std::make_shared<kernels::SessionKernels>();
  }
  ++s->connections;
  return s;
}

void DeviceState::leave(const std::shared_ptr<Session> &s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (--s->connections > 0) return;
    release_locked(*s);
    sessions_.erase(s->pid);
  }
  streams::stop_all(*s);
  kernels::release(*s);
  lazy::cancel(s->pid);  // its memory is gone: no fill for it any more
  cow::drop_gone();  // a snapshot of a process that ended: nobody will write it out
}

void DeviceState::release(Session &s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    release_locked(s);
  }
  streams::stop_all(s);
  kernels::release(s);
  lazy::cancel(s.pid);
}

void DeviceState::release_locked(Session &s) {
  auto keeping = keeping_.find(s.pid);
  Kept *kept = nullptr;
  if (keeping != keeping_.end()) {
    drop_kept_locked(s.pid);
    kept = &kept_[s.pid];
    kept->start = keeping->second;
    keeping_.erase(keeping);
  }
  for (auto &[va, buf] : s.allocs) {
    if (buf->backing) continue;
    if (kept != nullptr && !buf->lent)  // lent memory is the process's own: CRIU carries it
      kept->allocs[va] = buf;
    else
      used_[buf->device] -= buf->size;
  }
  s.allocs.clear();
  s.reservations.clear();
  s.imports.clear();
  ipc::forget(s.pid);
  for (auto [device, window] : s.windows) window_owner_[device][window] = 0;
  s.windows.clear();
}

int32_t DeviceState::claim_window(Session &s, uint32_t device, int window) {
  auto it = s.windows.find(device);
  if (it != s.windows.end()) return it->second == window || window < 0 ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
  auto &owners = window_owner_[device];
  if (window < 0) {
    // A random free window, so that restored clients rarely find theirs taken.
    static thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<int> pick(0, va::kWindows - 1);
    for (int tries = 0; tries < 64 && window < 0; ++tries) {
      int w = pick(rng);
      if (owners[w] == 0) window = w;
    }
    for (int w = 0; w < static_cast<int>(va::kWindows) && window < 0; ++w)
      if (owners[w] == 0) window = w;
    if (window < 0) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  } else if (owners[window] != 0) {
    return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;  // another client holds this window now
  }
  owners[window] = s.pid;
  s.windows[device] = window;
  return ACL_SUCCESS;
}

void DeviceState::keep(pid_t pid) {
  std::lock_guard<std::mutex> g(mu_);
  keeping_[pid] = start_time(pid);
}

bool DeviceState::took_back(Session &s, uint64_t *base_id, uint64_t *base_epoch) {
  std::lock_guard<std::mutex> g(mu_);
  const bool whole = s.adopted && !s.fresh && kept_.count(s.pid) == 0;
  drop_kept_locked(s.pid);
  keeping_.erase(s.pid);
  s.adopted = s.fresh = false;
  if (base_id != nullptr) *base_id = whole ? s.adopted_base_id : 0;
  if (base_epoch != nullptr) *base_epoch = whole ? s.adopted_base_epoch : 0;
  s.adopted_base_id = s.adopted_base_epoch = 0;
  return whole;
}

int32_t DeviceState::stage(uint32_t device, uint64_t va, uint64_t size, std::shared_ptr<Buffer> *out) {
  if (device >= device_count() || !va::is_device(va) || va::device_of(va) != device)
    return ACL_ERROR_RT_INVALID_DEVICEID;
  if (size == 0 || size > memory_ || va::offset_of(va) + size > va::kWindowSize) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(mu_);
  if (used_[device] + size > memory_ && !kept_.empty()) drop_gone_locked();
  if (used_[device] + size > memory_) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  size_t mapped = 0;
  bool committed = false;
  char *base = anonymous_memory(size, &mapped, &committed);
  if (base == nullptr) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  *out = std::make_shared<Buffer>(va, size, device, base, mapped);
  (*out)->uncommitted = !committed;
  used_[device] += size;
  return ACL_SUCCESS;
}

void DeviceState::unstage(const std::vector<std::shared_ptr<Buffer>> &bufs) {
  std::lock_guard<std::mutex> g(mu_);
  for (auto &b : bufs) used_[b->device] -= b->size;
}

void DeviceState::keep_ahead(pid_t pid, uint64_t start, const std::map<uint64_t, std::shared_ptr<Buffer>> &allocs,
                             uint64_t base_id, uint64_t base_epoch) {
  std::lock_guard<std::mutex> g(mu_);
  drop_kept_locked(pid);
  Kept &k = kept_[pid];
  k.start = start;
  k.allocs = allocs;
  k.base_id = base_id;
  k.base_epoch = base_epoch;
}

void DeviceState::drop_kept_locked(pid_t pid) {
  auto it = kept_.find(pid);
  if (it == kept_.end()) return;
  for (auto &[va, buf] : it->second.allocs) used_[buf->device] -= buf->size;
  kept_.erase(it);
}

void DeviceState::drop_gone_locked() {
  std::vector<pid_t> gone;
  for (auto &[pid, k] : kept_)
    if (start_time(pid) != k.start || exited(pid)) gone.push_back(pid);  // a zombie never runs again
  for (pid_t pid : gone) drop_kept_locked(pid);
}

int32_t DeviceState::place(Session &s, uint32_t device, uint64_t va, uint64_t size, const Lent *lent, bool commit) {
  if (used_[device] + size > memory_ && !kept_.empty()) drop_gone_locked();  // memory kept for nobody
  if (used_[device] + size > memory_) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  size_t mapped = lent != nullptr ? lent->mapped : 0;
  int fd = lent != nullptr ? lent->fd : -1;
  commit = commit || lent != nullptr;
  char *base = lent != nullptr     ? lent->base
               : s.shared_memory ? (make_room(size), map_device_memory(size, &mapped, &fd, commit))
                                 : anonymous_memory(size, &mapped, &commit);
  if (base == nullptr) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  s.allocs[va] = std::make_shared<Buffer>(va, size, device, base, mapped, fd);
  s.allocs[va]->lent = lent != nullptr;
  s.allocs[va]->uncommitted = !commit;
  used_[device] += size;
  return ACL_SUCCESS;
}

int32_t DeviceState::malloc(Session &s, uint32_t device, uint64_t size, uint64_t *out, const Lent *lent) {
  if (device >= device_count()) return ACL_ERROR_RT_INVALID_DEVICEID;
  if (size == 0 || size > memory_) return size == 0 ? ACL_ERROR_INVALID_PARAM : ACL_ERROR_RT_MEMORY_ALLOCATION;
  size = va::round_size(size);
  std::lock_guard<std::mutex> g(mu_);
  if (int32_t rc = claim_window(s, device, -1); rc != ACL_SUCCESS) return rc;
  const uint32_t window = static_cast<uint32_t>(s.windows[device]);
  const uint64_t lo = va::make(device, window, 0);
  const uint64_t hi = lo + va::kWindowSize;
  // First fit over the gaps between this window's allocations.
  uint64_t cursor = lo;
  for (auto it = s.allocs.lower_bound(lo); it != s.allocs.end() && it->first < hi; ++it) {
    if (it->first >= cursor && it->first - cursor >= size) break;
    cursor = std::max(cursor, (it->first + it->second->size + va::kAlign - 1) / va::kAlign * va::kAlign);
  }
  if (hi - cursor < size) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  if (int32_t rc = place(s, device, cursor, size, lent); rc != ACL_SUCCESS) return rc;
  *out = cursor;
  return ACL_SUCCESS;
}

int32_t DeviceState::malloc_at(Session &s, uint32_t device, uint64_t va, uint64_t size, const Lent *lent,
                               bool commit) {
  if (device >= device_count() || !va::is_device(va) || va::device_of(va) != device)
    return ACL_ERROR_RT_INVALID_DEVICEID;
  size = va::round_size(size);
  if (size == 0 || va::offset_of(va) + size > va::kWindowSize) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(mu_);
  if (int32_t rc = claim_window(s, device, static_cast<int>(va::window_of(va))); rc != ACL_SUCCESS) return rc;
  auto next = s.allocs.lower_bound(va);
  if (next != s.allocs.end() && next->first < va + size) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  if (next != s.allocs.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second->size > va) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  }
  auto kept = kept_.find(s.pid);
  if (kept != kept_.end() && lent == nullptr) {
    auto it = kept->second.allocs.find(va);
    // The same process (a reused pid takes nothing back), the same allocation, and memory a kernel
    // runner can map if the session needs that already.
    if (it != kept->second.allocs.end() && it->second->size == size && it->second->device == device &&
        (it->second->fd >= 0 || !s.shared_memory) && start_time(s.pid) == kept->second.start) {
      s.allocs[va] = it->second;  // still counted in used_
      s.adopted_base_id = kept->second.base_id;
      s.adopted_base_epoch = kept->second.base_epoch;
      kept->second.allocs.erase(it);
      if (kept->second.allocs.empty()) kept_.erase(kept);
      s.adopted = true;
      return ACL_SUCCESS;
    }
  }
  s.fresh = true;
  return place(s, device, va, size, lent, commit);
}

int32_t DeviceState::share_memory(Session &s) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (s.shared_memory) return ACL_SUCCESS;  // the session's first binary did it
  }
  std::unique_lock<std::shared_mutex> quiet(memory_swap());  // no task touches device memory now
  std::vector<std::shared_ptr<Buffer>> anonymous;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (s.shared_memory) return ACL_SUCCESS;
    s.shared_memory = true;  // allocations from now on are memfds
    for (auto &[va, b] : s.allocs)
      if (b->fd < 0 && !b->backing) anonymous.push_back(b);  // an alias's memory moves with its backing
  }
  // A lazy restore's chunks still to come would land in the old pages: all in first.
  if (int32_t rc = lazy::ensure_all(anonymous); rc != ACL_SUCCESS) return rc;
  for (auto &b : anonymous)
    if (!move_to_memfd(*b)) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  return ACL_SUCCESS;
}

int32_t DeviceState::free(Session &s, uint64_t va) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = s.allocs.find(va);
  if (it == s.allocs.end() || it->second->backing) return ACL_ERROR_INVALID_PARAM;  // a mapping: unmap it
  used_[it->second->device] -= it->second->size;
  s.allocs.erase(it);
  return ACL_SUCCESS;
}

int32_t DeviceState::mem_info(uint32_t device, uint64_t *free, uint64_t *total) {
  if (device >= device_count()) return ACL_ERROR_RT_INVALID_DEVICEID;
  std::lock_guard<std::mutex> g(mu_);
  *total = memory_;
  *free = memory_ - used_[device];
  return ACL_SUCCESS;
}

int32_t DeviceState::lookup(Session &s, uint64_t va, uint64_t len, std::shared_ptr<Buffer> *buf, char **ptr) {
  if (!va::is_device(va)) return ACL_ERROR_INVALID_PARAM;
  auto it = s.allocs.upper_bound(va);
  if (it == s.allocs.begin()) return ACL_ERROR_INVALID_PARAM;
  --it;
  const Buffer &b = *it->second;
  if (va - b.va > b.size || len > b.size - (va - b.va)) return ACL_ERROR_INVALID_PARAM;
  *buf = it->second;
  *ptr = b.base + (va - b.va);
  return ACL_SUCCESS;
}

int32_t DeviceState::resolve(Session &s, const proto::Task &t, uint32_t stream_device, bool on_stream, Work &w) {
  using proto::TaskKind;
  w.task = t;
  w.pid = s.pid;
  uint64_t dst_len = 0, src_len = 0, src2_len = 0;
  bool dst_dev = true, src_dev = false, kernel = true;
  switch (t.kind) {
    case TaskKind::HostToDevice: dst_len = t.size; kernel = false; break;
    case TaskKind::DeviceToHost: src_len = t.size; dst_dev = false; src_dev = true; kernel = false; break;
    case TaskKind::DeviceToDevice: dst_len = src_len = t.size; src_dev = true; kernel = false; break;
    case TaskKind::Memset: dst_len = t.size; kernel = false; break;
    case TaskKind::HostMemset: dst_dev = false; kernel = false; break;
    case TaskKind::Fill:
      if (!mul_ok(t.m, sizeof(float), &dst_len)) return ACL_ERROR_INVALID_PARAM;
      break;
    case TaskKind::Axpy:
      if (!mul_ok(t.m, sizeof(float), &dst_len)) return ACL_ERROR_INVALID_PARAM;
      src_len = dst_len;
      src_dev = true;
      break;
    case TaskKind::Matmul: {
      uint64_t mk, kn, mn;
      if (!mul_ok(t.m, t.k, &mk) || !mul_ok(t.k, t.n, &kn) || !mul_ok(t.m, t.n, &mn) ||
          !mul_ok(mk, sizeof(float), &src_len) || !mul_ok(kn, sizeof(float), &src2_len) ||
          !mul_ok(mn, sizeof(float), &dst_len))
        return ACL_ERROR_INVALID_PARAM;
      src_dev = true;
      break;
    }
    case TaskKind::RecordEvent:
    case TaskKind::WaitEvent:
    case TaskKind::RecordNotify:
    case TaskKind::WaitNotify: return on_stream ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
    case TaskKind::ValueWrite: dst_len = sizeof(uint64_t); kernel = false; break;
    case TaskKind::ValueWait:
      if (!on_stream) return ACL_ERROR_INVALID_PARAM;
      dst_len = sizeof(uint64_t);
      kernel = false;
      break;
    case TaskKind::Reduce:
      if (!builtin::reduce_ok(t)) return ACL_ERROR_INVALID_PARAM;
      dst_len = src_len = t.size;
      src_dev = true;
      break;
    case TaskKind::RandomNum:
      dst_len = builtin::random_bytes(t);
      if (dst_len == 0) return ACL_ERROR_INVALID_PARAM;
      src_len = builtin::kRandomCounterBytes;
      src_dev = true;
      break;
    default: return ACL_ERROR_INVALID_PARAM;
  }
  if (kernel && on_stream) {
    // Kernels run on the stream's device and can only touch its memory.
    for (uint64_t a : {t.dst, t.src, t.src2})
      if (a != 0 && va::is_device(a) && va::device_of(a) != stream_device) return ACL_ERROR_INVALID_PARAM;
  }
  std::lock_guard<std::mutex> g(mu_);
  std::shared_ptr<Buffer> b;
  char *p = nullptr;
  if (dst_dev) {
    if (int32_t rc = lookup(s, t.dst, dst_len, &b, &p); rc != ACL_SUCCESS) return rc;
    w.dst = p;
    w.out = b.get();
    w.out_len = dst_len;
    w.hold.push_back(b);
  }
  if (src_dev) {
    if (int32_t rc = lookup(s, t.src, src_len, &b, &p); rc != ACL_SUCCESS) return rc;
    w.src = p;
    w.hold.push_back(b);
  }
  if (src2_len > 0) {
    if (int32_t rc = lookup(s, t.src2, src2_len, &b, &p); rc != ACL_SUCCESS) return rc;
    w.src2 = p;
    w.hold.push_back(b);
  }
  return ACL_SUCCESS;
}

std::string DeviceState::status_json(bool clients) {
  std::lock_guard<std::mutex> g(mu_);
  drop_gone_locked();  // memory kept for a process that ended (killed after its checkpoint) is free
  std::ostringstream o;
  o << "{\"pid\": " << ::getpid() << ", \"socket\": " << json_string(socket_path_) << ", \"devices\": [";
  for (size_t d = 0; d < used_.size(); ++d) {
    o << (d ? ", " : "") << "{\"id\": " << d << ", \"total\": " << memory_ << ", \"used\": " << used_[d]
      << ", \"free\": " << memory_ - used_[d] << "}";
  }
  cow::drop_gone();
  o << "], \"snapshots\": " << cow::count();  // live checkpoints' copy-on-write snapshots (cow.h)
  o << ", \"freed_kept\": " << freed_memory().bytes();  // for the next allocation of the same size
  if (!clients) return o.str() + "}";  // other users' pids and sizes are for the owner and root
  o << ", \"clients\": [";
  bool first = true;
  for (auto &[pid, s] : sessions_) {
    uint64_t bytes = 0;
    for (auto &[va, b] : s->allocs) bytes += b->size;
    size_t nstreams;
    {
      std::lock_guard<std::mutex> sg(s->mu);
      nstreams = s->streams.size();
    }
    o << (first ? "" : ", ") << "{\"pid\": " << pid << ", \"bytes\": " << bytes
      << ", \"allocations\": " << s->allocs.size() << ", \"streams\": " << nstreams
      << ", \"connections\": " << s->connections << "}";
    first = false;
  }
  o << "]}";
  return o.str();
}

}  // namespace npusim

// Runs one resolved task: copies, memsets, kernels. Host memory is the client's; it is read and
// written in place with process_vm_readv/writev (one copy, no shared mapping in the client).
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "cow.h"
#include "device_state.h"
#include "builtin_tasks.h"
#include "hccl_daemon.h"
#include "kernel_host.h"
#include "kernels.h"
#include "lazy.h"

namespace npusim {
namespace {

int32_t transfer(pid_t pid, char *local, uint64_t remote, uint64_t size, bool to_client) {
  while (size > 0) {
    iovec l{local, size};
    iovec r{reinterpret_cast<void *>(remote), size};
    ssize_t n = to_client ? ::process_vm_writev(pid, &l, 1, &r, 1, 0) : ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ACL_ERROR_INVALID_PARAM;  // the host range is not mapped in the client
    local += n;
    remote += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
  }
  return ACL_SUCCESS;
}

// The kernel's copy (rep movsb) writes about 3x slower when the destination sits 16 bytes past
// the source modulo a cache line, which is exactly a D2H copy into a malloc'd numpy array. Such
// copies go through a staging buffer placed at the destination's alignment, in pieces of 2 MiB:
// measured on a 256 MiB D2H copy, 128 KiB pieces (one process_vm_writev each) ran at 8.3-9.5
// GiB/s, 2 MiB pieces at 12.3-16.8, as fast as an aligned copy that needs no staging (13-14).
// The buffer is the thread's, on the heap and only as large as its largest piece so far (static
// thread-local storage of that size would be set up for every thread of the daemon).
int32_t copy_range(pid_t pid, char *local, uint64_t remote, uint64_t size, bool to_client) {
  const uint64_t shift = remote % 64;
  if (!to_client || (reinterpret_cast<uint64_t>(local) - remote) % 64 == 0 || size < 4096)
    return transfer(pid, local, remote, size, to_client);
  constexpr uint64_t kPiece = 2ULL << 20;
  thread_local std::vector<char> buffer;
  const uint64_t piece = std::min(kPiece, size);
  try {
    if (buffer.size() < piece + 128) buffer.resize(piece + 128);
  } catch (const std::bad_alloc &) {
    return transfer(pid, local, remote, size, to_client);  // the slow copy is still a copy
  }
  char *staging = buffer.data() + (64 - reinterpret_cast<uintptr_t>(buffer.data()) % 64) % 64 + shift;
  for (uint64_t done = 0; done < size; done += piece) {
    const uint64_t len = std::min(piece, size - done);
    std::memcpy(staging, local + done, len);
    if (int32_t rc = transfer(pid, staging, remote + done, len, true); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
}

// A single process_vm_* call moves roughly half of memcpy's bandwidth (it pins and maps the
// client's pages as it goes), but several run in parallel scale well; so large copies are split
// across threads, one per core up to 4.
int32_t client_copy(pid_t pid, char *local, uint64_t remote, uint64_t size, bool to_client) {
  constexpr uint64_t kChunkMin = 4ULL << 20;
  const unsigned cores = std::max(1u, std::min(4u, std::thread::hardware_concurrency()));
  const uint64_t parts = std::min<uint64_t>(cores, size / kChunkMin);
  if (parts <= 1) return copy_range(pid, local, remote, size, to_client);
  const uint64_t step = (size / parts + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);  // huge-page aligned
  std::vector<std::thread> helpers;
  std::vector<int32_t> rc(parts, ACL_SUCCESS);
  for (uint64_t i = 1; i < parts && i * step < size; ++i) {
    const uint64_t off = i * step, len = std::min(step, size - off);
    helpers.emplace_back([&, i, off, len] { rc[i] = copy_range(pid, local + off, remote + off, len, to_client); });
  }
  rc[0] = copy_range(pid, local, remote, std::min(step, size), to_client);
  for (auto &t : helpers) t.join();
  for (int32_t r : rc)
    if (r != ACL_SUCCESS) return r;
  return ACL_SUCCESS;
}

// aclrtMemsetAsync on host memory: the client's pages are written in stream order, like a copy.
int32_t client_memset(pid_t pid, uint64_t remote, uint64_t size, int32_t value) {
  std::vector<char> pattern(std::min<uint64_t>(size, 1ULL << 20), static_cast<char>(value));
  for (uint64_t done = 0; done < size; done += pattern.size()) {
    const uint64_t len = std::min<uint64_t>(pattern.size(), size - done);
    if (int32_t rc = transfer(pid, pattern.data(), remote + done, len, true); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
}

}  // namespace

namespace {

int32_t execute(Work &w) {
  const proto::Task &t = w.task;
  using proto::TaskKind;
  switch (t.kind) {
    case TaskKind::HostToDevice: return client_copy(w.pid, w.dst, t.src, t.size, false);
    case TaskKind::DeviceToHost: return client_copy(w.pid, const_cast<char *>(w.src), t.dst, t.size, true);
    case TaskKind::DeviceToDevice: std::memmove(w.dst, w.src, t.size); return ACL_SUCCESS;
    case TaskKind::Memset: std::memset(w.dst, t.value, t.size); return ACL_SUCCESS;
    case TaskKind::HostMemset: return client_memset(w.pid, t.dst, t.size, t.value);
    case TaskKind::Fill: kernels::fill(reinterpret_cast<float *>(w.dst), t.m, t.alpha); return ACL_SUCCESS;
    case TaskKind::Axpy:
      kernels::axpy(t.m, t.alpha, reinterpret_cast<const float *>(w.src), reinterpret_cast<float *>(w.dst));
      return ACL_SUCCESS;
    case TaskKind::Matmul:
      kernels::matmul(t.m, t.n, t.k, reinterpret_cast<const float *>(w.src),
                      reinterpret_cast<const float *>(w.src2), reinterpret_cast<float *>(w.dst));
      return ACL_SUCCESS;
    case TaskKind::ValueWrite:
    case TaskKind::Reduce:
    case TaskKind::RandomNum: return builtin::run(w);
    case TaskKind::Kernel: return kernels::run(w);
    case TaskKind::HcclCollective: return hccl::run(w);
    default: return ACL_SUCCESS;  // events and value waits are handled by the stream worker
  }
}

}  // namespace

int32_t run_work(Work &w) {
  std::shared_lock<std::shared_mutex> use(memory_swap());  // DeviceState::share_memory waits for us
  // A lazily restored chunk comes in before its first use, checked; one that failed is never read.
  if (const int32_t rc = lazy::ensure_work(w); rc != ACL_SUCCESS) return rc;
  cow::before_work(w);  // a live checkpoint's snapshot keeps what this overwrites
  const int32_t rc = execute(w);
  dirty::stamp_work(w);  // after the write, and even after a failed one (it may have written part)
  return rc;
}

}  // namespace npusim

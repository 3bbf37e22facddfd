// Runs one resolved task: copies, memsets, kernels. Host memory is the client's; it is read and
// written in place with process_vm_readv/writev (one copy, no shared mapping in the client).
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "device_state.h"
#include "kernels.h"

namespace npusim {
namespace {

// The kernel copies with rep movsb, which runs about 3x slower when the destination is not
// cache-line aligned (numpy's large arrays start 16 bytes into a page). So the destination is
// given as two pieces: a head up to the next 64-byte boundary, then the aligned bulk.
size_t split_aligned(uint64_t addr, uint64_t size, iovec out[2]) {
  const uint64_t head = std::min<uint64_t>((64 - addr % 64) % 64, size);
  size_t n = 0;
  if (head > 0) out[n++] = iovec{reinterpret_cast<void *>(addr), head};
  if (size > head) out[n++] = iovec{reinterpret_cast<void *>(addr + head), size - head};
  return n;
}

int32_t copy_range(pid_t pid, char *local, uint64_t remote, uint64_t size, bool to_client) {
  while (size > 0) {
    iovec l[2], r[2];
    size_t nl = 1, nr = 1;
    if (to_client) {
      l[0] = iovec{local, size};
      nr = split_aligned(remote, size, r);
    } else {
      nl = split_aligned(reinterpret_cast<uint64_t>(local), size, l);
      r[0] = iovec{reinterpret_cast<void *>(remote), size};
    }
    ssize_t n = to_client ? ::process_vm_writev(pid, l, nl, r, nr, 0) : ::process_vm_readv(pid, l, nl, r, nr, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ACL_ERROR_INVALID_PARAM;  // the host range is not mapped in the client
    local += n;
    remote += static_cast<uint64_t>(n);
    size -= static_cast<uint64_t>(n);
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

}  // namespace

int32_t run_work(Work &w) {
  const proto::Task &t = w.task;
  using proto::TaskKind;
  switch (t.kind) {
    case TaskKind::HostToDevice: return client_copy(w.pid, w.dst, t.src, t.size, false);
    case TaskKind::DeviceToHost: return client_copy(w.pid, const_cast<char *>(w.src), t.dst, t.size, true);
    case TaskKind::DeviceToDevice: std::memmove(w.dst, w.src, t.size); return ACL_SUCCESS;
    case TaskKind::Memset: std::memset(w.dst, t.value, t.size); return ACL_SUCCESS;
    case TaskKind::Fill: kernels::fill(reinterpret_cast<float *>(w.dst), t.m, t.alpha); return ACL_SUCCESS;
    case TaskKind::Axpy:
      kernels::axpy(t.m, t.alpha, reinterpret_cast<const float *>(w.src), reinterpret_cast<float *>(w.dst));
      return ACL_SUCCESS;
    case TaskKind::Matmul:
      kernels::matmul(t.m, t.n, t.k, reinterpret_cast<const float *>(w.src),
                      reinterpret_cast<const float *>(w.src2), reinterpret_cast<float *>(w.dst));
      return ACL_SUCCESS;
    default: return ACL_SUCCESS;  // events are handled by the stream worker
  }
}

}  // namespace npusim

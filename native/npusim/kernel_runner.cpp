// npusim-kernel-runner: runs one client's kernels with that client's rights.
//
// npusimd starts one per session that loads a device binary (fork + exec, as root when the
// daemon is root) with the client's uid, gid and groups on the command line; before it reads a
// single message the runner takes those credentials for good (and no_new_privs), so a kernel,
// its constructors included, can do nothing its client could not. The daemon hands it the
// client's device memory as memfds (mapped shared, so kernels write the daemon's memory in
// place) and the binaries' bytes as memfds, dlopen'ed through /proc/self/fd.
#include <dlfcn.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "npusim/kernel.h"
#include "runner_proto.h"
#include "wire.h"

struct npusimKernelCtx {
  uint32_t block;
  uint32_t blocks;
};

namespace {

using npusim::runner::Msg;
using npusim::runner::Op;

struct Mapping {
  char *base;
  uint64_t mapped;  // page-rounded length of the mapping
  uint64_t size;    // the allocation's size: the range kernels may touch
};

std::map<uint64_t, Mapping> g_memory;  // device address -> shared mapping (read-only during a launch)
struct Binary {
  void *handle;
  int fd;  // kept open while loaded: glibc matches dlopen by path, and each loaded path must differ
};
std::map<uint64_t, Binary> g_binaries;  // binary id -> its dlopen handle

using Kernel = void (*)(npusimKernelCtx *, const void *, size_t);

bool drop_to(uid_t uid, gid_t gid, const std::vector<gid_t> &groups) {
  if (::setgroups(groups.size(), groups.data()) != 0 && ::getuid() == 0) return false;
  if (::setresgid(gid, gid, gid) != 0 || ::setresuid(uid, uid, uid) != 0) return false;
  if (uid != 0 && ::setuid(0) == 0) return false;  // must be gone for good
  ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // set after the credential change, which clears it
  return ::getppid() != 1;
}

int32_t load(uint64_t id, int fd) {
  if (fd < 0 || g_binaries.count(id)) return ACL_ERROR_INVALID_PARAM;
  const int keep = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (keep < 0) return ACL_ERROR_RT_INTERNAL_ERROR;
  const std::string path = "/proc/self/fd/" + std::to_string(keep);
  void *h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    std::fprintf(stderr, "npusim-kernel-runner: %s\n", ::dlerror());
    ::close(keep);
    return ACL_ERROR_INVALID_FILE;
  }
  g_binaries[id] = Binary{h, keep};
  return ACL_SUCCESS;
}

Kernel find(uint64_t id, const std::string &name) {
  auto it = g_binaries.find(id);
  if (it == g_binaries.end() || name.empty()) return nullptr;
  return reinterpret_cast<Kernel>(::dlsym(it->second.handle, name.c_str()));
}

// Blocks in parallel: one thread per core (at most numBlocks), each taking the next block.
void launch(Kernel k, uint32_t blocks, uint32_t parallel, const std::string &args) {
  const uint32_t threads = std::max(1u, std::min({blocks, parallel, std::thread::hardware_concurrency()}));
  std::atomic<uint32_t> next{0};
  auto run = [&] {
    for (uint32_t b; (b = next.fetch_add(1)) < blocks;) {
      npusimKernelCtx ctx{b, blocks};
      k(&ctx, args.data(), args.size());
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t i = 1; i < threads; ++i) pool.emplace_back(run);
  run();
  for (auto &t : pool) t.join();
}

int32_t handle(const Msg &m, const std::string &body, int fd) {
  switch (m.op) {
    case Op::Load: return load(m.id, fd);
    case Op::Unload: {
      auto it = g_binaries.find(m.id);
      if (it == g_binaries.end()) return ACL_ERROR_INVALID_PARAM;
      ::dlclose(it->second.handle);
      ::close(it->second.fd);
      g_binaries.erase(it);
      return ACL_SUCCESS;
    }
    case Op::Lookup: return find(m.id, body) ? ACL_SUCCESS : ACL_ERROR_RT_SYMBOL_NOT_FOUND;
    case Op::Map: {
      if (fd < 0 || m.a == 0 || m.b == 0 || m.b > m.a || (!body.empty() && body.size() != sizeof(uint64_t)))
        return ACL_ERROR_INVALID_PARAM;
      uint64_t offset = 0;  // body: where in the memfd an alias (VMM mapping, IPC import) starts
      if (!body.empty()) std::memcpy(&offset, body.data(), sizeof offset);
      void *p = ::mmap(nullptr, m.a, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(offset));
      if (p == MAP_FAILED) return ACL_ERROR_RT_MEMORY_ALLOCATION;
      auto old = g_memory.find(m.id);
      if (old != g_memory.end()) ::munmap(old->second.base, old->second.mapped);
      g_memory[m.id] = Mapping{static_cast<char *>(p), m.a, m.b};
      return ACL_SUCCESS;
    }
    case Op::Unmap: {
      auto it = g_memory.find(m.id);
      if (it == g_memory.end()) return ACL_ERROR_INVALID_PARAM;
      ::munmap(it->second.base, it->second.mapped);
      g_memory.erase(it);
      return ACL_SUCCESS;
    }
    case Op::Launch: {
      const auto blocks = static_cast<uint32_t>(m.a), parallel = static_cast<uint32_t>(m.a >> 32);
      if (m.b > body.size() || blocks == 0) return ACL_ERROR_INVALID_PARAM;
      Kernel k = find(m.id, body.substr(0, m.b));
      if (k == nullptr) return ACL_ERROR_RT_SYMBOL_NOT_FOUND;
      launch(k, blocks, std::max(1u, parallel), body.substr(m.b));
      return ACL_SUCCESS;
    }
  }
  return ACL_ERROR_INVALID_PARAM;
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) uint32_t npusimKernelBlockIdx(const npusimKernelCtx *ctx) {
  return ctx != nullptr ? ctx->block : 0;
}

__attribute__((visibility("default"))) uint32_t npusimKernelNumBlocks(const npusimKernelCtx *ctx) {
  return ctx != nullptr ? ctx->blocks : 0;
}

__attribute__((visibility("default"))) void *npusimKernelGm(npusimKernelCtx *, uint64_t devAddr, size_t len) {
  auto it = g_memory.upper_bound(devAddr);
  if (it == g_memory.begin()) return nullptr;
  --it;
  const uint64_t off = devAddr - it->first;
  if (off > it->second.size || len > it->second.size - off) return nullptr;
  return it->second.base + off;
}

}  // extern "C"

// argv: UID GID [GROUP,GROUP,...]; the daemon's end of the socketpair is fd 3.
int main(int argc, char **argv) {
  if (argc < 3) {
    std::fprintf(stderr, "npusim-kernel-runner: started by npusimd only\n");
    return 2;
  }
  const uid_t uid = static_cast<uid_t>(std::strtoul(argv[1], nullptr, 10));
  const gid_t gid = static_cast<gid_t>(std::strtoul(argv[2], nullptr, 10));
  std::vector<gid_t> groups;
  const std::string list = argc > 3 ? argv[3] : "";
  for (size_t pos = 0; pos < list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    groups.push_back(static_cast<gid_t>(std::strtoul(list.substr(pos, comma - pos).c_str(), nullptr, 10)));
    pos = comma + 1;
  }
  if (!drop_to(uid, gid, groups)) {
    std::fprintf(stderr, "npusim-kernel-runner: cannot take the client's credentials\n");
    return 3;
  }
  constexpr int kChannel = 3;
  for (;;) {
    Msg m{};
    std::vector<int> fds;
    if (!npusim::wire::recv_with_fds(kChannel, &m, sizeof(m), fds, 1)) return 0;  // the daemon closed: done
    std::string body(m.len, '\0');
    if (m.len > 0 && !npusim::wire::recv_all(kChannel, body.data(), body.size())) return 0;
    Msg reply{};
    reply.op = m.op;
    reply.code = handle(m, body, fds.empty() ? -1 : fds[0]);
    for (int fd : fds) ::close(fd);  // a mapping or a dlopen keeps what it needs
    if (!npusim::wire::send_all(kChannel, &reply, sizeof(reply))) return 0;
  }
}

// Device binaries and kernel launches on the daemon's side (kernel_host.h). The daemon never
// loads a binary itself (dlopen runs the binary's constructors): a runner process per session,
// started with the client's uid, gid and groups, does. Device memory reaches it as memfds.
#include "kernel_host.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <vector>

#include "acl/acl_base.h"
#include "device_state.h"
#include "runner_proto.h"
#include "wire.h"

namespace npusim::kernels {
namespace {

constexpr uint64_t kMaxBinary = 1ULL << 30;  // a device binary or a launch's arguments, at most
constexpr uint64_t kMaxArgs = 64ULL << 10;

// The runner is installed next to npusimd.
const std::string &runner_path() {
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    char buf[PATH_MAX] = {};
    ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
    std::string self = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    path = self.substr(0, self.rfind('/') + 1) + "npusim-kernel-runner";
  });
  return path;
}

struct Creds {
  uid_t uid = 0;
  gid_t gid = 0;
  std::string groups;  // "G,G,..."
};

// The client's effective credentials and groups, as its /proc entry says now.
bool client_creds(pid_t pid, Creds *out) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  bool uid = false, gid = false;
  while (std::getline(status, line)) {
    std::istringstream in(line.substr(line.find(':') + 1));
    unsigned long real = 0, eff = 0;
    if (line.rfind("Uid:", 0) == 0 && (in >> real >> eff)) out->uid = static_cast<uid_t>(eff), uid = true;
    if (line.rfind("Gid:", 0) == 0 && (in >> real >> eff)) out->gid = static_cast<gid_t>(eff), gid = true;
    if (line.rfind("Groups:", 0) == 0) {
      for (unsigned long g; in >> g;) out->groups += (out->groups.empty() ? "" : ",") + std::to_string(g);
    }
  }
  return uid && gid;
}

// Starts k's runner (k.mu held). Everything the child needs is prepared before fork: the daemon
// is multithreaded, so the child only calls dup2, close_range and execv.
int32_t spawn(SessionKernels &k, const Creds &c) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return ACL_ERROR_RT_INTERNAL_ERROR;
  const std::string uid = std::to_string(c.uid), gid = std::to_string(c.gid);
  const std::string &path = runner_path();
  std::vector<char *> argv{const_cast<char *>(path.c_str()), const_cast<char *>(uid.c_str()),
                           const_cast<char *>(gid.c_str()), const_cast<char *>(c.groups.c_str()), nullptr};
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::dup2(sv[1], 3) < 0) ::_exit(127);
    ::syscall(SYS_close_range, 4U, ~0U, 0U);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  if (pid < 0) {
    ::close(sv[0]);
    return ACL_ERROR_RT_INTERNAL_ERROR;
  }
  k.runner = pid;
  k.channel = sv[0];
  return ACL_SUCCESS;
}

void stop(SessionKernels &k) {
  if (k.channel >= 0) ::close(k.channel);
  if (k.runner > 0) {
    ::kill(k.runner, SIGKILL);
    ::waitpid(k.runner, nullptr, 0);
  }
  k.channel = -1;
  k.runner = 0;
}

// One request to the runner (k.mu held); a broken channel means the runner died.
int32_t ask(SessionKernels &k, runner::Op op, uint64_t id, uint64_t a, uint64_t b, const std::string &body, int fd = -1) {
  if (k.dead || k.channel < 0) return ACL_ERROR_RT_AICORE_EXCEPTION;
  runner::Msg m{op, 0, id, a, b, body.size()};
  runner::Msg reply{};
  const bool ok = (fd >= 0 ? wire::send_with_fds(k.channel, &m, sizeof(m), {fd}) : wire::send_all(k.channel, &m, sizeof(m))) &&
                  wire::send_all(k.channel, body.data(), body.size()) && wire::recv_all(k.channel, &reply, sizeof(reply));
  if (!ok) {
    std::fprintf(stderr, "npusimd: the kernel runner of a client died (a kernel crashed?)\n");
    k.dead = true;
    stop(k);
    return ACL_ERROR_RT_AICORE_EXCEPTION;
  }
  return reply.code;
}

std::shared_ptr<SessionKernels> of(Session &s) {
  std::lock_guard<std::mutex> g(s.mu);
  return s.kernels;
}

bool read_body(int fd, uint64_t size, uint64_t max, std::string *body) {
  if (size > max) return false;
  body->assign(size, '\0');
  return size == 0 || wire::recv_all(fd, body->data(), size);
}

bool write_all(int fd, const std::string &bytes) {
  for (size_t done = 0; done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

int32_t load(DeviceState &state, Session &s, uid_t peer_uid, const std::string &bytes, uint64_t *id) {
  Creds c;
  if (!client_creds(s.pid, &c) || c.uid != peer_uid) return ACL_ERROR_RT_NO_PERMISSION;
  // Kernels must run with the client's rights; a daemon not run by root can take no one else's.
  if (::geteuid() != 0 && c.uid != ::geteuid()) {
    std::fprintf(stderr, "npusimd: uid %u may not run kernels on a daemon of uid %u (run npusimd as root)\n",
                 static_cast<unsigned>(c.uid), static_cast<unsigned>(::geteuid()));
    return ACL_ERROR_RT_NO_PERMISSION;
  }
  // The runner maps the session's memory: it must be memfds from now on (memory_swap excludes
  // every running task meanwhile, so take it before k->mu, as run() does).
  if (int32_t rc = state.share_memory(s); rc != ACL_SUCCESS) return rc;
  auto k = of(s);
  std::lock_guard<std::mutex> g(k->mu);
  if (k->runner == 0 && !k->dead)
    if (int32_t rc = spawn(*k, c); rc != ACL_SUCCESS) return rc;
  int mfd = ::memfd_create("npusim-binary", MFD_CLOEXEC);
  if (mfd < 0) return ACL_ERROR_RT_INTERNAL_ERROR;
  if (!write_all(mfd, bytes)) {
    ::close(mfd);
    return ACL_ERROR_RT_INTERNAL_ERROR;
  }
  const uint64_t bin = k->next_id++;
  int32_t rc = ask(*k, runner::Op::Load, bin, 0, 0, {}, mfd);
  ::close(mfd);
  if (rc != ACL_SUCCESS) return rc;
  k->binaries[bin] = true;
  *id = bin;
  return ACL_SUCCESS;
}

int32_t unload(Session &s, uint64_t bin) {
  auto k = of(s);
  std::lock_guard<std::mutex> g(k->mu);
  if (k->binaries.erase(bin) == 0) return ACL_ERROR_INVALID_PARAM;
  for (auto it = k->functions.begin(); it != k->functions.end();)
    it = it->second.binary == bin ? k->functions.erase(it) : std::next(it);
  return ask(*k, runner::Op::Unload, bin, 0, 0, {});
}

int32_t lookup(Session &s, uint64_t bin, const std::string &name, uint64_t *id) {
  auto k = of(s);
  std::lock_guard<std::mutex> g(k->mu);
  if (k->binaries.count(bin) == 0) return ACL_ERROR_INVALID_PARAM;
  if (int32_t rc = ask(*k, runner::Op::Lookup, bin, 0, 0, name); rc != ACL_SUCCESS) return rc;
  const uint64_t f = k->next_id++;
  k->functions[f] = Function{bin, name};
  *id = f;
  return ACL_SUCCESS;
}

}  // namespace

SessionKernels::~SessionKernels() { stop(*this); }

bool serve(DeviceState &state, Session &s, int fd, uid_t peer_uid, const proto::Request &rq, proto::Reply &rp) {
  std::string body;
  switch (rq.op) {
    case proto::Op::BinaryLoad:
      if (!read_body(fd, rq.size, kMaxBinary, &body)) return false;
      rp.code = body.empty() ? ACL_ERROR_INVALID_PARAM : load(state, s, peer_uid, body, &rp.value[0]);
      return true;
    case proto::Op::BinaryUnload: rp.code = unload(s, rq.value[0]); return true;
    case proto::Op::FunctionLookup:
      if (!read_body(fd, rq.size, PATH_MAX, &body)) return false;
      rp.code = lookup(s, rq.value[0], body, &rp.value[0]);
      return true;
    case proto::Op::LaunchKernel: {
      if (!read_body(fd, rq.size, kMaxArgs, &body)) return false;
      uint32_t device = 0;
      if (rq.task.kind != proto::TaskKind::Kernel || !streams::device_of(s, rq.stream, &device)) {
        rp.code = ACL_ERROR_INVALID_PARAM;
        return true;
      }
      Work w;
      w.task = rq.task;
      w.pid = s.pid;
      w.body = std::move(body);
      w.kernels = of(s);
      {
        std::lock_guard<std::mutex> g(w.kernels->mu);
        if (w.kernels->functions.count(rq.task.src2) == 0) {
          rp.code = ACL_ERROR_RT_INVALID_DEVICE_FUNCTION;
          return true;
        }
      }
      // A kernel may touch any allocation of its process: all of them stay alive while it runs.
      w.hold = state.buffers(s, true);
      w.writes_all = true;
      rp.code = streams::enqueue(s, rq.stream, std::move(w), &rp.value[0]);
      return true;
    }
    default: rp.code = ACL_ERROR_INVALID_PARAM; return true;
  }
}

int32_t run(Work &w) {
  SessionKernels &k = *w.kernels;
  std::lock_guard<std::mutex> g(k.mu);
  auto f = k.functions.find(w.task.src2);
  if (f == k.functions.end()) return ACL_ERROR_RT_INVALID_DEVICE_FUNCTION;  // unloaded meanwhile
  // The runner maps exactly the allocations the kernel may touch (this launch's view of them).
  std::set<uint64_t> live;
  for (auto &b : w.hold) {
    live.insert(b->va);
    auto m = k.mapped.find(b->va);
    if (m != k.mapped.end() && m->second == b->serial) continue;
    int32_t rc = ACL_SUCCESS;
    if (b->backing) {
      // A VMM mapping or an IPC import: the runner maps the part of the backing buffer's memfd it
      // shows (page-aligned; an exporter that never loaded a binary has no memfd to hand over).
      const Buffer &root = *b->backing;
      const uint64_t offset = static_cast<uint64_t>(b->base - root.base);
      if (root.backing || root.fd < 0 || offset % static_cast<uint64_t>(::getpagesize()) != 0)
        return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
      const std::string at(reinterpret_cast<const char *>(&offset), sizeof offset);
      rc = ask(k, runner::Op::Map, b->va, b->size, b->size, at, root.fd);
    } else {
      if (b->fd < 0) return ACL_ERROR_RT_INTERNAL_ERROR;  // share_memory ran before any binary was loaded
      rc = ask(k, runner::Op::Map, b->va, b->mapped, b->size, {}, b->fd);
    }
    if (rc != ACL_SUCCESS) return rc;
    k.mapped[b->va] = b->serial;
  }
  for (auto it = k.mapped.begin(); it != k.mapped.end();) {
    if (live.count(it->first)) {
      ++it;
      continue;
    }
    if (int32_t rc = ask(k, runner::Op::Unmap, it->first, 0, 0, {}); rc != ACL_SUCCESS) return rc;
    it = k.mapped.erase(it);
  }
  const std::string body = f->second.name + w.body;
  const uint64_t parallel = std::max<uint64_t>(1, w.task.n);
  return ask(k, runner::Op::Launch, f->second.binary, w.task.m | (std::min<uint64_t>(parallel, 0xffffffffu) << 32),
             f->second.name.size(), body);
}

void release(Session &s) {
  std::shared_ptr<SessionKernels> old;
  {
    std::lock_guard<std::mutex> g(s.mu);
    old = std::move(s.kernels);
    s.kernels = std::make_shared<SessionKernels>();
  }
  // The runner ends when the last queued launch holding old is gone (~SessionKernels).
}

}  // namespace npusim::kernels

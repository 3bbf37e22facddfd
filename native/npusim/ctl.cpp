// The by-pid control listener: the software NPU's counterpart of the threads the NVIDIA driver
// runs inside every CUDA process to serve cuCheckpointProcess* calls made from another process.
//
// Started lazily by the first successful aclInit, one thread listens on the abstract Unix socket
// @npusim-ctl-<pid> (no file to go stale; CRIU dumps and restores a listening socket with a thread
// in accept()). Only the process's own uid or root may connect (SO_PEERCRED). One request line
// per connection, one reply line back, then the connection is closed, so no control connection
// is ever open while CRIU dumps the process.
//
//   state | lock <timeout_ms> | checkpoint | restore [<old>:<new>,...] | unlock
//   -> "<code> <RUNNING|LOCKED|CHECKPOINTED|FAILED>\n"
//
// <code> is 0, an aclError of the runtime's own snapshot call, or one of the negative
// NPUSNAP_CTL_E_* codes. The requests, codes, state words and the socket's name are defined once,
// in native/include/npusnap/ctl.h, which the CUDA shim (the client) includes too. The work is done in-process by the runtime's own Lock/Backup/Restore/Unlock,
// exactly what the agent would call; a test shim (native/cudashim) turns it into libcuda's API.
// NPUSIM_CTL_FAULT=lock (test-only fault injection) makes a lock request fail and leave the
// process FAILED, the state a real driver reports after an unrecoverable checkpoint error.
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "npusnap/ctl.h"
#include "runtime.h"

using namespace npusim::rt;

namespace {

std::atomic<bool> g_started{false};
std::atomic<bool> g_failed{false};
std::atomic<int> g_listen_fd{-1};
bool g_fault_lock = false;

const char *state_name() {
  if (g_failed.load()) return NPUSNAP_STATE_FAILED;
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  switch (r.state) {
    case State::Running: return NPUSNAP_STATE_RUNNING;
    case State::Locked: return NPUSNAP_STATE_LOCKED;
    default: return NPUSNAP_STATE_CHECKPOINTED;
  }
}

State current() {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  return r.state;
}

// line is `cmd` alone (then "") or `cmd ARGS` (then ARGS); nullptr for another request.
const char *arguments(const char *line, const char *cmd) {
  const size_t n = std::strlen(cmd);
  if (std::strncmp(line, cmd, n) != 0) return nullptr;
  if (line[n] == '\0') return line + n;
  return line[n] == ' ' ? line + n + 1 : nullptr;
}

// "0:0,1:1": the software NPU restores every allocation on the device it came from.
bool identity_map(const char *map) {
  while (*map != '\0') {
    char *end = nullptr;
    long a = std::strtol(map, &end, 10);
    if (end == map || *end != ':') return false;
    map = end + 1;
    long b = std::strtol(map, &end, 10);
    if (end == map || a != b) return false;
    map = end;
    if (*map == ',') ++map;
  }
  return true;
}

int execute(const char *line) {
  if (g_failed.load())
    return std::strcmp(line, NPUSNAP_CTL_CMD_STATE) == 0 ? NPUSNAP_CTL_OK : NPUSNAP_CTL_E_FAILED;
  const int pid = static_cast<int>(::getpid());
  const char *args = nullptr;
  if (std::strcmp(line, NPUSNAP_CTL_CMD_STATE) == 0) return NPUSNAP_CTL_OK;
  if ((args = arguments(line, NPUSNAP_CTL_CMD_LOCK)) != nullptr) {
    char *end = nullptr;
    long long ms = std::strtoll(args, &end, 10);
    if (end == args || *end != '\0' || ms < 0) return NPUSNAP_CTL_E_REQUEST;
    if (current() != State::Running) return NPUSNAP_CTL_E_STATE;
    if (g_fault_lock) {
      g_failed = true;
      return NPUSNAP_CTL_E_FAILED;
    }
    return snapshot_lock(ms == 0 ? (1LL << 40) : ms);  // 0: no timeout, as in CUcheckpointLockArgs
  }
  if (std::strcmp(line, NPUSNAP_CTL_CMD_CHECKPOINT) == 0) {
    if (current() != State::Locked) return NPUSNAP_CTL_E_STATE;
    return aclrtSnapShotProcessBackup(pid, nullptr);
  }
  if ((args = arguments(line, NPUSNAP_CTL_CMD_RESTORE)) != nullptr) {
    if (!identity_map(args)) return NPUSNAP_CTL_E_UNSUPPORTED;
    if (current() != State::BackedUp) return NPUSNAP_CTL_E_STATE;
    return aclrtSnapShotProcessRestore(pid, nullptr);
  }
  if (std::strcmp(line, NPUSNAP_CTL_CMD_UNLOCK) == 0) {
    if (current() != State::Locked) return NPUSNAP_CTL_E_STATE;  // CUDA: a checkpointed process is restored first
    return aclrtSnapShotProcessUnlock(pid, nullptr);
  }
  return NPUSNAP_CTL_E_REQUEST;
}

void serve(int c) {
  struct timeval tv = {5, 0};
  ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct ucred cr {};
  socklen_t len = sizeof cr;
  char line[256];
  size_t n = 0;
  while (n < sizeof line - 1) {
    ssize_t got = ::recv(c, line + n, sizeof line - 1 - n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n += static_cast<size_t>(got);
    if (std::memchr(line, '\n', n) != nullptr) break;
  }
  line[n] = '\0';
  char *nl = std::strpbrk(line, "\r\n");
  if (nl == nullptr) return;  // a bare connect, or a peer that went away
  *nl = '\0';
  int code;
  if (::getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 ||
      (cr.uid != 0 && cr.uid != ::getuid() && cr.uid != ::geteuid()))
    code = NPUSNAP_CTL_E_DENIED;
  else
    code = execute(line);
  char reply[64];
  int w = std::snprintf(reply, sizeof reply, "%d %s\n", code, state_name());
  const char *p = reply;
  while (w > 0) {
    ssize_t s = ::send(c, p, static_cast<size_t>(w), MSG_NOSIGNAL);
    if (s < 0 && errno == EINTR) continue;
    if (s <= 0) return;
    p += s;
    w -= static_cast<int>(s);
  }
}

void *ctl_main(void *) {
  pthread_setname_np(pthread_self(), "npusim-ctl");
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  int len = std::snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, NPUSNAP_CTL_SOCKET_PREFIX "%d",
                          static_cast<int>(::getpid()));
  const socklen_t salen = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(len));
  if (::bind(fd, reinterpret_cast<sockaddr *>(&sa), salen) < 0 || ::listen(fd, 8) < 0) {
    ::close(fd);  // EADDRINUSE: another listener already serves this pid
    return nullptr;
  }
  g_listen_fd = fd;
  for (;;) {
    int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EBADF || errno == EINVAL) return nullptr;  // closed in a forked child
      if (errno != EINTR && errno != ECONNABORTED) {
        struct timespec ts = {0, 100 * 1000000L};
        ::nanosleep(&ts, nullptr);
      }
      continue;
    }
    serve(c);
    ::close(c);
  }
}

// A forked child shares nothing it could serve: drop the parent's listener.
void atfork_child() {
  int fd = g_listen_fd.exchange(-1);
  if (fd >= 0) ::close(fd);
}

}  // namespace

namespace npusim::rt {

void start_ctl() {
  if (g_started.exchange(true)) return;
  const char *fault = std::getenv("NPUSIM_CTL_FAULT");
  g_fault_lock = fault != nullptr && std::strcmp(fault, "lock") == 0;
  pthread_atfork(nullptr, nullptr, atfork_child);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // the listener never takes the application's signals
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&a, 256 * 1024);
  pthread_t t;
  if (pthread_create(&t, &a, ctl_main, nullptr) != 0) g_started = false;
  pthread_attr_destroy(&a);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace npusim::rt

// npusimd: the software NPU's device daemon.
//
//   npusimd [--socket PATH] --devices N --memory BYTES_PER_DEVICE [--group NAME] [--foreground]
//           [--hccl-listen ADDR[:PORT]]
//
// HCCL (hccl_root.cpp): the daemon listens for other daemons' HCCL traffic on one TCP port, on
// ADDR (IPv4, default 127.0.0.1); with a PORT it listens from the start, else from the first
// HcclGetRootInfo (any free port, carried in the root info) or rank-table root (HCCL_IF_BASE_PORT).
//
// Serves its own uid, root and the members of --group NAME (like a device node owned by
// HwHiAiUser); the socket is 0660 owner:group (0600 without a group), in a directory that must
// belong to root or the daemon's user and be writable by nobody else (default: trust.h).
//
// Prints "ready <pid>" on stdout once it accepts connections. Without --foreground it detaches
// (the pid printed is the daemon's). Exits 3 if a live daemon already answers on PATH, 4 if the
// socket's directory is not trusted; a stale socket file is replaced. SIGTERM/SIGINT or an admin
// Shutdown request remove the socket and exit.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "access.h"
#include "device_state.h"
#include "hccl_daemon.h"
#include "trust.h"
#include "va.h"
#include "wire.h"

namespace {

int g_wake_fd = -1;  // write end of the self-pipe that ends the accept loop

void on_signal(int) {
  const char c = 's';
  [[maybe_unused]] ssize_t n = ::write(g_wake_fd, &c, 1);
}

[[noreturn]] void die(int code, const std::string &msg) {
  std::fprintf(stderr, "npusimd: %s\n", msg.c_str());
  std::exit(code);
}

struct Options {
  std::string socket = npusim::trust::default_socket();
  std::string group;
  uint32_t devices = 1;
  uint64_t memory = 1ULL << 30;
  bool foreground = false;
  std::string hccl_listen;  // hccl: ADDR[:PORT]
};

// Accepts a plain byte count or one with a K/M/G suffix (powers of 1024).
uint64_t parse_bytes(const char *s) {
  char *end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s) die(2, std::string("invalid byte count: ") + s);
  switch (*end) {
    case 'K': case 'k': v <<= 10; ++end; break;
    case 'M': case 'm': v <<= 20; ++end; break;
    case 'G': case 'g': v <<= 30; ++end; break;
    default: break;
  }
  if (*end != '\0' && std::strcmp(end, "iB") != 0 && std::strcmp(end, "B") != 0)
    die(2, std::string("invalid byte count: ") + s);
  return v;
}

Options parse(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char * {
      if (i + 1 >= argc) die(2, "missing value for " + a);
      return argv[++i];
    };
    if (a == "--socket") o.socket = value();
    else if (a == "--devices") o.devices = static_cast<uint32_t>(std::strtoul(value(), nullptr, 10));
    else if (a == "--memory") o.memory = parse_bytes(value());
    else if (a == "--group") o.group = value();
    else if (a == "--foreground") o.foreground = true;
    else if (a == "--hccl-listen") o.hccl_listen = value();
    else die(2, "usage: npusimd [--socket PATH] --devices N --memory BYTES [--group NAME] [--foreground] "
                "[--hccl-listen ADDR[:PORT]]");
  }
  if (o.devices == 0 || o.devices > npusim::va::kMaxDevices) die(2, "--devices must be 1..256");
  if (o.memory == 0 || o.memory > npusim::va::kWindowSize) die(2, "--memory must be 1 byte..1 TiB");
  return o;
}

// Creates the socket's directory if missing (0755: group members must reach the socket), then
// refuses it unless nobody else can plant or swap a socket or a log in it.
void prepare_dir(const std::string &path) {
  const std::string dir = npusim::trust::dir_of(path);
  for (size_t pos = dir.find('/', 1); pos != std::string::npos; pos = dir.find('/', pos + 1))
    ::mkdir(dir.substr(0, pos).c_str(), 0755);
  ::mkdir(dir.c_str(), 0755);
  std::string why;
  if (!npusim::trust::dir_trusted(dir, ::geteuid(), &why)) die(4, "refusing the socket directory: " + why);
}

int listen_on(const std::string &path, const Options &opt, gid_t gid) {
  prepare_dir(path);
  int probe = npusim::wire::connect_unix(path);
  if (probe >= 0) {
    ::close(probe);
    die(3, "a daemon already answers on " + path);
  }
  if (probe == -ECONNREFUSED) ::unlink(path.c_str());  // stale socket left by a dead daemon
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) die(2, "socket path too long: " + path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const mode_t old_mask = ::umask(077);  // nobody else may connect before the chmod below
  const bool bound = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0;
  ::umask(old_mask);
  if (!bound || ::listen(fd, 128) != 0)
    die(1, "cannot listen on " + path + ": " + std::strerror(errno));
  // The kernel checks write permission on the socket at connect(); the daemon checks every peer too.
  if ((!opt.group.empty() && ::chown(path.c_str(), ::geteuid(), gid) != 0) ||
      ::chmod(path.c_str(), opt.group.empty() ? 0600 : 0660) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    die(1, "cannot set the permissions of " + path + ": " + std::strerror(err));
  }
  return fd;
}

// hccl: --hccl-listen ADDR[:PORT].
void listen_hccl(const std::string &spec) {
  if (spec.empty()) return;
  const size_t colon = spec.find(':');
  const std::string addr = spec.substr(0, colon);
  in_addr ip{};
  char *end = nullptr;
  const unsigned long port = colon == std::string::npos ? 0 : std::strtoul(spec.c_str() + colon + 1, &end, 10);
  if (::inet_pton(AF_INET, addr.c_str(), &ip) != 1 || port > 65535 || (end != nullptr && *end != '\0'))
    die(2, "invalid --hccl-listen (want IPv4[:PORT]): " + spec);
  std::string why;
  if (!npusim::hccl::configure(ip.s_addr, static_cast<uint16_t>(port), &why)) die(1, why);
}

void detach() {
  pid_t child = ::fork();
  if (child < 0) die(1, std::string("fork: ") + std::strerror(errno));
  if (child > 0) {
    std::printf("ready %d\n", child);
    std::fflush(stdout);
    ::_exit(0);
  }
  ::setsid();
  int null = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd < 3; ++fd) ::dup2(null, fd);
  if (null > 2) ::close(null);
}

}  // namespace

int main(int argc, char **argv) {
  Options opt = parse(argc, argv);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) die(1, "pipe");
  g_wake_fd = pipefd[1];
  std::signal(SIGPIPE, SIG_IGN);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  gid_t gid = 0;
  if (!opt.group.empty()) {
    const group *g = ::getgrnam(opt.group.c_str());
    if (g == nullptr) die(2, "no such group: " + opt.group);
    gid = g->gr_gid;
    npusim::access::set_group(gid, opt.group);
  }
  const int listen_fd = listen_on(opt.socket, opt, gid);
  listen_hccl(opt.hccl_listen);
  if (opt.foreground) {
    std::printf("ready %d\n", ::getpid());
    std::fflush(stdout);
  } else {
    detach();
  }

  static npusim::DeviceState state(opt.devices, opt.memory, opt.socket);
  npusim::hccl::start();
  pollfd fds[2] = {{listen_fd, POLLIN, 0}, {pipefd[0], POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[1].revents != 0) break;
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      std::thread([fd] {
        if (npusim::serve_connection(state, fd)) on_signal(0);
      }).detach();
    }
  }
  ::unlink(opt.socket.c_str());
  // Clients still connected see the connection drop; no destructor may race their threads.
  ::_exit(0);
}

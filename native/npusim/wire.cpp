#include "wire.h"

#include <cerrno>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

namespace npusim::wire {

int connect_unix(const std::string &path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return -ENAMETOOLONG;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  while (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

bool send_all(int fd, const void *buf, size_t len) {
  auto *p = static_cast<const char *>(buf);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool recv_all(int fd, void *buf, size_t len) {
  auto *p = static_cast<char *>(buf);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool call(int fd, const proto::Request &req, proto::Reply &rep, std::string *payload, const std::string *trailing) {
  if (!send_all(fd, &req, sizeof(req))) return false;
  if (trailing != nullptr && !send_all(fd, trailing->data(), trailing->size())) return false;
  if (!recv_all(fd, &rep, sizeof(rep))) return false;
  std::string body(rep.payload_len, '\0');
  if (rep.payload_len > 0 && !recv_all(fd, body.data(), body.size())) return false;
  if (payload != nullptr) *payload = std::move(body);
  return true;
}

bool send_with_fds(int fd, const void *buf, size_t len, const std::vector<int> &fds) {
  if (len == 0 || fds.size() > kMaxFds) return false;
  iovec iov{const_cast<void *>(buf), len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = ctl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do n = ::sendmsg(fd, &msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  // The descriptors went with the first byte; the rest is plain data.
  return static_cast<size_t>(n) == len || send_all(fd, static_cast<const char *>(buf) + n, len - static_cast<size_t>(n));
}

bool recv_with_fds(int fd, void *buf, size_t len, std::vector<int> &fds, size_t max) {
  if (len == 0 || max > kMaxFds) return false;
  iovec iov{buf, len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof(ctl);
  ssize_t n;
  do n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  for (cmsghdr *c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.push_back(got);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || fds.size() > max) return false;
  return static_cast<size_t>(n) == len || recv_all(fd, static_cast<char *>(buf) + n, len - static_cast<size_t>(n));
}

bool peer_cred(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  if (pid != nullptr) *pid = cred.pid;
  if (uid != nullptr) *uid = cred.uid;
  if (gid != nullptr) *gid = cred.gid;
  return true;
}

proto::Request request(proto::Op op) {
  proto::Request req{};
  req.magic = proto::kMagic;
  req.op = op;
  return req;
}

}  // namespace npusim::wire

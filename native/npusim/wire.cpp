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

bool call(int fd, const proto::Request &req, proto::Reply &rep, std::string *payload) {
  if (!send_all(fd, &req, sizeof(req)) || !recv_all(fd, &rep, sizeof(rep))) return false;
  std::string body(rep.payload_len, '\0');
  if (rep.payload_len > 0 && !recv_all(fd, body.data(), body.size())) return false;
  if (payload != nullptr) *payload = std::move(body);
  return true;
}

proto::Request request(proto::Op op) {
  proto::Request req{};
  req.magic = proto::kMagic;
  req.op = op;
  return req;
}

}  // namespace npusim::wire

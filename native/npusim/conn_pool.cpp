#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "runtime.h"
#include "wire.h"

namespace npusim::rt {

int ConnPool::connect_one(proto::Reply *hello, int32_t *code) {
  int fd = wire::connect_unix(path_);
  if (fd == -EACCES || fd == -EPERM) {  // the socket is 0660 owner:group
    std::fprintf(stderr, "npusim: permission denied on %s (not a member of the daemon's device group?)\n",
                 path_.c_str());
    if (code != nullptr) *code = ACL_ERROR_RT_NO_PERMISSION;
  }
  if (fd < 0) return -1;
  // Only a daemon run by root or by us is our device: anyone else's could read and forge our data.
  uid_t uid = 0;
  if (!wire::peer_cred(fd, nullptr, &uid, nullptr) || (uid != 0 && uid != ::geteuid())) {
    std::fprintf(stderr, "npusim: the daemon on %s runs as uid %u, neither root nor us: refusing it\n", path_.c_str(),
                 static_cast<unsigned>(uid));
    ::close(fd);
    if (code != nullptr) *code = ACL_ERROR_RT_NO_PERMISSION;
    return -1;
  }
  proto::Reply rp{};
  if (!wire::call(fd, wire::request(proto::Op::Hello), rp) || rp.code != ACL_SUCCESS) {
    if (code != nullptr && rp.code != ACL_SUCCESS) *code = rp.code;
    if (rp.code == ACL_ERROR_RT_NO_PERMISSION)
      std::fprintf(stderr, "npusim: the daemon on %s refused us (not a member of its device group?)\n", path_.c_str());
    ::close(fd);
    return -1;
  }
  if (hello != nullptr) *hello = rp;
  return fd;
}

int32_t ConnPool::open(const std::string &path) {
  close_all();
  std::lock_guard<std::mutex> g(mu_);
  path_ = path;
  proto::Reply hello{};
  int32_t code = ACL_ERROR_RT_DRV_INTERNAL_ERROR;
  int fd = connect_one(&hello, &code);
  if (fd < 0) return code;
  daemon_pid = static_cast<pid_t>(hello.value[0]);
  device_count = static_cast<uint32_t>(hello.value[1]);
  memory = hello.value[2];
  // The daemon copies host data with process_vm_readv/writev; under Yama ptrace_scope=1 that
  // needs our consent.
  ::prctl(PR_SET_PTRACER, static_cast<unsigned long>(daemon_pid), 0, 0, 0);
  idle_.push_back(fd);
  open_ = true;
  return ACL_SUCCESS;
}

void ConnPool::close_all() {
  std::lock_guard<std::mutex> g(mu_);
  for (int fd : idle_) ::close(fd);
  idle_.clear();
  open_ = false;
  ++generation_;
}

bool ConnPool::connected() {
  std::lock_guard<std::mutex> g(mu_);
  return open_;
}

int32_t ConnPool::call(const proto::Request &rq, proto::Reply *out, const std::string *body) {
  int fd = -1;
  uint64_t gen;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!open_) return ACL_ERROR_RT_SOCKET_CLOSE;
    gen = generation_;
    if (!idle_.empty()) {
      fd = idle_.back();
      idle_.pop_back();
    }
  }
  if (fd < 0 && (fd = connect_one(nullptr)) < 0) return ACL_ERROR_RT_SOCKET_CLOSE;
  proto::Reply rp{};
  if (!wire::call(fd, rq, rp, nullptr, body)) {
    ::close(fd);
    return ACL_ERROR_RT_SOCKET_CLOSE;
  }
  {
    std::lock_guard<std::mutex> g(mu_);
    if (open_ && gen == generation_) {
      idle_.push_back(fd);
      fd = -1;
    }
  }
  if (fd >= 0) ::close(fd);
  if (out != nullptr) *out = rp;
  return rp.code;
}

}  // namespace npusim::rt

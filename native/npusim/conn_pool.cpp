#include <sys/prctl.h>
#include <unistd.h>

#include "runtime.h"
#include "wire.h"

namespace npusim::rt {

int ConnPool::connect_one(proto::Reply *hello) {
  int fd = wire::connect_unix(path_);
  if (fd < 0) return -1;
  proto::Reply rp{};
  if (!wire::call(fd, wire::request(proto::Op::Hello), rp) || rp.code != ACL_SUCCESS) {
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
  int fd = connect_one(&hello);
  if (fd < 0) return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
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

int32_t ConnPool::call(const proto::Request &rq, proto::Reply *out) {
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
  if (!wire::call(fd, rq, rp)) {
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

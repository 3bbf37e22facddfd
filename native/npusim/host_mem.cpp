// The daemon's side of host registration: a client lends its registered host memory as a memfd,
// which becomes an ordinary allocation of its session (so copies, kernel runners and address
// resolution need nothing new). The daemon reopens the descriptor through /proc/PID/fd and takes
// it only if it is a memfd: a client cannot make the daemon open anything else with the daemon's
// rights. Reaching /proc/PID/fd needs the same ptrace access as the copies' process_vm_* calls.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <string>

#include "acl/acl.h"
#include "device_state.h"

namespace npusim::host_mem {

namespace {

bool is_memfd(int fd) {
  char target[PATH_MAX];
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  struct stat st {};
  return std::strncmp(target, "/memfd:", 7) == 0 && ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 0;
}

}  // namespace

int32_t lend(DeviceState &state, Session &s, const proto::Request &rq, uint64_t *va) {
  if (rq.size == 0 || rq.value[0] > INT_MAX || rq.device < 0) return ACL_ERROR_INVALID_PARAM;
  const std::string path = "/proc/" + std::to_string(s.pid) + "/fd/" + std::to_string(rq.value[0]);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return ACL_ERROR_RT_NO_PERMISSION;
  struct stat st {};
  if (!is_memfd(fd) || ::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < rq.size) {
    ::close(fd);
    return ACL_ERROR_INVALID_PARAM;
  }
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t mapped = (rq.size + page - 1) / page * page;
  void *base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    ::close(fd);
    return ACL_ERROR_RT_MEMORY_ALLOCATION;
  }
  const DeviceState::Lent lent{static_cast<char *>(base), mapped, fd};
  const auto device = static_cast<uint32_t>(rq.device);
  int32_t rc = rq.addr == 0 ? state.malloc(s, device, rq.size, va, &lent) : state.malloc_at(s, device, rq.addr, rq.size, &lent);
  if (rc != ACL_SUCCESS) {  // the buffer did not take the memory
    ::munmap(base, mapped);
    ::close(fd);
    return rc;
  }
  if (rq.addr != 0) *va = rq.addr;
  return ACL_SUCCESS;
}

}  // namespace npusim::host_mem

// Daemon administration for tools (npusim.h): status and shutdown, without joining a session.
#include <unistd.h>

#include <cstring>

#include "acl/npusim.h"
#include "wire.h"

using namespace npusim;

namespace {

int32_t admin_call(const char *socketPath, proto::Op op, std::string *payload) {
  if (socketPath == nullptr) return ACL_ERROR_INVALID_PARAM;
  int fd = wire::connect_unix(socketPath);
  if (fd < 0) return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
  proto::Reply rp{};
  const bool ok = wire::call(fd, wire::request(op), rp, payload);
  ::close(fd);
  return ok ? rp.code : ACL_ERROR_RT_SOCKET_CLOSE;
}

}  // namespace

extern "C" {

aclError npusimDaemonStatus(const char *socketPath, char *buf, size_t len, size_t *needed) {
  if (needed == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::string json;
  if (int32_t rc = admin_call(socketPath, proto::Op::Status, &json); rc != ACL_SUCCESS) return rc;
  *needed = json.size();
  if (buf == nullptr || json.size() + 1 > len) return ACL_ERROR_INVALID_PARAM;
  std::memcpy(buf, json.c_str(), json.size() + 1);
  return ACL_SUCCESS;
}

aclError npusimDaemonShutdown(const char *socketPath) {
  return admin_call(socketPath, proto::Op::Shutdown, nullptr);
}

}  // extern "C"

// The direct path, client side (npusim.h): the data-path switch of Backup/Restore and the tool
// calls that ask the daemon to export or import a locked client's device memory (export.h).
#include "direct.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "acl/npusim.h"
#include "runtime.h"
#include "wire.h"

namespace npusim::rt {

DataPath &data_path() {
  static DataPath *d = new DataPath;  // never destroyed, like runtime()
  return *d;
}

}  // namespace npusim::rt

using namespace npusim;

namespace {

char *dup_string(const std::string &s) {
  char *p = static_cast<char *>(std::malloc(s.size() + 1));
  if (p != nullptr) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

std::string error_json(const std::string &msg) {
  std::string out = "{\"error\": \"";
  for (char c : msg) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\", \"errno\": 0}";
}

aclError transfer(proto::Op op, const char *socketPath, int pid, const std::string &body, char **resultJson) {
  if (resultJson == nullptr) return ACL_ERROR_INVALID_PARAM;
  *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0) return ACL_ERROR_INVALID_PARAM;
  int fd = wire::connect_unix(socketPath);
  if (fd < 0) {
    *resultJson = dup_string(error_json(std::string("no npusim daemon answers on ") + socketPath + ": " +
                                        std::strerror(-fd)));
    return ACL_ERROR_RT_DRV_INTERNAL_ERROR;
  }
  proto::Request rq = wire::request(op);
  rq.value[0] = static_cast<uint64_t>(pid);
  rq.size = body.size();
  proto::Reply rp{};
  std::string payload;
  const bool ok = wire::send_all(fd, &rq, sizeof(rq)) && wire::send_all(fd, body.data(), body.size()) &&
                  wire::recv_all(fd, &rp, sizeof(rp)) &&
                  (payload.resize(rp.payload_len), rp.payload_len == 0 || wire::recv_all(fd, payload.data(), payload.size()));
  ::close(fd);
  if (!ok) {
    *resultJson = dup_string(error_json(std::string("the npusim daemon on ") + socketPath +
                                        " closed the connection (did it exit?)"));
    return ACL_ERROR_RT_SOCKET_CLOSE;
  }
  *resultJson = dup_string(payload);
  return rp.code;
}

}  // namespace

extern "C" {

aclError npusimSnapshotSetDataPath(int external) {
  if (external != 0 && external != 1) return ACL_ERROR_INVALID_PARAM;
  rt::Runtime &r = rt::runtime();
  std::lock_guard<std::mutex> g(r.mu);
  rt::data_path().next_external = external != 0;
  return ACL_SUCCESS;
}

int npusimSnapshotGetDataPath(void) {
  rt::Runtime &r = rt::runtime();
  std::lock_guard<std::mutex> g(r.mu);
  return (rt::data_path().next_external ? 1 : 0) | (rt::data_path().backup_external ? 2 : 0);
}

aclError npusimDaemonExport(const char *socketPath, int pid, const char *dir, char **resultJson) {
  if (dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(proto::Op::Export, socketPath, pid, dir, resultJson);
}

aclError npusimDaemonImport(const char *socketPath, int pid, const char *dir, const char *expected, char **resultJson) {
  if (dir == nullptr || std::strchr(dir, '\n') != nullptr) return ACL_ERROR_INVALID_PARAM;
  std::string body = std::string(dir) + "\n" + (expected != nullptr ? expected : "");
  return transfer(proto::Op::Import, socketPath, pid, body, resultJson);
}

}  // extern "C"

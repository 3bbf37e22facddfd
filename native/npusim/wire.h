// Socket helpers shared by the daemon and the runtime.
#pragma once

#include <string>

#include "protocol.h"

namespace npusim::wire {

// Connects to the Unix socket at path; returns the fd or -errno.
int connect_unix(const std::string &path);
// Full-length blocking I/O, retrying on EINTR; false on EOF or error.
bool send_all(int fd, const void *buf, size_t len);
bool recv_all(int fd, void *buf, size_t len);
// One request/reply round trip; payload (if not null) receives the reply's trailing bytes.
bool call(int fd, const proto::Request &req, proto::Reply &rep, std::string *payload = nullptr);
proto::Request request(proto::Op op);

}  // namespace npusim::wire

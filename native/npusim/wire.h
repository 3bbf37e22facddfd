// Socket helpers shared by the daemon and the runtime.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "protocol.h"

namespace npusim::wire {

// Connects to the Unix socket at path; returns the fd or -errno.
int connect_unix(const std::string &path);
// Full-length blocking I/O, retrying on EINTR; false on EOF or error.
bool send_all(int fd, const void *buf, size_t len);
bool recv_all(int fd, void *buf, size_t len);
// One request/reply round trip; payload (if not null) receives the reply's trailing bytes; trailing
// (if not null) is sent right after the request (its trailing bytes).
bool call(int fd, const proto::Request &req, proto::Reply &rep, std::string *payload = nullptr,
          const std::string *trailing = nullptr);
proto::Request request(proto::Op op);
constexpr size_t kMaxFds = 64;  // descriptors in one message (the files of one transfer)

// Sends buf with the descriptors fds attached (SCM_RIGHTS): how a client hands the daemon files it
// opened with its own rights. len must be > 0.
bool send_with_fds(int fd, const void *buf, size_t len, const std::vector<int> &fds);
// Receives exactly len bytes (> 0) and at most max descriptors sent with them; every descriptor
// received is appended to fds (the caller closes them), also when the call fails.
bool recv_with_fds(int fd, void *buf, size_t len, std::vector<int> &fds, size_t max);
// The peer's credentials (SO_PEERCRED); false if the kernel cannot tell.
bool peer_cred(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

}  // namespace npusim::wire

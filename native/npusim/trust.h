// Where the daemon's socket lives, and whether a socket directory can be trusted (both ends).
//
// Root's daemon: /run/npusim/daemon.sock. A user's own daemon: $XDG_RUNTIME_DIR/npusim/daemon.sock,
// or /tmp/npusim-<uid>/daemon.sock when XDG_RUNTIME_DIR is unset (a planted one fails the check
// below). NPUSIM_SOCKET overrides the default; the directory is checked either way.
#pragma once

#include <sys/types.h>

#include <string>

namespace npusim::trust {

std::string default_socket();
// NPUSIM_SOCKET if set, else default_socket().
std::string socket_from_env();
// A socket directory is trusted when it is a real directory (no link), owned by root or by `owner`,
// and writable by neither group nor others: nobody else can plant or swap the socket (or a log)
// there. why says what is wrong.
bool dir_trusted(const std::string &dir, uid_t owner, std::string *why);
// The directory part of a socket path ("." for a bare name).
std::string dir_of(const std::string &path);

}  // namespace npusim::trust

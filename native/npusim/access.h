// Who may use the daemon (access.cpp): like a device node of CANN's (owned by a group such as
// HwHiAiUser), the daemon serves its own uid, root, and the members of one configured group.
#pragma once

#include <sys/types.h>

#include <string>

namespace npusim::access {

// npusimd --group NAME: the group whose members are served; unset serves only the owner and root.
void set_group(gid_t gid, const std::string &name);
// Whether the peer (SO_PEERCRED of a new connection) may use the device; why says why not.
bool may_connect(pid_t pid, uid_t uid, gid_t gid, std::string *why);
// Shutdown and the client list in Status: the daemon's owner and root.
bool is_admin(uid_t uid);

}  // namespace npusim::access

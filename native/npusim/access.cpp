#include "access.h"

#include <unistd.h>

#include <fstream>
#include <optional>
#include <sstream>

namespace npusim::access {
namespace {

std::optional<gid_t> g_gid;
std::string g_name;

// The peer's supplementary groups, read from /proc (SO_PEERCRED carries only the primary gid).
bool in_groups(pid_t pid, gid_t want) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    unsigned long g = 0;
    while (in >> g)
      if (static_cast<gid_t>(g) == want) return true;
    return false;
  }
  return false;
}

}  // namespace

void set_group(gid_t gid, const std::string &name) {
  g_gid = gid;
  g_name = name;
}

bool is_admin(uid_t uid) { return uid == 0 || uid == ::geteuid(); }

bool may_connect(pid_t pid, uid_t uid, gid_t gid, std::string *why) {
  if (is_admin(uid)) return true;
  if (g_gid && (gid == *g_gid || in_groups(pid, *g_gid))) return true;
  *why = "refused uid " + std::to_string(uid) + " (pid " + std::to_string(pid) + "): " +
         (g_gid ? "not root, the daemon's owner or a member of group " + g_name
                : std::string("not root or the daemon's owner, and no --group is set"));
  return false;
}

}  // namespace npusim::access

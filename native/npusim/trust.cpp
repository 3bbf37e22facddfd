#include "trust.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace npusim::trust {

std::string default_socket() {
  if (::geteuid() == 0) return "/run/npusim/daemon.sock";
  const char *xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/npusim/daemon.sock";
  return "/tmp/npusim-" + std::to_string(::geteuid()) + "/daemon.sock";
}

std::string socket_from_env() {
  const char *env = std::getenv("NPUSIM_SOCKET");
  return env != nullptr && env[0] != '\0' ? env : default_socket();
}

std::string dir_of(const std::string &path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

bool dir_trusted(const std::string &dir, uid_t owner, std::string *why) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    *why = dir + ": " + std::strerror(errno);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = dir + " is not a directory (a link?)";
    return false;
  }
  if (st.st_uid != 0 && st.st_uid != owner) {
    *why = dir + " belongs to uid " + std::to_string(st.st_uid) + ", not to root or uid " + std::to_string(owner);
    return false;
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    *why = dir + " is writable by group or others: anyone could plant the socket there";
    return false;
  }
  return true;
}

}  // namespace npusim::trust

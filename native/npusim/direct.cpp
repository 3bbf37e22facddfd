// The direct path, client side (npusim.h): the data-path switch of Backup/Restore and the tool
// calls that ask the daemon to export or import a locked client's device memory (export.h). The
// tool opens the files with its own rights and passes them as descriptors: the daemon opens no path.
#include "direct.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

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

std::string error_json(const std::string &msg, int err = 0) {
  std::string out = "{\"error\": \"";
  for (unsigned char c : msg) {
    if (c == '"' || c == '\\') out += '\\';
    if (c < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
      continue;
    }
    out += static_cast<char>(c);
  }
  return out + "\", \"errno\": " + std::to_string(err) + "}";
}

struct Failed {
  aclError code;
  std::string json;
};

// The real uid of process pid, or -1.
long uid_of(int pid) {
  struct stat st {};
  const std::string proc = "/proc/" + std::to_string(pid);
  return ::stat(proc.c_str(), &st) == 0 ? static_cast<long>(st.st_uid) : -1;
}

// One connection to the daemon for a transfer about client pid. The daemon must be run by root, by
// us, or by the client's owner: anyone else's daemon could hand us files or lie about the device.
class Tool {
 public:
  Tool(const char *socketPath, int pid) : socket_(socketPath), pid_(pid) {
    fd_ = wire::connect_unix(socketPath);
    if (fd_ < 0)
      throw Failed{ACL_ERROR_RT_DRV_INTERNAL_ERROR,
                   error_json(std::string("no npusim daemon answers on ") + socketPath + ": " + std::strerror(-fd_))};
    uid_t uid = 0;
    if (!wire::peer_cred(fd_, nullptr, &uid, nullptr) ||
        (uid != 0 && uid != ::geteuid() && static_cast<long>(uid) != uid_of(pid)))
      throw Failed{ACL_ERROR_RT_NO_PERMISSION,
                   error_json(std::string("the daemon on ") + socketPath + " runs as uid " + std::to_string(uid) +
                              ", neither root nor the owner of process " + std::to_string(pid) + ": not trusted")};
  }
  ~Tool() { ::close(fd_); }
  // Sends op with body and fds; returns the reply's code and payload.
  aclError call(proto::Op op, const std::string &body, const std::vector<int> &fds, std::string *payload,
                uint32_t flags = 0, uint64_t value1 = 0) {
    proto::Request rq = wire::request(op);
    rq.flags = flags;
    rq.value[0] = static_cast<uint64_t>(pid_);
    rq.value[1] = value1;
    rq.size = body.size();
    proto::Reply rp{};
    const bool ok = wire::send_all(fd_, &rq, sizeof(rq)) &&
                    (body.empty() || wire::send_with_fds(fd_, body.data(), body.size(), fds)) &&
                    wire::recv_all(fd_, &rp, sizeof(rp)) &&
                    (payload->resize(rp.payload_len),
                     rp.payload_len == 0 || wire::recv_all(fd_, payload->data(), payload->size()));
    if (!ok)
      throw Failed{ACL_ERROR_RT_SOCKET_CLOSE, error_json("the npusim daemon on " + socket_ +
                                                         " closed the connection (did it exit, or refuse us?)")};
    return rp.code;
  }

 private:
  std::string socket_;
  int pid_;
  int fd_ = -1;
};

// Descriptors we opened, closed on every path.
struct Opened {
  std::vector<int> fds;
  ~Opened() {
    for (int fd : fds) ::close(fd);
  }
};

int open_dir(const char *dir) {
  int fd = ::open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Failed{ACL_ERROR_INVALID_PARAM, error_json(std::string("cannot open ") + dir + ": " + std::strerror(errno), errno)};
  return fd;
}

// Export: ask which devices the client uses, create one fresh file per device (O_EXCL, no links
// followed: we never write into a file someone planted), and let the daemon fill them.
// With a parent directory, its devN.img files go along (read only, no links followed) for the
// devices that have one: the daemon writes only what changed since that export.
// NPUSIM_EXPORT_SNAPSHOT: the files come from the client's snapshot (export.h), dir NULL: it ends.
aclError do_export(const char *socketPath, int pid, const char *dir, const char *parent, unsigned flags,
                   std::string *json) {
  Tool tool(socketPath, pid);
  const uint32_t from = (flags & NPUSIM_EXPORT_SNAPSHOT) ? proto::kExportFromSnapshot : 0;
  if (from != 0 && dir == nullptr) return tool.call(proto::Op::Export, "", {}, json, proto::kExportDropSnapshot);
  std::string devices;
  if (aclError rc = tool.call(proto::Op::ExportDevices, "", {}, &devices, from); rc != ACL_SUCCESS) {
    *json = devices;
    return rc;
  }
  Opened d;
  d.fds.push_back(open_dir(dir));
  std::istringstream in(devices);
  std::vector<std::string> names;
  Opened files;
  unsigned device = 0;
  auto undo = [&] {
    for (auto &n : names) ::unlinkat(d.fds[0], n.c_str(), 0);
  };
  while (in >> device) {
    std::string name = "dev" + std::to_string(device) + ".img";
    int fd = ::openat(d.fds[0], name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      const int err = errno;
      undo();
      throw Failed{ACL_ERROR_SNAPSHOT_BACKUP_FAILED,
                   error_json("cannot create " + std::string(dir) + "/" + name + ": " + std::strerror(err), err)};
    }
    names.push_back(name);
    files.fds.push_back(fd);
  }
  if (files.fds.size() * 2 > wire::kMaxFds) {  // room for a parent's files too
    undo();
    throw Failed{ACL_ERROR_SNAPSHOT_BACKUP_FAILED, error_json("the client uses more devices than one export carries")};
  }
  std::string request = devices;
  if (parent != nullptr) {
    Opened p;
    p.fds.push_back(open_dir(parent));
    std::istringstream again(devices);
    request += "\nparent";
    while (again >> device) {
      const std::string name = "dev" + std::to_string(device) + ".img";
      int fd = ::openat(p.fds[0], name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0 && errno == ENOENT) continue;  // no memory on that device then: written in full
      if (fd < 0) {
        const int err = errno;
        undo();
        throw Failed{ACL_ERROR_SNAPSHOT_BACKUP_FAILED,
                     error_json("cannot open " + std::string(parent) + "/" + name + ": " + std::strerror(err), err)};
      }
      files.fds.push_back(fd);
      request += " " + std::to_string(device);
    }
  }
  if (flags & NPUSIM_EXPORT_KEEP) request += (parent != nullptr ? " keep" : "\nkeep");
  aclError rc;
  try {
    rc = tool.call(proto::Op::Export, request, files.fds, json,
                   ((flags & NPUSIM_EXPORT_NO_SYNC) ? proto::kExportNoSync : 0) | from);
  } catch (...) {
    undo();
    throw;
  }
  if (rc != ACL_SUCCESS) {
    undo();  // the daemon emptied them; never leave a partial image behind
    return rc;
  }
  if ((flags & NPUSIM_EXPORT_NO_SYNC) == 0 && ::fsync(d.fds[0]) != 0) {
    const int err = errno;
    undo();
    throw Failed{ACL_ERROR_SNAPSHOT_BACKUP_FAILED,
                 error_json(std::string("flushing ") + dir + ": " + std::strerror(err), err)};
  }
  return rc;
}

// Import: open the expected files (or every devN.img) ourselves, without following links, and send
// them: the daemon reads only what we could read.
// mode: the request's first line ("! lazy\n", "! ahead START\n", "! if-due\n"; export.cpp), or "".
aclError do_import(const char *socketPath, int pid, const char *dir, const char *expected, const char *ancestors,
                   std::string *json, const std::string &mode = "") {
  Tool tool(socketPath, pid);
  Opened d;
  d.fds.push_back(open_dir(dir));
  std::vector<std::string> lines;
  if (expected != nullptr) {
    std::istringstream in(expected);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) lines.push_back(line);
  } else {
    DIR *dp = ::fdopendir(::dup(d.fds[0]));
    if (dp == nullptr) throw Failed{ACL_ERROR_SNAPSHOT_RESTORE_FAILED, error_json(std::string("cannot list ") + dir, errno)};
    while (dirent *e = ::readdir(dp)) {
      std::string n = e->d_name;
      if (n.rfind("dev", 0) == 0 && n.size() > 7 && n.compare(n.size() - 4, 4, ".img") == 0) lines.push_back(n);
    }
    ::closedir(dp);
    std::sort(lines.begin(), lines.end());
  }
  if (lines.size() > wire::kMaxFds)
    throw Failed{ACL_ERROR_SNAPSHOT_RESTORE_FAILED, error_json("more device images than one import carries")};
  std::vector<std::string> chain;
  if (ancestors != nullptr) {
    std::istringstream in(ancestors);
    for (std::string a; std::getline(in, a);)
      if (!a.empty()) chain.push_back(a);
  }
  Opened chain_dirs;
  for (auto &a : chain) chain_dirs.fds.push_back(open_dir(a.c_str()));
  Opened files;
  std::string body = mode;
  for (auto &line : lines) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.empty() || name.find('/') != std::string::npos)
      throw Failed{ACL_ERROR_INVALID_PARAM, error_json("malformed expected-file line: " + line, EINVAL)};
    int fd = ::openat(d.fds[0], name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
      const int err = errno;
      throw Failed{ACL_ERROR_SNAPSHOT_RESTORE_FAILED,
                   error_json("cannot open " + std::string(dir) + "/" + name + ": " + std::strerror(err), err)};
    }
    files.fds.push_back(fd);
    body += line + "\n";
    // Its ancestors' files, parent first, up to the first that lacks this device (nothing older
    // can be referenced through it).
    for (size_t k = 0; k < chain.size(); ++k) {
      int afd = ::openat(chain_dirs.fds[k], name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (afd < 0 && errno == ENOENT) break;
      if (afd < 0) {
        const int err = errno;
        throw Failed{ACL_ERROR_SNAPSHOT_RESTORE_FAILED,
                     error_json("cannot open " + chain[k] + "/" + name + ": " + std::strerror(err), err)};
      }
      files.fds.push_back(afd);
      body += "^ " + chain[k] + "/" + name + "\n";
    }
  }
  if (files.fds.size() > wire::kMaxFds)
    throw Failed{ACL_ERROR_SNAPSHOT_RESTORE_FAILED, error_json("the chain of device images is longer than one import carries")};
  return tool.call(proto::Op::Import, body, files.fds, json);
}

aclError transfer(char **resultJson, const std::function<aclError(std::string *)> &fn) {
  if (resultJson == nullptr) return ACL_ERROR_INVALID_PARAM;
  *resultJson = nullptr;
  std::string json;
  aclError rc;
  try {
    rc = fn(&json);
  } catch (const Failed &f) {
    rc = f.code;
    json = f.json;
  } catch (const std::bad_alloc &) {
    return ACL_ERROR_BAD_ALLOC;
  }
  *resultJson = dup_string(json);
  return rc;
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
  return (rt::data_path().next_external ? NPUSIM_DATA_PATH_NEXT_EXTERNAL : 0) |
         (rt::data_path().backup_external ? NPUSIM_DATA_PATH_HELD_EXTERNAL : 0);
}

aclError npusimDaemonExport(const char *socketPath, int pid, const char *dir, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) { return do_export(socketPath, pid, dir, nullptr, 0, json); });
}

aclError npusimDaemonExportIncremental(const char *socketPath, int pid, const char *dir, const char *parentDir,
                                       char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) { return do_export(socketPath, pid, dir, parentDir, 0, json); });
}

aclError npusimDaemonExportFlags(const char *socketPath, int pid, const char *dir, const char *parentDir,
                                 unsigned flags, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || (dir == nullptr && (flags & NPUSIM_EXPORT_SNAPSHOT) == 0) ||
      (flags & ~(NPUSIM_EXPORT_NO_SYNC | NPUSIM_EXPORT_KEEP | NPUSIM_EXPORT_SNAPSHOT)) != 0)
    return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) { return do_export(socketPath, pid, dir, parentDir, flags, json); });
}

aclError npusimDaemonSnapshot(const char *socketPath, int pid, unsigned long long capBytes, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) {
    Tool tool(socketPath, pid);
    std::string devices;
    if (aclError rc = tool.call(proto::Op::ExportDevices, "", {}, &devices); rc != ACL_SUCCESS) {
      *json = devices;
      return rc;
    }
    return tool.call(proto::Op::Export, devices + "\nkeep", {}, json, proto::kExportSnapshot, capBytes);
  });
}

aclError npusimDaemonImport(const char *socketPath, int pid, const char *dir, const char *expected, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) { return do_import(socketPath, pid, dir, expected, nullptr, json); });
}

aclError npusimDaemonImportChain(const char *socketPath, int pid, const char *dir, const char *expected,
                                 const char *ancestors, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson,
                  [&](std::string *json) { return do_import(socketPath, pid, dir, expected, ancestors, json); });
}

aclError npusimDaemonImportLazy(const char *socketPath, int pid, const char *dir, const char *expected,
                                const char *ancestors, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) {
    return do_import(socketPath, pid, dir, expected, ancestors, json, "! lazy\n");
  });
}

aclError npusimDaemonImportAhead(const char *socketPath, int pid, unsigned long long startTime, const char *dir,
                                 const char *expected, const char *ancestors, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || startTime == 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  const std::string mode = "! ahead " + std::to_string(startTime) + "\n";
  return transfer(resultJson,
                  [&](std::string *json) { return do_import(socketPath, pid, dir, expected, ancestors, json, mode); });
}

aclError npusimDaemonImportIfDue(const char *socketPath, int pid, const char *dir, const char *expected,
                                 const char *ancestors, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || dir == nullptr) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) {
    return do_import(socketPath, pid, dir, expected, ancestors, json, "! if-due\n");
  });
}

aclError npusimDaemonLazyStatus(const char *socketPath, int pid, int waitMs, char **resultJson) {
  if (resultJson != nullptr) *resultJson = nullptr;
  if (socketPath == nullptr || pid <= 0 || waitMs < 0) return ACL_ERROR_INVALID_PARAM;
  return transfer(resultJson, [&](std::string *json) {
    Tool tool(socketPath, pid);
    return tool.call(proto::Op::LazyStatus, "", {}, json, 0, static_cast<uint64_t>(waitMs));
  });
}

}  // extern "C"

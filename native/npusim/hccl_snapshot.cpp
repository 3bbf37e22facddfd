// HCCL communicators across a snapshot: the resource kind "hccl communicators" (order 45, after
// memory and streams).
//
// Lock (the free pass): a locked rank still admits the collectives up to the highest sequence
// number any rank of the communicator issued, so that no peer waits forever for this rank's part
// of a collective it already entered. Each poll of the lock reports this rank's issued count to
// the communicator's root daemon (hccl_root.cpp), which answers with that highest number and
// whether every rank is locking. While some communicator is behind, the process runs on (every
// call passes the gate) until it issued that collective; then the gate closes. The lock is done
// once no communicator is behind, every rank of each is locking (all ranks are checkpointed as
// one set; `npusimHcclSnapshotOption("alone", "1")` drops this for a rank checkpointed without
// its peers, and keeps the pass of the lock's first report: peers that run on would otherwise pull
// the rank along forever), no call is in flight and the queued work drained. A rank that cannot get there (a
// peer stopped before the collective, an application that waits for something outside the device
// before issuing it) ends in the lock timeout, back to RUNNING, with its report withdrawn. A broken
// communicator (a rank left it without being locked: its process died; or this rank's member
// failed) can never let the lock complete: the lock refuses at once, back to RUNNING, naming it
// (ACL_ERROR_SNAPSHOT_LOCK_FAILED); a lock alone (--force) goes on without it.
//
// Send/Recv are matched per pair, not numbered: a Send is done once the root holds its data. So
// the free pass covers them per pair: each poll asks the root how many Sends each peer made to
// this rank and how many Recvs it posted for this rank's data; while those outnumber this rank's
// Recvs from (Sends to) that peer, its Recvs (Sends), and every call but collectives on the way to
// them, pass the gate. A pass only answers an operation the peer already issued, never creates a
// debt of its own, so this ends. After the drain the lock asks whether the root
// still holds a Send to or from this rank (data that leaving the root at Backup would lose): if so
// it polls on and drains again, until the deadline.
//
// Backup: the table (hccl_comms.h) is process memory and travels with the process; the daemon's
// Release closes the members, so nothing inter-rank stays open.
//
// The fate of a lock, once a rank is locked: its ranks (on one node or several) either all leave
// their communicators and re-form them (Backup, then Restore) or all stay in them (Unlock). A
// rank whose checkpoint is aborted cannot know what its peers on other nodes did: some may have
// backed up already (left), others be let go at once (a worker killed after the lock, its guardian
// unlocking them). So the first to act decides, atomically, in the rendezvous directory that
// npusnap hands every rank of the attempt before its lock: a file `hccl-fate` created by link(2),
// "reform" by the first Backup, "unlock" by the first rank let go without one (Unlock while
// LOCKED, or a lock that failed). A Backup that finds "unlock" is refused (the rank stays LOCKED
// and its rollback unlocks it); a rank let go that finds "reform" leaves its communicators and
// re-forms them through the rendezvous directory right there, with the peers that back up and
// restore. Without a rendezvous directory (one process checkpointed alone) nothing changes.
//
// Restore: each communicator is re-formed under its old id at new addresses, in id order on every
// rank: rank 0's daemon becomes the root (any free port, a new secret) and rank 0 publishes where it
// is in the rendezvous directory that npusnap hands the restoring runtimes
// (`npusimHcclSnapshotOption("rendezvous", DIR)`); the other ranks wait there (their connect
// timeout) and join. The members start at the saved sequence numbers, so the next collective is
// k+1 on every rank, and the application's HcclComm handles stay the same objects. A communicator
// locked alone (its peers not checkpointed) that cannot be re-formed does not fail the restore: the
// process comes back (a rollback must always bring it back) and that communicator's next call fails.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "acl/npusim.h"
#include "hccl/hccl_types.h"
#include "hccl_bridge.h"
#include "hccl_comms.h"
#include "hccl_wire.h"
#include "resources.h"
#include "runtime.h"
#include "trust.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr auto kRendezvousPoll = std::chrono::milliseconds(20);
constexpr const char *kRootFileMagic = "npusim-hccl-root-v1";

struct Options {
  std::string rendezvous;  // "" until npusnap hands one (a restore of a set)
  bool alone = false;      // lock without waiting for the peers to lock
};

Options &options() {  // guarded by runtime().mu
  static auto *o = new Options;
  return *o;
}

std::vector<std::pair<const void *, CommEntry>> snapshot_table() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return {hccl_comms().begin(), hccl_comms().end()};
}

std::string comm_name(const CommEntry &c) {
  char b[96];
  std::snprintf(b, sizeof(b), "HCCL communicator %016" PRIx64 " (rank %u of %u)", c.id, c.rank, c.nranks);
  return b;
}

constexpr const char *kFateFile = "/hccl-fate";
constexpr const char *kReform = "reform";
constexpr const char *kUnlock = "unlock";

// Whether this process's lock binds peers (a communicator of several ranks, not locked alone), and
// where the attempt's ranks meet ("" when npusnap handed no rendezvous directory).
std::string fate_dir() {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (options().alone || options().rendezvous.empty()) return "";
  for (auto &[handle, c] : hccl_comms())
    if (c.nranks > 1 && !c.left_alone) return options().rendezvous;
  return "";
}

// The attempt's fate: `want` if this rank is the first to decide, else what a peer decided; ""
// when it cannot be known (no trusted directory: as before the fate existed, each rank on its own).
std::string claim_fate(const std::string &dir, const char *want) {
  std::string why;
  if (dir.empty() || !trust::dir_trusted(dir, ::geteuid(), &why)) return "";
  const std::string path = dir + kFateFile, tmp = dir + "/.hccl-fate-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const size_t n = std::strlen(want);
  const bool written = fd >= 0 && ::write(fd, want, n) == static_cast<ssize_t>(n);
  if (fd >= 0) ::close(fd);
  const bool first = written && ::link(tmp.c_str(), path.c_str()) == 0;  // atomic: one rank wins
  ::unlink(tmp.c_str());
  if (first) return want;
  char buf[16] = {};
  const int in = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (in < 0) return "";
  const ssize_t got = ::read(in, buf, sizeof(buf) - 1);
  ::close(in);
  return got > 0 ? std::string(buf, static_cast<size_t>(got)) : "";
}

int32_t lock_query(const CommEntry &c, uint32_t flags, uint64_t value, proto::Reply *rp) {
  proto::Request rq = wire::request(proto::Op::HcclLockQuery);
  rq.value[0] = c.member;
  rq.value[1] = value;
  rq.flags = flags;
  return runtime().pool.call(rq, rp);
}

int32_t lock_query(const CommEntry &c, uint32_t flags, proto::Reply *rp) { return lock_query(c, flags, c.seq, rp); }

std::string root_file(const std::string &dir, uint64_t id) {
  char name[40];
  std::snprintf(name, sizeof(name), "/hccl-%016" PRIx64 ".root", id);
  return dir + name;
}

// Rank 0 publishes its root: a private file written whole, then renamed into place.
bool publish_root(const std::string &dir, const hccl::RootBlob &b, std::string *why) {
  char ip[INET_ADDRSTRLEN] = "";
  in_addr a{b.ipv4};
  ::inet_ntop(AF_INET, &a, ip, sizeof(ip));
  std::string line = std::string(kRootFileMagic) + " ";
  char head[64];
  std::snprintf(head, sizeof(head), "%016" PRIx64 " %s %u ", b.comm_id, ip, b.port);
  line += head;
  for (uint8_t byte : b.secret) {
    char h[3];
    std::snprintf(h, sizeof(h), "%02x", byte);
    line += h;
  }
  line += "\n";
  const std::string path = root_file(dir, b.comm_id), tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  const bool ok = fd >= 0 && ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  if (fd >= 0) ::close(fd);
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot write " + path + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  }
  return true;
}

// Reads rank 0's root for communicator id; false while it is not there (yet).
bool read_root(const std::string &dir, uint64_t id, hccl::RootBlob *b) {
  const int fd = ::open(root_file(dir, id).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[256] = {};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return false;
  char magic[32] = "", ip[INET_ADDRSTRLEN] = "", secret[65] = "";
  uint64_t got = 0;
  unsigned port = 0;
  if (std::sscanf(buf, "%31s %" SCNx64 " %15s %u %64s", magic, &got, ip, &port, secret) != 5 ||
      std::strcmp(magic, kRootFileMagic) != 0 || got != id || port == 0 || port > 65535 ||
      std::strlen(secret) != 64)
    return false;
  in_addr a{};
  if (::inet_pton(AF_INET, ip, &a) != 1) return false;
  std::memcpy(b->magic, hccl::kRootMagic, sizeof(b->magic));
  b->ipv4 = a.s_addr;
  b->port = static_cast<uint16_t>(port);
  b->comm_id = id;
  for (int i = 0; i < 32; ++i) {
    unsigned v = 0;
    if (std::sscanf(secret + 2 * i, "%2x", &v) != 1) return false;
    b->secret[i] = static_cast<uint8_t>(v);
  }
  return true;
}

// Re-forms one communicator on the daemon now connected; the new member id in *member.
int32_t reform(const CommEntry &c, const std::string &dir, uint64_t *member, std::string *why) {
  Runtime &r = runtime();
  hccl::RootBlob b{};
  if (c.nranks > 1 && dir.empty()) {
    *why = "no rendezvous point to meet its peers (restore every rank of the communicator with one "
           "`npusnap restore`)";
    return HCCL_E_PARA;
  }
  if (c.nranks > 1 && !trust::dir_trusted(dir, ::geteuid(), why)) return HCCL_E_PARA;
  if (c.rank == 0) {
    if (::getrandom(b.secret, sizeof(b.secret), 0) != static_cast<ssize_t>(sizeof(b.secret))) return HCCL_E_SYSCALL;
    proto::Request rq = wire::request(proto::Op::HcclRootInfo);
    rq.value[1] = c.id;
    rq.size = sizeof(b.secret);
    proto::Reply rp{};
    const std::string secret(reinterpret_cast<const char *>(b.secret), sizeof(b.secret));
    if (int32_t rc = r.pool.call(rq, &rp, &secret); rc != HCCL_SUCCESS) {
      *why = "its new root daemon refused (HcclResult " + std::to_string(rc) + ")";
      return rc;
    }
    std::memcpy(b.magic, hccl::kRootMagic, sizeof(b.magic));
    b.comm_id = c.id;
    b.port = static_cast<uint16_t>(rp.value[1]);
    b.ipv4 = static_cast<uint32_t>(rp.value[2]);
    if (c.nranks > 1 && !publish_root(dir, b, why)) return HCCL_E_OPEN_FILE_FAILURE;
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(c.connect_ms);
    while (!read_root(dir, c.id, &b)) {
      if (std::chrono::steady_clock::now() >= deadline) {
        *why = "rank 0 did not publish its root in " + dir + " within HCCL_CONNECT_TIMEOUT (" +
               std::to_string(c.connect_ms / 1000) + " s)";
        return HCCL_E_TIMEOUT;
      }
      std::this_thread::sleep_for(kRendezvousPoll);
    }
  }
  proto::Request rq = wire::request(proto::Op::HcclCommInit);
  rq.device = c.device;
  rq.value[0] = c.nranks;
  rq.value[1] = c.rank;
  rq.timeout_ms = c.connect_ms;
  rq.addr = static_cast<uint64_t>(c.exec_ms);
  rq.task.target = c.seq;
  rq.size = sizeof(b);
  proto::Reply rp{};
  const std::string body(reinterpret_cast<const char *>(&b), sizeof(b));
  if (int32_t rc = r.pool.call(rq, &rp, &body); rc != HCCL_SUCCESS) {
    *why = rc == HCCL_E_TIMEOUT ? "not every rank rejoined within HCCL_CONNECT_TIMEOUT"
                                : "rejoining failed (HcclResult " + std::to_string(rc) + ")";
    return rc;
  }
  *member = rp.value[0];
  return HCCL_SUCCESS;
}

int32_t restore_comms(const SnapshotPass &) {
  auto table = snapshot_table();
  std::sort(table.begin(), table.end(), [](auto &a, auto &b) { return a.second.id < b.second.id; });  // same order on every rank
  std::string dir;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    dir = options().rendezvous;
  }
  for (auto &[handle, c] : table) {
    uint64_t member = 0;
    std::string why;
    if (reform(c, dir, &member, &why) != HCCL_SUCCESS) {
      note_error("snapshot: cannot re-form " + comm_name(c) + ": " + why);
      if (!c.left_alone) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
      std::fprintf(stderr, "npusim hccl: %s was checkpointed without its peers and cannot be re-formed (%s): "
                   "its next call fails\n", comm_name(c).c_str(), why.c_str());
      member = 0;  // no member: the daemon refuses its collectives (HCCL_E_PARA)
    }
    std::lock_guard<std::mutex> g(runtime().mu);
    if (auto it = hccl_comms().find(handle); it != hccl_comms().end()) {
      it->second.member = member;
      std::fill(it->second.recvd.begin(), it->second.recvd.end(), 0);  // the new root counts from 0
      std::fill(it->second.sent.begin(), it->second.sent.end(), 0);
    }
  }
  std::lock_guard<std::mutex> g(runtime().mu);
  options().rendezvous.clear();  // one restore's meeting point: a later one gets its own
  return ACL_SUCCESS;
}

// Backup: leaving the communicators is this rank's part of "reform"; refused once a peer was let go.
int32_t leave_comms(const SnapshotPass &) {
  const std::string dir = fate_dir();
  if (dir.empty() || claim_fate(dir, kReform) != kUnlock) return ACL_SUCCESS;
  note_error("snapshot: backup refused: a peer rank of this process's HCCL communicators was unlocked "
             "without a backup (its checkpoint was aborted), so this rank stays in them");
  return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
}

// A rank let go while its peers re-form: it leaves its members and re-forms as a restore does.
void rejoin_comms() {
  for (auto &[handle, c] : snapshot_table()) {
    proto::Request rq = wire::request(proto::Op::HcclCommDestroy);
    rq.value[0] = c.member;
    runtime().pool.call(rq);  // the root sees this rank leave the old communicator
  }
  if (restore_comms(SnapshotPass{}) != ACL_SUCCESS)
    std::fprintf(stderr, "npusim hccl: could not re-form this rank's communicators with its peers: %s\n",
                 recent_error().c_str());
}

const ResourceKind kCommunicators{"hccl communicators", 45, nullptr, leave_comms, restore_comms, nullptr,
                                  [] { return hccl_comms().size(); }};
NPUSIM_RESOURCE_KIND(kCommunicators);

}  // namespace

namespace npusim::rt {

void hccl_lock_poll(bool *ready, std::string *waiting, std::string *refused) {
  auto table = snapshot_table();
  bool alone, all = true;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    alone = options().alone;
  }
  waiting->clear();
  for (auto &[handle, c] : table) {
    proto::Reply rp{};
    const int32_t rc = lock_query(c, hccl::kLockReport, &rp);
    std::lock_guard<std::mutex> g(runtime().mu);
    auto it = hccl_comms().find(handle);
    if (it == hccl_comms().end()) continue;  // destroyed meanwhile
    CommEntry &cur = it->second;
    if (rc == HCCL_E_REMOTE && alone) continue;  // --force: nothing to wait for; its next call fails
    if (rc == HCCL_E_REMOTE) {  // broken: no peer can ever let this lock complete
      all = false;
      *refused = comm_name(cur) + " is broken: " +
                 (rp.value[2] > 0 ? "rank " + std::to_string(rp.value[2] - 1) +
                                        " left it without being locked (its process exited or destroyed it)"
                                  : std::string("a collective of this rank failed (a peer exited)")) +
                 " (HcclResult " + std::to_string(rc) + ")";
      continue;
    }
    if (rc != HCCL_SUCCESS) {
      all = false;
      *waiting = comm_name(cur) + ": its root daemon does not answer (HcclResult " + std::to_string(rc) + ")";
      continue;
    }
    if (!cur.pass_fixed) cur.pass = std::max(cur.pass, rp.value[0]);
    cur.pass_fixed = alone;
    if (cur.seq < cur.pass) {
      all = false;
      *waiting = comm_name(cur) + ": this rank issued " + std::to_string(cur.seq) + " collectives, a peer " +
                 std::to_string(cur.pass) + "; it did not reach the peers' collective";
    } else if (rp.value[1] == 0 && !alone) {
      all = false;
      *waiting = comm_name(cur) + ": not every rank is being locked (checkpoint all ranks as one set)";
    }
  }
  // The Recvs' free pass: a peer's Sends to this rank that reached the root wait for its Recvs.
  for (auto &[handle, c] : table) {
    if (alone || c.nranks < 2) continue;
    for (uint32_t p = 0; p < c.nranks; ++p) {
      if (p == c.rank) continue;
      proto::Reply sends{}, recvs{};
      if (lock_query(c, hccl::kLockMail, p + 1, &sends) != HCCL_SUCCESS ||
          lock_query(c, hccl::kLockRecvs, p + 1, &recvs) != HCCL_SUCCESS)
        continue;  // reported above
      std::lock_guard<std::mutex> g(runtime().mu);
      auto it = hccl_comms().find(handle);
      if (it == hccl_comms().end() || p >= it->second.recv_pass.size() || p >= it->second.send_pass.size()) continue;
      CommEntry &cur = it->second;
      cur.recv_pass[p] = std::max(cur.recv_pass[p], sends.value[0]);
      cur.send_pass[p] = std::max(cur.send_pass[p], recvs.value[0]);
      if (cur.recvd[p] < cur.recv_pass[p]) {
        all = false;
        *waiting = comm_name(cur) + ": rank " + std::to_string(p) + " sent it " + std::to_string(cur.recv_pass[p]) +
                   " HcclSend(s), it issued " + std::to_string(cur.recvd[p]) + " HcclRecv(s) from that rank";
      } else if (cur.sent[p] < cur.send_pass[p]) {
        all = false;
        *waiting = comm_name(cur) + ": rank " + std::to_string(p) + " posted " + std::to_string(cur.send_pass[p]) +
                   " HcclRecv(s) from it, it issued " + std::to_string(cur.sent[p]) + " HcclSend(s) to that rank";
      }
    }
  }
  std::lock_guard<std::mutex> g(runtime().mu);
  hccl_update_behind();
  runtime().gate_cv.notify_all();
  *ready = all;
}

bool hccl_lock_mail(std::string *waiting) {
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (options().alone) return true;  // its peers run on: their Sends and Recvs are theirs
  }
  for (auto &[handle, c] : snapshot_table()) {
    if (c.nranks < 2) continue;
    proto::Reply rp{};
    const int32_t rc = lock_query(c, hccl::kLockMail, 0, &rp);
    if (rc == HCCL_SUCCESS && rp.value[0] == 0) continue;
    *waiting = comm_name(c) + ": " +
               (rc != HCCL_SUCCESS ? "its root daemon does not answer (HcclResult " + std::to_string(rc) + ")"
                                   : std::to_string(rp.value[0]) + " HcclSend(s) between this rank and rank " +
                                         std::to_string(rp.value[1]) + " not received by an HcclRecv");
    return false;
  }
  return true;
}

void hccl_lock_end(bool withdraw) {
  if (withdraw && claim_fate(fate_dir(), kUnlock) == kReform) rejoin_comms();  // see "The fate of a lock"
  if (withdraw)
    for (auto &[handle, c] : snapshot_table()) {
      proto::Reply rp{};
      lock_query(c, hccl::kLockWithdraw, &rp);  // best effort: a root that is gone counts nobody
    }
  std::lock_guard<std::mutex> g(runtime().mu);
  for (auto &[handle, c] : hccl_comms()) {
    c.pass = 0;
    std::fill(c.recv_pass.begin(), c.recv_pass.end(), 0);
    std::fill(c.send_pass.begin(), c.send_pass.end(), 0);
    c.pass_fixed = false;
    c.left_alone = !withdraw && options().alone;  // a lock that stands, taken alone
  }
  hccl_update_behind();
  options().alone = false;  // for one lock
  runtime().gate_cv.notify_all();
}

std::string hccl_describe() {
  std::string out = "[";
  for (auto &[handle, c] : hccl_comms()) {
    char b[224];
    std::snprintf(b, sizeof(b), "%s{\"id\": \"%016" PRIx64 "\", \"rank\": %u, \"ranks\": %u, \"seq\": %" PRIu64
                  ", \"origin\": \"%s\"}", out.size() > 1 ? ", " : "", c.id, c.rank, c.nranks, c.seq,
                  c.origin == NPUSIM_HCCL_ORIGIN_RANK_TABLE ? "rank table" : "root info");
    out += b;
  }
  return out + "]";
}

}  // namespace npusim::rt

extern "C" {

// acl/npusim.h; the agent passes npusnap's settings on (`hccl KEY VALUE`).
int npusimHcclSnapshotOption(const char *key, const char *value) {
  if (key == nullptr || value == nullptr) return ACL_ERROR_INVALID_PARAM;
  if (std::strcmp(key, "socket") == 0) return npusimSnapShotUseDaemon(value);  // snapshot.cpp
  std::lock_guard<std::mutex> g(runtime().mu);
  if (std::strcmp(key, "rendezvous") == 0 && value[0] == '/') options().rendezvous = value;
  else if (std::strcmp(key, "alone") == 0 && (std::strcmp(value, "0") == 0 || std::strcmp(value, "1") == 0))
    options().alone = value[0] == '1';
  else
    return ACL_ERROR_INVALID_PARAM;
  return ACL_SUCCESS;
}

}  // extern "C"

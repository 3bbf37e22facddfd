// The root daemon of a communicator: one TCP listener for HCCL traffic, one thread per member
// connection. A member joins with the communicator's id and secret; the root answers once every
// rank joined (or the member's connect timeout passed). Then each Frame of collective k is held
// until every rank sent its part, the results are computed in rank order (hccl_reduce.h) and each
// rank gets its own. Send/Recv are matched in order per (sender, receiver) pair: a Send is done
// once the root holds its data, a Recv waits for it. A member whose connection drops has left: a
// step still missing its part fails (HCCL_E_REMOTE) instead of waiting forever.
//
// Snapshot: a rank being locked reports how many collectives its process issued (a one-shot
// connection, kLockMagic) and learns the free pass, the highest sequence number any rank issued
// (reported, or seen in a frame), and whether every rank is locking; see hccl_bridge.cpp. A rank
// that left without locking makes every report fail (HCCL_E_REMOTE): the lock refuses at once.
// A drained rank asks for the Sends to or from it that no Recv took (kLockMail): their data
// lives only here, and would be lost when the ranks leave at Backup.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hccl/hccl_types.h"
#include "hccl_daemon.h"
#include "hccl_reduce.h"
#include "hccl_wire.h"
#include "wire.h"

namespace npusim::hccl {
namespace {

constexpr uint32_t kMaxRanks = 4096;
constexpr uint64_t kMaxFrameBytes = 16ULL << 30;
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kLeaving = std::chrono::seconds(10);  // bound on register_comm's wait for locked ranks to leave

enum RankState : uint8_t { kAbsent = 0, kJoined, kLeft };

struct Round {
  Frame head{};
  std::vector<std::string> in;
  std::vector<bool> have;
  uint32_t arrived = 0;
  bool done = false;
  int32_t error = HCCL_SUCCESS;
  std::vector<std::string> out;
  uint32_t fetched = 0;
};

struct Core {
  uint64_t id = 0;
  uint8_t secret[32]{};
  std::mutex mu;
  std::condition_variable cv;
  uint32_t nranks = 0;  // set by the first join
  std::vector<uint8_t> ranks;
  uint32_t joined = 0;
  bool formed = false;
  std::map<uint64_t, Round> rounds;
  std::map<std::pair<uint32_t, uint32_t>, std::deque<std::string>> mail;  // (from, to)
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> sends;  // (from, to): Sends that reached the root
  std::map<std::pair<uint32_t, uint32_t>, uint64_t> recvs;  // (from, to): Recvs that reached the root
  uint64_t seen = 0;                // the highest sequence number a frame carried
  std::vector<uint64_t> reported;   // per rank: collectives its process issued, as its lock reported
  std::vector<bool> locking;        // per rank: reported and not withdrawn
};

struct Root {
  std::mutex mu;
  int fd = -1;
  uint32_t ipv4 = htonl(INADDR_LOOPBACK);
  uint16_t port = 0;
  std::map<uint64_t, std::shared_ptr<Core>> comms;
};

Root &root() {
  static Root *r = new Root;  // never destroyed: connection threads outlive main's return
  return *r;
}

bool same_secret(const uint8_t *a, const uint8_t *b) {  // constant time
  uint8_t diff = 0;
  for (int i = 0; i < 32; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

std::string peer_name(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  char ip[INET_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) == 0) ::inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
  return std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
}

// While a member waits for its answer it sends nothing: readable means it hung up (or broke the protocol).
bool hung_up(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

bool needs_missing_rank(const Core &c, const Round &r) {
  for (uint32_t i = 0; i < c.nranks; ++i)
    if (!r.have[i] && c.ranks[i] == kLeft) return true;
  return false;
}

bool same_step(const Frame &a, const Frame &b) {
  if (a.kind != b.kind || a.count != b.count || a.dtype != b.dtype) return false;
  const bool reduces = a.kind == kAllReduce || a.kind == kReduce || a.kind == kReduceScatter;
  const bool rooted = a.kind == kBroadcast || a.kind == kReduce;
  return (!reduces || a.op == b.op) && (!rooted || a.peer == b.peer);
}

// Every rank's result of a complete round.
void finish(Core &c, Round &r) {
  const Frame &h = r.head;
  const uint64_t es = dtype_size(h.dtype), n = c.nranks;
  r.out.assign(n, std::string());
  switch (h.kind) {
    case kAllReduce:
    case kReduce:
    case kReduceScatter: {
      std::string acc = r.in[0];
      for (uint32_t i = 1; i < n; ++i) fold(h.dtype, h.op, acc.data(), r.in[i].data(), acc.size() / es);
      if (h.kind == kAllReduce) r.out.assign(n, acc);
      else if (h.kind == kReduce) r.out[h.peer] = std::move(acc);
      else
        for (uint32_t i = 0; i < n; ++i) r.out[i] = acc.substr(i * h.count * es, h.count * es);
      break;
    }
    case kAllGather: {
      std::string all;
      for (uint32_t i = 0; i < n; ++i) all += r.in[i];
      r.out.assign(n, all);
      break;
    }
    case kBroadcast:
      for (uint32_t i = 0; i < n; ++i)
        if (i != h.peer) r.out[i] = r.in[h.peer];
      break;
    default: break;  // kBarrier: nothing to carry
  }
  r.in.clear();
  r.done = true;
}

// One collective step of rank `me`; returns the HcclResult and fills *out.
int32_t collective(Core &c, int fd, uint32_t me, const Frame &f, std::string &&data, std::string *out) {
  std::unique_lock<std::mutex> l(c.mu);
  c.seen = std::max(c.seen, f.seq);
  Round &r = c.rounds[f.seq];
  if (r.have.empty()) {
    r.head = f;
    r.have.assign(c.nranks, false);
    r.in.assign(c.nranks, std::string());
  } else if (r.have[me]) {
    return HCCL_E_PARA;  // the same sequence number twice
  } else if (!r.done && r.error == HCCL_SUCCESS && !same_step(r.head, f)) {
    std::fprintf(stderr, "npusimd: HCCL communicator %016llx: rank %u's collective %llu differs from its peers'\n",
                 static_cast<unsigned long long>(c.id), me, static_cast<unsigned long long>(f.seq));
    r.error = HCCL_E_PARA;
  }
  r.have[me] = true;
  if (!r.done) r.in[me] = std::move(data);
  if (++r.arrived == c.nranks && r.error == HCCL_SUCCESS) finish(c, r);
  c.cv.notify_all();
  while (!r.done && r.error == HCCL_SUCCESS) {
    if (needs_missing_rank(c, r)) {
      r.error = HCCL_E_REMOTE;
      c.cv.notify_all();
      break;
    }
    c.cv.wait_for(l, kPoll);
    if (!r.done && hung_up(fd)) return HCCL_E_REMOTE;
  }
  const int32_t rc = r.done ? HCCL_SUCCESS : r.error;
  if (r.done) *out = std::move(r.out[me]);
  if (++r.fetched == c.nranks) c.rounds.erase(f.seq);
  return rc;
}

int32_t point_to_point(Core &c, int fd, uint32_t me, const Frame &f, std::string &&data, std::string *out) {
  if (f.peer >= c.nranks || f.peer == me) return HCCL_E_PARA;
  std::unique_lock<std::mutex> l(c.mu);
  if (f.kind == kSend) {
    c.mail[{me, f.peer}].push_back(std::move(data));
    ++c.sends[{me, f.peer}];
    c.cv.notify_all();
    return HCCL_SUCCESS;
  }
  ++c.recvs[{f.peer, me}];
  auto &box = c.mail[{f.peer, me}];
  while (box.empty()) {
    if (c.ranks[f.peer] == kLeft) return HCCL_E_REMOTE;
    c.cv.wait_for(l, kPoll);
    if (box.empty() && hung_up(fd)) return HCCL_E_REMOTE;
  }
  if (box.front().size() != f.count * dtype_size(f.dtype)) return HCCL_E_PARA;  // Send and Recv disagree
  *out = std::move(box.front());
  box.pop_front();
  return HCCL_SUCCESS;
}

// Joins `me` to c; waits (bounded) until every rank joined.
int32_t join(Core &c, int fd, const JoinMsg &j) {
  std::unique_lock<std::mutex> l(c.mu);
  if (c.nranks == 0) {
    c.nranks = j.nranks;
    c.ranks.assign(j.nranks, kAbsent);
  }
  if (j.nranks != c.nranks || j.rank >= c.nranks) return HCCL_E_PARA;
  if (c.ranks[j.rank] != kAbsent) return HCCL_E_UNAVAIL;  // that rank is taken (or gone)
  c.ranks[j.rank] = kJoined;
  if (++c.joined == c.nranks) c.formed = true;
  c.cv.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(j.timeout_ms);
  while (!c.formed) {
    if (std::chrono::steady_clock::now() >= deadline || hung_up(fd)) {
      c.ranks[j.rank] = kAbsent;
      --c.joined;
      return HCCL_E_TIMEOUT;
    }
    c.cv.wait_for(l, kPoll);
  }
  return HCCL_SUCCESS;
}

void leave(Core &c, uint32_t me) {
  {
    std::lock_guard<std::mutex> g(c.mu);
    c.ranks[me] = kLeft;
    c.cv.notify_all();
    for (uint8_t st : c.ranks)
      if (st != kLeft) return;
  }
  std::lock_guard<std::mutex> g(root().mu);  // everyone left: the communicator is over
  auto it = root().comms.find(c.id);
  if (it != root().comms.end() && it->second.get() == &c) root().comms.erase(it);
}

// A locking rank's report (JoinMsg with kLockMagic, lock fields as hccl_wire.h says).
LockReply lock_report(Core &c, const JoinMsg &j) {
  std::lock_guard<std::mutex> g(c.mu);
  if (c.nranks == 0 || j.nranks != c.nranks || j.rank >= c.nranks) return {HCCL_E_PARA, 0, 0};
  if (c.reported.empty()) {
    c.reported.assign(c.nranks, 0);
    c.locking.assign(c.nranks, false);
  }
  if ((j.reserved == kLockMail || j.reserved == kLockRecvs) && j.timeout_ms > 0) {  // one peer's count
    const uint32_t peer = static_cast<uint32_t>(j.timeout_ms - 1);
    auto &counts = j.reserved == kLockMail ? c.sends : c.recvs;
    auto it = counts.find(j.reserved == kLockMail ? std::make_pair(peer, j.rank) : std::make_pair(j.rank, peer));
    return {HCCL_SUCCESS, 0, it == counts.end() ? 0 : it->second};
  }
  if (j.reserved == kLockMail) {
    LockReply rep{HCCL_SUCCESS, 0, 0};
    for (auto &[pair, box] : c.mail)
      if (!box.empty() && (pair.first == j.rank || pair.second == j.rank)) {
        rep.pass += box.size();
        rep.settled = pair.first == j.rank ? pair.second : pair.first;
      }
    return rep;
  }
  const uint64_t issued = static_cast<uint64_t>(j.timeout_ms);
  c.reported[j.rank] = std::max(c.reported[j.rank], issued);
  c.locking[j.rank] = j.reserved == kLockReport;
  LockReply rep{HCCL_SUCCESS, 1, c.seen};
  for (uint32_t i = 0; i < c.nranks; ++i) {
    rep.pass = std::max(rep.pass, c.reported[i]);
    if (!c.locking[i]) rep.settled = 0;
  }
  // A rank gone without being locked (its process exited or destroyed the communicator; a rank
  // that backs up leaves while locking) can never lock: this lock cannot complete.
  for (uint32_t i = 0; i < c.nranks; ++i)
    if (c.ranks[i] == kLeft && !c.locking[i]) return {HCCL_E_REMOTE, 0, i};
  c.cv.notify_all();
  return rep;
}

// NPUSIM_TEST_HCCL_LEAVE_MS (tests only): a member's closed connection is noticed this late, as on a
// loaded host where the thread serving it is not scheduled at once.
void late_leave() {
  static const long ms = [] {
    const char *env = std::getenv("NPUSIM_TEST_HCCL_LEAVE_MS");
    return env != nullptr ? std::max(0L, std::atol(env)) : 0L;
  }();
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

void serve_member(int fd) {
  timeval tv{5, 0};  // a join must arrive promptly; afterwards a member may stay quiet for long
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  JoinMsg j{};
  if (!wire::recv_all(fd, &j, sizeof(j)) || (j.magic != kJoinMagic && j.magic != kLockMagic) || j.nranks == 0 ||
      j.nranks > kMaxRanks) {
    ::close(fd);
    return;
  }
  std::shared_ptr<Core> c;
  {
    std::lock_guard<std::mutex> g(root().mu);
    auto it = root().comms.find(j.comm_id);
    if (it != root().comms.end()) c = it->second;
  }
  JoinReply rep{HCCL_E_NOT_FOUND, 0};
  if (c && !same_secret(c->secret, j.secret)) {
    // Same answer as an unknown id: a guesser learns nothing.
    std::fprintf(stderr, "npusimd: refused a join to HCCL communicator %016llx from %s: wrong secret\n",
                 static_cast<unsigned long long>(j.comm_id), peer_name(fd).c_str());
    c.reset();
  }
  if (j.magic == kLockMagic) {
    const LockReply lr = c ? lock_report(*c, j) : LockReply{HCCL_E_NOT_FOUND, 0, 0};
    wire::send_all(fd, &lr, sizeof(lr));
    ::close(fd);
    return;
  }
  if (c) rep.code = join(*c, fd, j);
  const bool joined = rep.code == HCCL_SUCCESS;
  if (!wire::send_all(fd, &rep, sizeof(rep)) || !joined) {
    if (joined) leave(*c, j.rank);
    ::close(fd);
    return;
  }
  tv = {0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Frame f{};
  while (wire::recv_all(fd, &f, sizeof(f))) {
    if (f.magic != kFrameMagic || f.bytes > kMaxFrameBytes) break;
    std::string data(f.bytes, '\0');
    if (f.bytes > 0 && !wire::recv_all(fd, data.data(), data.size())) break;
    std::string out;
    const int32_t rc = f.kind == kSend || f.kind == kRecv ? point_to_point(*c, fd, j.rank, f, std::move(data), &out)
                                                          : collective(*c, fd, j.rank, f, std::move(data), &out);
    Result res{rc, 0, out.size()};
    if (!wire::send_all(fd, &res, sizeof(res)) || !wire::send_all(fd, out.data(), out.size())) break;
    if (rc != HCCL_SUCCESS) break;  // the member gives the communicator up
  }
  late_leave();
  leave(*c, j.rank);
  ::close(fd);
}

// Binds the listener (root().mu held); the accept thread starts separately (a daemon binds
// before it forks into the background, and threads do not survive fork).
int32_t bind_listener(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = root().ipv4;
  a.sin_port = htons(port);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) != 0 || ::listen(fd, 128) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) {
    const int err = errno;
    std::fprintf(stderr, "npusimd: cannot listen for HCCL on port %u: %s\n", port, std::strerror(err));
    if (fd >= 0) ::close(fd);
    errno = err;
    return HCCL_E_TCP_CONNECT;
  }
  root().fd = fd;
  root().port = ntohs(a.sin_port);
  return HCCL_SUCCESS;
}

void accept_once() {  // root().mu held
  static bool accepting = false;
  if (accepting || root().fd < 0) return;
  accepting = true;
  const int fd = root().fd;
  std::thread([fd] {
    for (;;) {
      int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) std::thread(serve_member, c).detach();
      else if (errno != EINTR && errno != ECONNABORTED) std::this_thread::sleep_for(kPoll);
    }
  }).detach();
}

}  // namespace

bool configure(uint32_t ipv4, uint16_t port, std::string *why) {
  std::lock_guard<std::mutex> g(root().mu);
  root().ipv4 = ipv4;
  if (port == 0) return true;
  if (bind_listener(port) != HCCL_SUCCESS) {
    *why = "cannot listen for HCCL on port " + std::to_string(port) + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

int32_t listen_once(uint16_t want_port, uint32_t *ipv4, uint16_t *port) {
  std::lock_guard<std::mutex> g(root().mu);
  if (root().fd < 0) {
    if (int32_t rc = bind_listener(want_port); rc != HCCL_SUCCESS) return rc;
  } else if (want_port != 0 && want_port != root().port) {
    std::fprintf(stderr, "npusimd: HCCL listens on port %u, not %u (HCCL_IF_BASE_PORT or --hccl-listen)\n",
                 root().port, want_port);
    return HCCL_E_PARA;
  }
  accept_once();
  *ipv4 = root().ipv4;
  *port = root().port;
  return HCCL_SUCCESS;
}

void start() {
  std::lock_guard<std::mutex> g(root().mu);
  accept_once();
}

void register_comm(uint64_t id, const uint8_t secret[32]) {
  auto c = std::make_shared<Core>();
  c->id = id;
  std::memcpy(c->secret, secret, 32);
  const auto deadline = std::chrono::steady_clock::now() + kLeaving;
  std::unique_lock<std::mutex> g(root().mu);
  for (;;) {
    auto &slot = root().comms[id];
    bool in_use = false, leaving = false;
    if (slot) {
      std::lock_guard<std::mutex> cg(slot->mu);
      for (uint32_t i = 0; i < slot->ranks.size(); ++i)
        if (slot->ranks[i] == kJoined) {
          in_use = true;
          leaving = leaving || (i < slot->locking.size() && slot->locking[i]);
        }
    }
    if (!in_use) {
      slot = c;
      return;
    }
    // A restore re-forms a communicator under its id: its ranks backed up (their connections are
    // closed), but on a loaded host the threads serving them may not have seen it yet. A rank that
    // was locking is leaving: wait for it, or the old communicator stays, whose secret no restored
    // rank knows. One that runs on (a peer of a rank checkpointed alone) keeps it in use.
    if (!leaving || std::chrono::steady_clock::now() >= deadline) return;
    g.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    g.lock();
  }
}

}  // namespace npusim::hccl

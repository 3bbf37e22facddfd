// The members this daemon's clients hold: one per HcclComm handle, each with its TCP connection to
// the communicator's root daemon (hccl_root.cpp). A collective is a task on the client's stream:
// its worker sends this rank's part to the root and waits (HCCL_EXEC_TIMEOUT) for the result,
// which it writes to device memory. A member whose client process is gone is closed within
// kReap (its connection drops, so its peers fail instead of waiting).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "hccl/hccl_types.h"
#include "hccl_daemon.h"
#include "hccl_reduce.h"
#include "hccl_wire.h"
#include "wire.h"

namespace npusim::hccl {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kReap = std::chrono::milliseconds(200);
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr uint64_t kMaxBody = 4096;

struct Member {
  uint64_t id = 0;
  pid_t pid = 0;
  std::weak_ptr<Session> session;
  uint64_t comm_id = 0;
  uint32_t rank = 0, nranks = 0;
  RootBlob root{};              // where the root is (lock reports open their own connection)
  int64_t exec_timeout_ms = 0;  // 0: wait forever
  int fd = -1;
  std::mutex io;  // one step at a time on the connection
  std::atomic<uint64_t> issued{0}, completed{0};
  std::atomic<bool> broken{false}, closed{false};

  ~Member() {
    if (fd >= 0) ::close(fd);
  }
  void close_link() {  // wakes a worker blocked on the connection; the root sees the rank leave
    closed = true;
    ::shutdown(fd, SHUT_RDWR);
  }
};

struct Members {
  std::mutex mu;
  std::map<uint64_t, std::shared_ptr<Member>> by_id;
  uint64_t next_id = 1;
  DeviceState *state = nullptr;
  bool reaper = false;
};

Members &members() {
  static Members *m = new Members;
  return *m;
}

std::shared_ptr<Member> find(uint64_t id, pid_t pid) {
  std::lock_guard<std::mutex> g(members().mu);
  auto it = members().by_id.find(id);
  return it == members().by_id.end() || it->second->pid != pid ? nullptr : it->second;
}

bool client_gone(const Member &m) {
  auto s = m.session.lock();
  return !s || members().state->find(m.pid) != s;
}

void reap() {
  for (;;) {
    std::this_thread::sleep_for(kReap);
    std::vector<std::shared_ptr<Member>> all;
    {
      std::lock_guard<std::mutex> g(members().mu);
      for (auto &[id, m] : members().by_id) all.push_back(m);
    }
    for (auto &m : all) {
      if (!client_gone(*m)) continue;
      m->close_link();
      std::lock_guard<std::mutex> g(members().mu);
      members().by_id.erase(m->id);
    }
  }
}

// Waits until fd is readable: 0, or the HcclResult / -1 (aborted) that ended the wait.
int wait_readable(Member &m, int fd, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kPoll.count())) > 0) return 0;
    if (m.closed || client_gone(m)) return -1;
    if (m.exec_timeout_ms > 0 && Clock::now() >= deadline) return HCCL_E_TIMEOUT;
  }
}

int recv_until(Member &m, void *buf, size_t len, Clock::time_point deadline) {
  auto *p = static_cast<char *>(buf);
  while (len > 0) {
    if (int rc = wait_readable(m, m.fd, deadline); rc != 0) return rc;
    const ssize_t n = ::recv(m.fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return HCCL_E_REMOTE;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return 0;
}

// Whether the rank's own connection (client) closed while it waits for a reply, which it sends
// nothing meanwhile: its process died (a restore killed while its ranks re-form).
bool client_hung_up(int client) {
  pollfd p{client, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// Until fd is readable (true), the rank's client hung up or ms passed (false).
bool readable_for(int fd, int client, int64_t ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kPoll.count())) > 0) return true;
    if (client_hung_up(client) || Clock::now() >= until) return false;
  }
}

// Connects to the root and joins; retries while the root does not know the communicator yet (or
// is not listening yet) until the connect timeout. A rank whose process dies meanwhile gives up
// at once: its join would hold a place in the communicator (and this thread its Session) for
// the whole timeout, and the next restore of the same ranks could not re-form it.
int32_t join_root(const RootBlob &b, uint32_t rank, uint32_t nranks, int64_t timeout_ms, int client, int *out) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int32_t last = HCCL_E_TIMEOUT;
  while (Clock::now() < deadline && !client_hung_up(client)) {
    const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = b.ipv4;
    a.sin_port = htons(b.port);
    if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0) {
      JoinMsg j{kJoinMagic, rank, nranks, 0, b.comm_id, left, {}};
      std::memcpy(j.secret, b.secret, sizeof(j.secret));
      JoinReply rep{HCCL_E_TCP_TRANSFER, 0};
      // The root answers within `left` (its wait for the others); a little more for the network.
      if (wire::send_all(fd, &j, sizeof(j)) && readable_for(fd, client, left + 2000) &&
          wire::recv_all(fd, &rep, sizeof(rep))) {
        if (rep.code == HCCL_SUCCESS) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          *out = fd;
          return HCCL_SUCCESS;
        }
        if (rep.code != HCCL_E_NOT_FOUND) {
          ::close(fd);
          return rep.code;
        }
      }
      last = rep.code == HCCL_E_NOT_FOUND ? HCCL_E_TIMEOUT : HCCL_E_TCP_TRANSFER;
    } else {
      last = HCCL_E_TIMEOUT;  // not listening yet: the root's process may still be starting
    }
    if (fd >= 0) ::close(fd);
    std::this_thread::sleep_for(kPoll);
  }
  return last;
}

// One lock report to m's root (hccl_wire.h, HcclLockQuery), on a connection of its own: the
// member's connection may be busy with a collective for as long as the lock waits.
int32_t lock_query(const Member &m, uint64_t issued, uint32_t flags, proto::Reply &rp) {
  constexpr int kAnswerMs = 5000;  // the root answers at once; this only bounds a dead one
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = m.root.ipv4;
  a.sin_port = htons(m.root.port);
  JoinMsg j{kLockMagic, m.rank, m.nranks, flags, m.comm_id, static_cast<int64_t>(issued), {}};
  std::memcpy(j.secret, m.root.secret, sizeof(j.secret));
  LockReply rep{HCCL_E_TCP_CONNECT, 0, 0};
  pollfd p{fd, POLLIN, 0};
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0 &&
      wire::send_all(fd, &j, sizeof(j)) && ::poll(&p, 1, kAnswerMs) > 0 && wire::recv_all(fd, &rep, sizeof(rep))) {
    rp.value[0] = rep.pass;
    rp.value[1] = rep.settled;
    if (rep.code == HCCL_E_REMOTE) rp.value[2] = rep.pass + 1;
  } else {
    rep.code = HCCL_E_TCP_TRANSFER;
  }
  if (fd >= 0) ::close(fd);
  return rep.code;
}

int32_t comm_init(DeviceState &state, Session &s, int client, const proto::Request &rq, const std::string &body,
                  proto::Reply &rp) {
  RootBlob b{};
  if (body.size() != sizeof(b)) return HCCL_E_PARA;
  std::memcpy(&b, body.data(), sizeof(b));
  const uint32_t nranks = static_cast<uint32_t>(rq.value[0]), rank = static_cast<uint32_t>(rq.value[1]);
  if (nranks == 0 || rank >= nranks || rq.timeout_ms <= 0) return HCCL_E_PARA;
  if (rq.flags & 1) {  // rank 0 of a rank table: this daemon is the root
    uint32_t ip = 0;
    uint16_t port = 0;
    if (int32_t rc = listen_once(b.port, &ip, &port); rc != HCCL_SUCCESS) return rc;
    register_comm(b.comm_id, b.secret);
  }
  int fd = -1;
  if (int32_t rc = join_root(b, rank, nranks, rq.timeout_ms, client, &fd); rc != HCCL_SUCCESS) {
    if (rc == HCCL_E_TIMEOUT)
      std::fprintf(stderr, "npusimd: HCCL communicator %016llx rank %u: not every rank joined in %lld ms "
                   "(HCCL_CONNECT_TIMEOUT)\n", static_cast<unsigned long long>(b.comm_id), rank,
                   static_cast<long long>(rq.timeout_ms));
    return rc;
  }
  auto m = std::make_shared<Member>();
  m->pid = s.pid;
  m->session = state.find(s.pid);
  m->comm_id = b.comm_id;
  m->rank = rank;
  m->nranks = nranks;
  m->root = b;
  m->issued = m->completed = rq.task.target;  // a restored rank goes on from its sequence number
  m->exec_timeout_ms = static_cast<int64_t>(rq.addr);
  m->fd = fd;
  std::lock_guard<std::mutex> g(members().mu);
  m->id = members().next_id++;
  members().by_id[m->id] = m;
  members().state = &state;  // before the reaper starts; the daemon has one
  if (!members().reaper) {
    members().reaper = true;
    std::thread(reap).detach();
  }
  rp.value[0] = m->id;
  return HCCL_SUCCESS;
}

// Resolves the collective's buffers and queues it on the stream.
int32_t enqueue(DeviceState &state, Session &s, const proto::Request &rq) {
  const proto::Task &t = rq.task;
  auto m = find(t.event, s.pid);
  if (!m || t.kind != proto::TaskKind::HcclCollective) return HCCL_E_PARA;
  const uint64_t es = dtype_size(static_cast<uint32_t>(t.n));
  if (t.m < kAllReduce || t.m > kBarrier || (t.m != kBarrier && es == 0)) return HCCL_E_NOT_SUPPORT;
  uint64_t in = 0, out = 0;
  const bool rooted = t.m == kBroadcast || t.m == kReduce;
  step_bytes(t.m, t.size, es, m->nranks, rooted && static_cast<uint32_t>(t.value) == m->rank, &in, &out);
  if (t.m == kSend) in = t.size * es;
  if (t.m == kRecv) out = t.size * es;
  if (t.m == kBroadcast) in = out = t.size * es;  // one buffer: the root's source, everyone's destination
  Work w;
  w.task = t;
  w.pid = s.pid;
  uint64_t off = 0;
  if (in > 0) {
    auto b = state.containing(s, t.src, in, &off);
    if (!b) return HCCL_E_PARA;
    w.src = b->base + off;
    w.hold.push_back(std::move(b));
  }
  if (out > 0) {
    auto b = state.containing(s, t.dst, out, &off);
    if (!b) return HCCL_E_PARA;
    w.dst = b->base + off;
    w.out = b.get();
    w.out_len = out;
    w.hold.push_back(std::move(b));
  }
  if (streams::enqueue(s, rq.stream, std::move(w)) != ACL_SUCCESS) return HCCL_E_PARA;
  if (t.m != kSend && t.m != kRecv) ++m->issued;
  return HCCL_SUCCESS;
}

}  // namespace

void step_bytes(uint64_t kind, uint64_t count, uint64_t es, uint32_t nranks, bool is_root, uint64_t *in,
                uint64_t *out) {
  const uint64_t one = count * es;
  switch (kind) {
    case kAllReduce: *in = one; *out = one; break;
    case kReduce: *in = one; *out = is_root ? one : 0; break;
    case kReduceScatter: *in = one * nranks; *out = one; break;
    case kAllGather: *in = one; *out = one * nranks; break;
    case kBroadcast: *in = is_root ? one : 0; *out = is_root ? 0 : one; break;
    default: *in = 0; *out = 0; break;  // Send, Recv: by the caller; Barrier: nothing
  }
}

bool serve(DeviceState &state, Session &s, int fd, const proto::Request &rq, proto::Reply &rp) {
  if (rq.size > kMaxBody) return false;
  std::string body(rq.size, '\0');
  if (rq.size > 0 && !wire::recv_all(fd, body.data(), body.size())) return false;
  using proto::Op;
  switch (rq.op) {
    case Op::HcclRootInfo: {
      if (body.size() != 32) {
        rp.code = HCCL_E_PARA;
        break;
      }
      uint32_t ip = 0;
      uint16_t port = 0;
      if ((rp.code = listen_once(0, &ip, &port)) != HCCL_SUCCESS) break;
      if (rq.value[0] != 0) ip = static_cast<uint32_t>(rq.value[0]);  // HCCL_IF_IP
      if (ip == htonl(INADDR_ANY)) {
        std::fprintf(stderr, "npusimd: HCCL listens on every address: set HCCL_IF_IP to the one peers reach\n");
        rp.code = HCCL_E_PARA;
        break;
      }
      uint64_t id = rq.value[1];
      while (id == 0)
        if (::getrandom(&id, sizeof(id), 0) != sizeof(id)) id = 0;
      register_comm(id, reinterpret_cast<const uint8_t *>(body.data()));
      rp.value[0] = id;
      rp.value[1] = port;
      rp.value[2] = ip;
      rp.code = HCCL_SUCCESS;
      break;
    }
    case Op::HcclCommInit: rp.code = comm_init(state, s, fd, rq, body, rp); break;
    case Op::HcclCommDestroy: {
      auto m = find(rq.value[0], s.pid);
      if (!m) {
        rp.code = HCCL_E_PARA;
        break;
      }
      m->close_link();
      std::lock_guard<std::mutex> g(members().mu);
      members().by_id.erase(m->id);
      rp.code = HCCL_SUCCESS;
      break;
    }
    case Op::HcclEnqueue: rp.code = enqueue(state, s, rq); break;
    case Op::HcclCommInfo: {
      auto m = find(rq.value[0], s.pid);
      if (!m) {
        rp.code = HCCL_E_PARA;
        break;
      }
      rp.value[0] = m->issued;
      rp.value[1] = m->completed;
      rp.value[2] = m->broken ? 1 : 0;
      rp.code = HCCL_SUCCESS;
      break;
    }
    case Op::HcclLockQuery: {
      auto m = find(rq.value[0], s.pid);
      rp.code = !m ? HCCL_E_PARA : m->broken ? HCCL_E_REMOTE : lock_query(*m, rq.value[1], rq.flags, rp);
      break;
    }
    default: rp.code = HCCL_E_NOT_SUPPORT; break;
  }
  return true;
}

void release(Session &s) {
  std::vector<std::shared_ptr<Member>> mine;
  {
    std::lock_guard<std::mutex> g(members().mu);
    for (auto it = members().by_id.begin(); it != members().by_id.end();)
      if (it->second->pid == s.pid) {
        mine.push_back(it->second);
        it = members().by_id.erase(it);
      } else {
        ++it;
      }
  }
  for (auto &m : mine) m->close_link();
}

int32_t run(Work &w) {
  const proto::Task &t = w.task;
  auto m = find(t.event, w.pid);
  if (!m) return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;  // destroyed while its work was queued
  std::lock_guard<std::mutex> g(m->io);
  if (m->broken || m->closed) return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
  const uint64_t es = dtype_size(static_cast<uint32_t>(t.n));
  uint64_t in = 0, out = 0;
  step_bytes(t.m, t.size, es, m->nranks, static_cast<uint32_t>(t.value) == m->rank, &in, &out);
  if (t.m == kSend) in = t.size * es;
  if (t.m == kRecv) out = t.size * es;
  Frame f{kFrameMagic, static_cast<uint32_t>(t.m), t.target, t.size, static_cast<uint32_t>(t.n),
          static_cast<uint32_t>(t.k), static_cast<uint32_t>(t.value), 0, in};
  const auto deadline = Clock::now() + std::chrono::milliseconds(m->exec_timeout_ms);
  int rc = wire::send_all(m->fd, &f, sizeof(f)) && wire::send_all(m->fd, w.src, in) ? 0 : HCCL_E_REMOTE;
  Result res{};
  if (rc == 0) rc = recv_until(*m, &res, sizeof(res), deadline);
  if (rc == 0 && res.code == HCCL_SUCCESS && res.bytes != out) rc = HCCL_E_REMOTE;  // a broken root
  if (rc == 0 && res.code == HCCL_SUCCESS) rc = recv_until(*m, w.dst, out, deadline);
  if (rc == 0 && res.code == HCCL_SUCCESS) {
    if (t.m != kSend && t.m != kRecv) ++m->completed;
    return ACL_SUCCESS;
  }
  // The communicator cannot go on: its steps would no longer line up with the peers'.
  m->broken = true;
  ::shutdown(m->fd, SHUT_RDWR);
  const int why = rc != 0 ? rc : res.code;
  if (why == -1 || m->closed) return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;  // destroyed, or the client is gone
  std::fprintf(stderr, "npusimd: HCCL communicator %016llx rank %u: step %llu failed: %s\n",
               static_cast<unsigned long long>(m->comm_id), m->rank, static_cast<unsigned long long>(t.target),
               why == HCCL_E_TIMEOUT ? "a peer did not take part within HCCL_EXEC_TIMEOUT"
               : why == HCCL_E_PARA  ? "the ranks called different collectives"
                                     : "a peer or the root daemon is gone");
  if (why == HCCL_E_TIMEOUT) return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
  if (why == HCCL_E_PARA) return ACL_ERROR_INVALID_PARAM;
  return ACL_ERROR_RT_SUSPECT_REMOTE_ERROR;
}

}  // namespace npusim::hccl

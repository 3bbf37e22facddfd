// libhccl.so: CANN's HCCL API on npusim. A communicator handle is an object of this process that
// names its member in this process's daemon (hccl_member.cpp); collectives are queued on the
// caller's stream like any task and run on the daemons, which carry the data between ranks over
// TCP (hccl_wire.h). The handle keeps the communicator's sequence number: collectives issued by
// this rank (Send/Recv are matched per pair instead and do not count).
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "hccl/hccl.h"
#include "hccl_bridge.h"
#include "hccl_rank_table.h"
#include "hccl_reduce.h"
#include "hccl_wire.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::hccl;

namespace {

constexpr double kConnectTimeoutDefault = 120;   // s, CANN's default
constexpr double kExecTimeoutDefault = 1836;     // s, CANN's default; 0 waits forever
constexpr uint16_t kBasePortDefault = 60000;     // CANN's HCCL_IF_BASE_PORT default
constexpr off_t kMaxRankTable = 1 << 20;

struct CommObj {
  uint64_t member = 0;
  uint64_t comm_id = 0;
  uint32_t rank = 0, nranks = 0;
  std::mutex mu;     // orders the sequence numbers with the enqueues
  uint64_t seq = 0;  // collectives issued by this rank
};

std::mutex g_mu;
std::set<CommObj *> &live() {
  static auto *s = new std::set<CommObj *>;
  return *s;
}

CommObj *find(HcclComm comm) {
  std::lock_guard<std::mutex> g(g_mu);
  auto *c = static_cast<CommObj *>(comm);
  return live().count(c) != 0 ? c : nullptr;
}

HcclResult result_of(int32_t rc) {
  if (rc >= HCCL_SUCCESS && rc < HCCL_E_RESERVED) return static_cast<HcclResult>(rc);
  if (rc == ACL_ERROR_INVALID_PARAM) return HCCL_E_PARA;
  return HCCL_E_RUNTIME;  // the runtime (not initialized, no device, the daemon gone)
}

// An environment variable in seconds; false (after one line on stderr) if it is not one.
bool env_seconds(const char *name, double fallback, bool zero_ok, double *out) {
  const char *v = std::getenv(name);
  *out = fallback;
  if (v == nullptr || *v == '\0') return true;
  char *end = nullptr;
  const double d = std::strtod(v, &end);
  if (*end != '\0' || !std::isfinite(d) || d < 0 || (d == 0 && !zero_ok)) {
    std::fprintf(stderr, "npusim hccl: %s=%s is not a number of seconds\n", name, v);
    return false;
  }
  *out = d;
  return true;
}

uint64_t fnv1a(const std::string &s, uint64_t salt) {
  uint64_t h = 0xcbf29ce484222325ULL ^ salt;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

HcclResult init(const RootBlob &blob, uint32_t nranks, uint32_t rank, uint32_t flags, HcclComm *comm) {
  int32_t device = 0;
  if (npusimHcclDevice(&device) != ACL_SUCCESS) {
    std::fprintf(stderr, "npusim hccl: no current device: call aclInit and aclrtSetDevice first\n");
    return HCCL_E_RUNTIME;
  }
  double connect = 0, exec = 0;
  if (!env_seconds("HCCL_CONNECT_TIMEOUT", kConnectTimeoutDefault, false, &connect) ||
      !env_seconds("HCCL_EXEC_TIMEOUT", kExecTimeoutDefault, true, &exec))
    return HCCL_E_PARA;
  proto::Request rq = wire::request(proto::Op::HcclCommInit);
  rq.device = device;
  rq.value[0] = nranks;
  rq.value[1] = rank;
  rq.timeout_ms = static_cast<int64_t>(connect * 1000);
  rq.addr = static_cast<uint64_t>(exec * 1000);
  rq.flags = flags;
  rq.size = sizeof(blob);
  proto::Reply rp{};
  const HcclResult rc = result_of(npusimHcclCall(&rq, &rp, &blob));
  if (rc == HCCL_E_TIMEOUT)
    std::fprintf(stderr, "npusim hccl: rank %u of %u: not every rank joined within HCCL_CONNECT_TIMEOUT (%g s)\n",
                 rank, nranks, connect);
  if (rc != HCCL_SUCCESS) return rc;
  auto *c = new CommObj;
  c->member = rp.value[0];
  c->comm_id = blob.comm_id;
  c->rank = rank;
  c->nranks = nranks;
  {
    std::lock_guard<std::mutex> g(g_mu);
    live().insert(c);
  }
  npusimHcclTrack(c, c->comm_id, rank, nranks, 1);
  *comm = c;
  return HCCL_SUCCESS;
}

bool read_file(const char *path, std::string *out) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxRankTable) {
    if (fd >= 0) ::close(fd);
    return false;
  }
  out->resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::read(fd, out->data() + done, out->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out->resize(done);
  return true;
}

// One collective (or Send/Recv) of comm queued on stream.
HcclResult submit(HcclComm comm, uint64_t kind, void *send, void *recv, uint64_t count, HcclDataType type,
                  HcclReduceOp op, uint32_t peer, aclrtStream stream) {
  CommObj *c = find(comm);
  if (comm == nullptr) return HCCL_E_PTR;
  if (c == nullptr) return HCCL_E_PARA;
  const bool reduces = kind == kAllReduce || kind == kReduce || kind == kReduceScatter;
  const bool rooted = kind == kBroadcast || kind == kReduce, p2p = kind == kSend || kind == kRecv;
  if (kind != kBarrier) {
    if (dtype_size(type) == 0) return type == HCCL_DATA_TYPE_INT128 ? HCCL_E_NOT_SUPPORT : HCCL_E_PARA;
    if (reduces && !op_ok(op)) return HCCL_E_PARA;
    if ((rooted || p2p) && peer >= c->nranks) return HCCL_E_PARA;
    if (p2p && peer == c->rank) return HCCL_E_PARA;
    if (count == 0) return HCCL_SUCCESS;  // nothing to move
    const bool needs_recv = kind != kSend && kind != kBroadcast && (kind != kReduce || peer == c->rank);
    if ((kind != kRecv && send == nullptr) || (needs_recv && recv == nullptr)) return HCCL_E_PTR;
  }
  proto::Request rq = wire::request(proto::Op::HcclEnqueue);
  proto::Task &t = rq.task;
  t.kind = proto::TaskKind::HcclCollective;
  t.event = static_cast<uint32_t>(c->member);
  t.m = kind;
  t.n = static_cast<uint64_t>(type);
  t.k = static_cast<uint64_t>(op);
  t.value = static_cast<int32_t>(peer);
  t.size = count;
  t.src = reinterpret_cast<uint64_t>(send);
  t.dst = reinterpret_cast<uint64_t>(recv);
  std::lock_guard<std::mutex> g(c->mu);
  t.target = p2p ? 0 : c->seq + 1;
  const HcclResult rc = result_of(npusimHcclSubmit(stream, &rq));
  if (rc == HCCL_SUCCESS && !p2p) ++c->seq;
  return rc;
}

}  // namespace

extern "C" {

HcclResult HcclGetRootInfo(HcclRootInfo *rootInfo) {
  if (rootInfo == nullptr) return HCCL_E_PTR;
  uint32_t if_ip = 0;
  if (const char *ip = std::getenv("HCCL_IF_IP"); ip != nullptr && *ip != '\0') {
    in_addr a{};
    if (std::strchr(ip, ':') != nullptr) {
      std::fprintf(stderr, "npusim hccl: HCCL_IF_IP=%s: IPv6 is not supported\n", ip);
      return HCCL_E_NOT_SUPPORT;
    }
    if (::inet_pton(AF_INET, ip, &a) != 1) {
      std::fprintf(stderr, "npusim hccl: HCCL_IF_IP=%s is not an IPv4 address\n", ip);
      return HCCL_E_PARA;
    }
    if_ip = a.s_addr;
  }
  RootBlob b{};
  if (::getrandom(b.secret, sizeof(b.secret), 0) != static_cast<ssize_t>(sizeof(b.secret))) return HCCL_E_SYSCALL;
  proto::Request rq = wire::request(proto::Op::HcclRootInfo);
  rq.value[0] = if_ip;
  rq.size = sizeof(b.secret);
  proto::Reply rp{};
  if (HcclResult rc = result_of(npusimHcclCall(&rq, &rp, b.secret)); rc != HCCL_SUCCESS) return rc;
  std::memcpy(b.magic, kRootMagic, sizeof(b.magic));
  b.comm_id = rp.value[0];
  b.port = static_cast<uint16_t>(rp.value[1]);
  b.ipv4 = static_cast<uint32_t>(rp.value[2]);
  std::memset(rootInfo, 0, sizeof(*rootInfo));
  std::memcpy(rootInfo->internal, &b, sizeof(b));
  return HCCL_SUCCESS;
}

HcclResult HcclCommInitRootInfo(uint32_t nRanks, const HcclRootInfo *rootInfo, uint32_t rank, HcclComm *comm) {
  if (rootInfo == nullptr || comm == nullptr) return HCCL_E_PTR;
  RootBlob b{};
  std::memcpy(&b, rootInfo->internal, sizeof(b));
  if (nRanks == 0 || rank >= nRanks || std::memcmp(b.magic, kRootMagic, sizeof(b.magic)) != 0) return HCCL_E_PARA;
  return init(b, nRanks, rank, 0, comm);
}

HcclResult HcclCommInitClusterInfo(const char *clusterInfo, uint32_t rank, HcclComm *comm) {
  if (clusterInfo == nullptr || comm == nullptr) return HCCL_E_PTR;
  std::string json, why;
  std::vector<RankEntry> ranks;
  if (!read_file(clusterInfo, &json)) {
    std::fprintf(stderr, "npusim hccl: cannot read the rank table %s\n", clusterInfo);
    return HCCL_E_OPEN_FILE_FAILURE;
  }
  if (!parse_rank_table(json, &ranks, &why)) {
    std::fprintf(stderr, "npusim hccl: %s: %s\n", clusterInfo, why.c_str());
    return HCCL_E_PARA;
  }
  if (rank >= ranks.size()) return HCCL_E_PARA;
  // Rank 0's daemon is the root: at rank 0's server address (an IPv4 host_ip or server_id, else
  // this host) on HCCL_IF_BASE_PORT. The communicator's id and secret come from the file, so the
  // file is what keeps others out: keep it private to the job.
  RootBlob b{};
  std::memcpy(b.magic, kRootMagic, sizeof(b.magic));
  in_addr a{};
  b.ipv4 = ::inet_pton(AF_INET, ranks[0].host.c_str(), &a) == 1 ? a.s_addr : htonl(INADDR_LOOPBACK);
  b.port = kBasePortDefault;
  if (const char *p = std::getenv("HCCL_IF_BASE_PORT"); p != nullptr && *p != '\0') {
    char *end = nullptr;
    const unsigned long port = std::strtoul(p, &end, 10);
    if (*end != '\0' || port == 0 || port > 65535) {
      std::fprintf(stderr, "npusim hccl: HCCL_IF_BASE_PORT=%s is not a port\n", p);
      return HCCL_E_PARA;
    }
    b.port = static_cast<uint16_t>(port);
  }
  b.comm_id = fnv1a(json, 0);
  for (int i = 0; i < 4; ++i) {
    const uint64_t h = fnv1a(json, 0x736563726574ULL + static_cast<uint64_t>(i));
    std::memcpy(b.secret + 8 * i, &h, 8);
  }
  return init(b, static_cast<uint32_t>(ranks.size()), rank, rank == 0 ? 1 : 0, comm);
}

HcclResult HcclCommDestroy(HcclComm comm) {
  if (comm == nullptr) return HCCL_E_PTR;
  auto *c = static_cast<CommObj *>(comm);
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (live().erase(c) == 0) return HCCL_E_PARA;
  }
  proto::Request rq = wire::request(proto::Op::HcclCommDestroy);
  rq.value[0] = c->member;
  const HcclResult rc = result_of(npusimHcclCall(&rq, nullptr, nullptr));
  npusimHcclTrack(c, c->comm_id, c->rank, c->nranks, 0);
  delete c;
  return rc == HCCL_E_RUNTIME ? HCCL_SUCCESS : rc;  // a daemon already gone freed the member with its session
}

HcclResult HcclGetRankSize(HcclComm comm, uint32_t *rankSize) {
  CommObj *c = find(comm);
  if (comm == nullptr || rankSize == nullptr) return HCCL_E_PTR;
  if (c == nullptr) return HCCL_E_PARA;
  *rankSize = c->nranks;
  return HCCL_SUCCESS;
}

HcclResult HcclGetRankId(HcclComm comm, uint32_t *rank) {
  CommObj *c = find(comm);
  if (comm == nullptr || rank == nullptr) return HCCL_E_PTR;
  if (c == nullptr) return HCCL_E_PARA;
  *rank = c->rank;
  return HCCL_SUCCESS;
}

const char *HcclGetErrorString(HcclResult code) {
  switch (code) {
    case HCCL_SUCCESS: return "no error";
    case HCCL_E_PARA: return "parameter error";
    case HCCL_E_PTR: return "empty pointer";
    case HCCL_E_MEMORY: return "memory error";
    case HCCL_E_INTERNAL: return "internal error";
    case HCCL_E_NOT_SUPPORT: return "not support feature";
    case HCCL_E_NOT_FOUND: return "not found specific resource";
    case HCCL_E_UNAVAIL: return "resource unavailable";
    case HCCL_E_SYSCALL: return "call system interface error";
    case HCCL_E_TIMEOUT: return "timeout";
    case HCCL_E_OPEN_FILE_FAILURE: return "open file fail";
    case HCCL_E_TCP_CONNECT: return "tcp connect fail";
    case HCCL_E_ROCE_CONNECT: return "roce connect fail";
    case HCCL_E_TCP_TRANSFER: return "tcp transfer fail";
    case HCCL_E_ROCE_TRANSFER: return "roce transfer fail";
    case HCCL_E_RUNTIME: return "call runtime api fail";
    case HCCL_E_DRV: return "call driver api fail";
    case HCCL_E_PROFILING: return "call profiling api fail";
    case HCCL_E_CCE: return "call cce api fail";
    case HCCL_E_NETWORK: return "call network api fail";
    case HCCL_E_AGAIN: return "try again";
    case HCCL_E_REMOTE: return "error cqe";
    case HCCL_E_SUSPENDING: return "error communicator suspending";
    default: return "unknown error";
  }
}

HcclResult HcclAllReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                         HcclComm comm, aclrtStream stream) {
  return submit(comm, kAllReduce, sendBuf, recvBuf, count, dataType, op, 0, stream);
}

HcclResult HcclBroadcast(void *buf, uint64_t count, HcclDataType dataType, uint32_t root, HcclComm comm,
                         aclrtStream stream) {
  return submit(comm, kBroadcast, buf, buf, count, dataType, HCCL_REDUCE_SUM, root, stream);
}

HcclResult HcclReduceScatter(void *sendBuf, void *recvBuf, uint64_t recvCount, HcclDataType dataType,
                             HcclReduceOp op, HcclComm comm, aclrtStream stream) {
  return submit(comm, kReduceScatter, sendBuf, recvBuf, recvCount, dataType, op, 0, stream);
}

HcclResult HcclAllGather(void *sendBuf, void *recvBuf, uint64_t sendCount, HcclDataType dataType, HcclComm comm,
                         aclrtStream stream) {
  return submit(comm, kAllGather, sendBuf, recvBuf, sendCount, dataType, HCCL_REDUCE_SUM, 0, stream);
}

HcclResult HcclReduce(void *sendBuf, void *recvBuf, uint64_t count, HcclDataType dataType, HcclReduceOp op,
                      uint32_t root, HcclComm comm, aclrtStream stream) {
  return submit(comm, kReduce, sendBuf, recvBuf, count, dataType, op, root, stream);
}

HcclResult HcclSend(void *sendBuf, uint64_t count, HcclDataType dataType, uint32_t destRank, HcclComm comm,
                    aclrtStream stream) {
  return submit(comm, kSend, sendBuf, nullptr, count, dataType, HCCL_REDUCE_SUM, destRank, stream);
}

HcclResult HcclRecv(void *recvBuf, uint64_t count, HcclDataType dataType, uint32_t srcRank, HcclComm comm,
                    aclrtStream stream) {
  return submit(comm, kRecv, nullptr, recvBuf, count, dataType, HCCL_REDUCE_SUM, srcRank, stream);
}

HcclResult HcclBarrier(HcclComm comm, aclrtStream stream) {
  return submit(comm, kBarrier, nullptr, nullptr, 0, HCCL_DATA_TYPE_INT8, HCCL_REDUCE_SUM, 0, stream);
}

int npusimHcclCommInfo(HcclComm comm, char *buf, uint64_t len) {
  CommObj *c = find(comm);
  if (c == nullptr || buf == nullptr) return -1;
  proto::Request rq = wire::request(proto::Op::HcclCommInfo);
  rq.value[0] = c->member;
  proto::Reply rp{};
  const bool daemon = npusimHcclCall(&rq, &rp, nullptr) == HCCL_SUCCESS;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> g(c->mu);
    seq = c->seq;
  }
  const int n = std::snprintf(
      buf, len, "{\"comm\": \"%016llx\", \"rank\": %u, \"ranks\": %u, \"seq\": %llu, \"daemon_issued\": %lld, "
      "\"daemon_completed\": %lld, \"broken\": %s}",
      static_cast<unsigned long long>(c->comm_id), c->rank, c->nranks, static_cast<unsigned long long>(seq),
      daemon ? static_cast<long long>(rp.value[0]) : -1LL, daemon ? static_cast<long long>(rp.value[1]) : -1LL,
      daemon && rp.value[2] == 0 ? "false" : "true");
  return n < 0 || static_cast<uint64_t>(n) >= len ? -1 : n;
}

}  // extern "C"

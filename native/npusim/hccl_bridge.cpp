// The runtime's side of libhccl.so (hccl_bridge.h): daemon calls behind the snapshot's gate,
// stream handles, the current device, and the table of communicators (hccl_comms.h) that
// hccl_snapshot.cpp carries across a snapshot.
#include "hccl_bridge.h"

#include <optional>
#include <string>

#include "hccl_comms.h"
#include "hccl_wire.h"
#include "runtime.h"

using namespace npusim;
using namespace npusim::rt;

namespace npusim::rt {

std::map<const void *, CommEntry> &hccl_comms() {
  static auto *m = new std::map<const void *, CommEntry>;
  return *m;
}

void hccl_update_behind() {
  bool behind = false, owed = false;
  for (auto &[handle, c] : hccl_comms()) {
    behind = behind || c.seq < c.pass;
    for (size_t p = 0; p < c.recvd.size() && p < c.recv_pass.size(); ++p) owed = owed || c.recvd[p] < c.recv_pass[p];
    for (size_t p = 0; p < c.sent.size() && p < c.send_pass.size(); ++p) owed = owed || c.sent[p] < c.send_pass[p];
  }
  runtime().hccl_behind = behind;
  runtime().hccl_recv_owed = owed;
}

}  // namespace npusim::rt


namespace npusim::rt {

bool hccl_admits(const void *comm) {
  auto it = hccl_comms().find(comm);
  if (comm == nullptr || it == hccl_comms().end()) return runtime().hccl_behind;
  return it->second.seq < it->second.pass;
}

bool hccl_admits_p2p(const void *comm, bool send, uint32_t peer) {
  if (runtime().hccl_behind) return true;
  auto it = hccl_comms().find(comm);
  if (it == hccl_comms().end()) return false;
  const CommEntry &c = it->second;
  const auto &done = send ? c.sent : c.recvd;
  const auto &pass = send ? c.send_pass : c.recv_pass;
  return peer < done.size() && peer < pass.size() && done[peer] < pass[peer];
}

}  // namespace npusim::rt

extern "C" {

int32_t npusimHcclCall(const proto::Request *rq, proto::Reply *rp, const void *body) {
  CallScope scope;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  }
  const std::string trailing(static_cast<const char *>(body), body != nullptr ? rq->size : 0);
  return runtime().pool.call(*rq, rp, body != nullptr ? &trailing : nullptr);
}

int32_t npusimHcclSubmit(void *stream, const void *comm, proto::Request *rq) {
  Runtime &r = runtime();
  const bool p2p = rq->task.m == npusim::hccl::kSend || rq->task.m == npusim::hccl::kRecv;
  std::shared_ptr<std::mutex> order;
  {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = hccl_comms().find(comm);
    if (it == hccl_comms().end()) return ACL_ERROR_INVALID_PARAM;
    order = it->second.order;
  }
  std::lock_guard<std::mutex> o(*order);  // before the gate: a second enqueue sees the first's number
  const bool recv = rq->task.m == npusim::hccl::kRecv;
  const uint32_t peer = static_cast<uint32_t>(rq->task.value);
  std::optional<CallScope> scope;
  if (p2p) scope.emplace(comm, !recv, peer);  // passes while the peer's Sends (Recvs) wait for it
  else scope.emplace(comm);
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  rq->stream = s->id;
  {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = hccl_comms().find(comm);
    if (it == hccl_comms().end()) return ACL_ERROR_INVALID_PARAM;
    rq->task.event = static_cast<uint32_t>(it->second.member);
    rq->task.target = p2p ? 0 : it->second.seq + 1;
  }
  const int32_t rc = r.pool.call(*rq);
  if (rc == 0 && p2p) {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = hccl_comms().find(comm);
    auto *done = it == hccl_comms().end() ? nullptr : recv ? &it->second.recvd : &it->second.sent;
    if (done != nullptr && peer < done->size()) ++(*done)[peer];
    hccl_update_behind();
    r.gate_cv.notify_all();
  }
  if (rc == 0 && !p2p) {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = hccl_comms().find(comm);
    if (it != hccl_comms().end()) ++it->second.seq;
    hccl_update_behind();  // caught up: the free pass closes behind this collective
    r.gate_cv.notify_all();
  }
  return rc;
}

int32_t npusimHcclDevice(int32_t *device) { return active_device(runtime(), device); }

void npusimHcclTrack(const void *comm, const NpusimHcclCommDesc *desc) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (desc == nullptr) {
    hccl_comms().erase(comm);
    hccl_update_behind();
    return;
  }
  CommEntry c;
  c.id = desc->comm_id;
  c.member = desc->member;
  c.rank = desc->rank;
  c.nranks = desc->nranks;
  c.device = desc->device;
  c.origin = desc->origin;
  c.connect_ms = desc->connect_ms;
  c.exec_ms = desc->exec_ms;
  c.order = std::make_shared<std::mutex>();
  c.recvd.assign(desc->nranks, 0);
  c.recv_pass.assign(desc->nranks, 0);
  c.sent.assign(desc->nranks, 0);
  c.send_pass.assign(desc->nranks, 0);
  hccl_comms()[comm] = std::move(c);
}

int npusimHcclMember(const void *comm, uint64_t *member, uint64_t *seq) {
  std::lock_guard<std::mutex> g(runtime().mu);
  auto it = hccl_comms().find(comm);
  if (it == hccl_comms().end()) return -1;
  *member = it->second.member;
  *seq = it->second.seq;
  return 0;
}

}  // extern "C"

// The runtime's side of libhccl.so (hccl_bridge.h), and communicators as the resource kind
// "hccl communicators": Lock refuses while one is live (its collectives cannot be carried yet),
// so the workload runs on instead of being restored with a communicator that no longer exists.
#include "hccl_bridge.h"

#include <cstdio>
#include <map>
#include <string>

#include "resources.h"
#include "runtime.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct CommInfo {
  uint64_t id;
  uint32_t rank, nranks;
};

// Guarded by runtime().mu.
std::map<const void *, CommInfo> &live_comms() {
  static auto *m = new std::map<const void *, CommInfo>;
  return *m;
}

int32_t check_comms(std::string *why) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (live_comms().empty()) return ACL_SUCCESS;
  const CommInfo &c = live_comms().begin()->second;
  char line[160];
  std::snprintf(line, sizeof(line), "HCCL communicator %016llx (rank %u of %u): checkpoint of collectives not yet supported",
                static_cast<unsigned long long>(c.id), c.rank, c.nranks);
  *why = line;
  return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
}

const ResourceKind kCommunicators{"hccl communicators", 45, check_comms, nullptr, nullptr, nullptr,
                                  [] { return live_comms().size(); }};
NPUSIM_RESOURCE_KIND(kCommunicators);

}  // namespace

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

int32_t npusimHcclSubmit(void *stream, proto::Request *rq) {
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  rq->stream = s->id;
  return runtime().pool.call(*rq);
}

int32_t npusimHcclDevice(int32_t *device) { return active_device(runtime(), device); }

void npusimHcclTrack(const void *comm, uint64_t comm_id, uint32_t rank, uint32_t nranks, int live) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (live) live_comms()[comm] = CommInfo{comm_id, rank, nranks};
  else live_comms().erase(comm);
}

}  // extern "C"

// IPC events: an event of this process shared with others by handle (aclrtIpcGetEventHandle), or
// one of theirs opened here (aclrtIpcOpenEventHandle). An opened event is an ordinary event
// handle of this process whose state the daemon shares with the exporter's, so record, wait,
// synchronize and query work on it unchanged. The snapshot cannot carry the sharing (kind
// "ipc events" refuses at Lock).
#include <set>
#include <string>

#include "ipc_key.h"
#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

// Events of this process shared with others, guarded by runtime().mu. A destroyed event leaves
// its pointer here and only pointers still in runtime().events count: at worst a new event at a
// reused address is refused at Lock too, never carried wrong.
std::set<EventObj *> &shared_events() {
  static auto *s = new std::set<EventObj *>;
  return *s;
}

}  // namespace

extern "C" {

aclError aclrtIpcGetEventHandle(aclrtEvent event, aclrtIpcEventHandle *handle) {
  if (handle == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  auto *e = static_cast<EventObj *>(event);
  proto::Request rq = wire::request(proto::Op::EventExport);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
    if (e == nullptr || r.events.count(e) == 0) return ACL_ERROR_INVALID_PARAM;
    rq.event = e->id;
  }
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  aclrtIpcEventHandle h{};
  format_key("ipcevent", rp.value[0], h.reserved, sizeof(h.reserved));
  std::lock_guard<std::mutex> g(r.mu);
  shared_events().insert(e);
  *handle = h;
  return ACL_SUCCESS;
}

aclError aclrtIpcOpenEventHandle(aclrtIpcEventHandle handle, aclrtEvent *event) {
  if (event == nullptr) return ACL_ERROR_INVALID_PARAM;
  handle.reserved[sizeof(handle.reserved) - 1] = '\0';
  const uint64_t key = parse_key("ipcevent", handle.reserved);
  if (key == 0) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::EventImport);
  rq.value[0] = key;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;  // gone with its exporter
  // Records made so far count as this handle's: a wait waits for the latest of them.
  auto *e = new EventObj{static_cast<uint32_t>(rp.value[0]), d, rp.value[1], 0, 0};
  std::lock_guard<std::mutex> g(r.mu);
  r.events.insert(e);
  shared_events().insert(e);
  *event = e;
  return ACL_SUCCESS;
}

}  // extern "C"

namespace {

size_t live_shared() {
  size_t n = 0;
  for (EventObj *e : shared_events()) n += runtime().events.count(e);
  return n;
}

int32_t check_ipc_events(std::string *why) {
  std::lock_guard<std::mutex> g(runtime().mu);
  const size_t n = live_shared();
  if (n == 0) return ACL_SUCCESS;
  *why = std::to_string(n) + " event(s) shared with another process (destroy them before a checkpoint)";
  return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
}

const ResourceKind kIpcEvents{"ipc events", 43, check_ipc_events, nullptr, nullptr, nullptr, live_shared};
NPUSIM_RESOURCE_KIND(kIpcEvents);

}  // namespace

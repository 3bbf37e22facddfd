// IPC events: an event of this process created with ACL_EVENT_IPC shared with others by handle
// (aclrtIpcGetEventHandle), or
// one of theirs opened here (aclrtIpcOpenEventHandle). An opened event is an ordinary event
// handle of this process whose state the daemon shares with the exporter's, so record, wait,
// synchronize and query work on it unchanged. The snapshot carries the sharing as it carries IPC
// memory (kind "ipc events", after "events"): importers are checkpointed first, an exporter whose
// importers still run is refused at Lock, and on restore the exporter publishes its handle again
// and the importers open it again.
#include <map>
#include <string>
#include <vector>

#include "contexts.h"
#include "ipc_key.h"
#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct IpcEvent {
  uint64_t exported = 0;  // share number of its handle (0: none)
  uint64_t opened = 0;    // share number it was opened from (0: created here)
};

// By event, guarded by runtime().mu. A destroyed event leaves its entry here; only events still in
// runtime().events count, so at worst a new event at a reused address inherits an entry and is
// refused at Lock or re-published on restore, never carried wrong.
std::map<EventObj *, IpcEvent> &ipc_events() {
  static auto *s = new std::map<EventObj *, IpcEvent>;
  return *s;
}

std::vector<std::pair<EventObj *, IpcEvent>> live_ipc_events() {
  std::lock_guard<std::mutex> g(runtime().mu);
  std::vector<std::pair<EventObj *, IpcEvent>> out;
  for (auto &[e, ie] : ipc_events())
    if (runtime().events.count(e) != 0) out.emplace_back(e, ie);
  return out;
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
    // CANN shares only events created with ACL_EVENT_IPC (aclrtCreateEventExWithFlag).
    if (e == nullptr || r.events.count(e) == 0 || (e->flags & ACL_EVENT_IPC) == 0) return ACL_ERROR_INVALID_PARAM;
    auto it = ipc_events().find(e);
    rq.value[1] = it != ipc_events().end() ? it->second.exported : 0;  // the same handle again
    rq.event = e->id;
  }
  proto::Reply rp{};
  if (rq.value[1] != 0) {
    rp.value[0] = rq.value[1];
  } else if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) {
    return rc;
  }
  aclrtIpcEventHandle h{};
  format_key("ipcevent", rp.value[0], h.reserved, sizeof(h.reserved));
  std::lock_guard<std::mutex> g(r.mu);
  ipc_events()[e].exported = rp.value[0];
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
  e->ctx = owning_context(r);
  e->flags = ACL_EVENT_IPC;
  r.events.insert(e);
  ipc_events()[e] = IpcEvent{0, key};
  *event = e;
  return ACL_SUCCESS;
}

}  // extern "C"

namespace {

int32_t check_ipc_events(std::string *why) {
  bool exports = false;
  for (auto &[e, ie] : live_ipc_events()) exports = exports || ie.exported != 0;
  return exports ? check_importers(3, "event", why) : ACL_SUCCESS;
}

// Kind "events" (40) has re-created every event as a plain one with its saved state; an exported
// one is published again under its old number, an opened one is replaced by the exporter's again.
int32_t restore_ipc_events(const SnapshotPass &) {
  Runtime &r = runtime();
  auto live = live_ipc_events();
  for (auto &[e, ie] : live) {
    if (ie.exported == 0) continue;
    proto::Request rq = wire::request(proto::Op::EventExport);
    rq.event = e->id;
    rq.value[1] = ie.exported;
    if (r.pool.call(rq) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;  // its number is taken
  }
  for (auto &[e, ie] : live) {
    if (ie.opened == 0) continue;
    proto::Request open = wire::request(proto::Op::EventImport);
    open.value[0] = ie.opened;
    proto::Reply rp{};
    if (r.pool.call(open, &rp) != ACL_SUCCESS) {
      note_error("snapshot: cannot open IPC event again: restore the exporting process first");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    proto::Request drop = wire::request(proto::Op::EventDestroy);
    drop.event = e->id;
    r.pool.call(drop);  // the plain stand-in kind "events" made
    std::lock_guard<std::mutex> g(r.mu);
    e->id = static_cast<uint32_t>(rp.value[0]);
    e->records = rp.value[1];
  }
  return ACL_SUCCESS;
}

const ResourceKind kIpcEvents{"ipc events", 43, check_ipc_events, nullptr, restore_ipc_events, nullptr, [] {
                                size_t n = 0;
                                for (auto &[e, ie] : ipc_events()) n += runtime().events.count(e);
                                return n;
                              }};
NPUSIM_RESOURCE_KIND(kIpcEvents);

}  // namespace

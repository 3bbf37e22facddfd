// Streams and events. Handles are objects of this process; the daemon knows them by id, and
// Restore gives them new ids without changing the handles.
#include <algorithm>

#include "capture.h"
#include "contexts.h"
#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

int32_t check_event(aclrtEvent event, EventObj **out) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  auto *e = static_cast<EventObj *>(event);
  if (e == nullptr || r.events.count(e) == 0) return note_error(ACL_ERROR_INVALID_PARAM, "not a live event");
  *out = e;
  return ACL_SUCCESS;
}

int32_t check_user_stream(aclrtStream stream, StreamObj **out) {
  if (stream == nullptr) return ACL_ERROR_INVALID_PARAM;
  if (int32_t rc = resolve_stream(stream, out); rc != ACL_SUCCESS) return rc;
  return (*out)->is_default ? ACL_ERROR_INVALID_PARAM : ACL_SUCCESS;
}

aclError destroy_stream(aclrtStream stream, bool force) {
  Runtime &r = runtime();
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = check_user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::StreamDestroy);
  rq.stream = s->id;
  rq.flags = force ? 1 : 0;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  {
    std::lock_guard<std::mutex> g(r.mu);
    r.streams.erase(s);
    delete s;
  }
  flush_stream_prints(stream);  // ascendc_launch.cpp: kernels' output whose host function was dropped
  return ACL_SUCCESS;
}

struct EventState {
  uint64_t completed;
  uint64_t timestamp_ns;
};

int32_t query_event(EventObj *e, EventState *out) {
  proto::Request rq = wire::request(proto::Op::EventQuery);
  rq.event = e->id;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  *out = EventState{rp.value[0], rp.value[1]};
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtCreateStream(aclrtStream *stream) {
  if (stream == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  int32_t d;
  if (aclError rc = active_device(r, &d); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::StreamCreate);
  rq.device = d;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  auto *s = new StreamObj{static_cast<uint32_t>(rp.value[0]), d, false};
  std::lock_guard<std::mutex> g(r.mu);
  s->ctx = owning_context(r);
  r.streams.insert(s);
  *stream = s;
  return ACL_SUCCESS;
}

aclError aclrtDestroyStream(aclrtStream stream) { return destroy_stream(stream, false); }

aclError aclrtDestroyStreamForce(aclrtStream stream) { return destroy_stream(stream, true); }

aclError aclrtSynchronizeStream(aclrtStream stream) { return aclrtSynchronizeStreamWithTimeout(stream, -1); }

// timeout: -1 waits for ever, else ms (0: is it done now?); ACL_ERROR_RT_STREAM_SYNC_TIMEOUT
// when the stream is still busy then (its work stays queued).
aclError aclrtSynchronizeStreamWithTimeout(aclrtStream stream, int32_t timeout) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeStreamWithTimeout: timeout is -1 or >= 0 ms");
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::StreamSync);
  rq.stream = s->id;
  if (timeout >= 0) {
    rq.flags = proto::kSyncTimed;
    rq.timeout_ms = timeout;
  }
  int32_t rc = runtime().pool.call(rq);
  if (rc == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) return note_error(rc, "aclrtSynchronizeStreamWithTimeout: the stream's work did not finish in " + std::to_string(timeout) + " ms");
  if (rc != ACL_SUCCESS) report_task_exception(s->device, s->public_id, rc);  // a task on it failed
  return rc;
}

aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) { return aclrtStreamWaitEventWithTimeout(stream, event, 0); }

// timeout: ms the stream waits at most (0: for ever); past it the stream fails with
// ACL_ERROR_RT_STREAM_SYNC_TIMEOUT, reported by its next synchronize.
aclError aclrtStreamWaitEventWithTimeout(aclrtStream stream, aclrtEvent event, int32_t timeout) {
  if (timeout < 0) return note_error(ACL_ERROR_RT_PARAM_INVALID, "aclrtStreamWaitEventWithTimeout: timeout is >= 0 ms");
  CallScope scope;
  StreamObj *s = nullptr;
  EventObj *e = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = check_event(event, &e); rc != ACL_SUCCESS) return rc;
  proto::Task t{};
  t.kind = proto::TaskKind::WaitEvent;
  t.event = e->id;
  t.m = static_cast<uint64_t>(timeout);
  {
    // Waits for the latest record queued so far; an event never recorded is waited for forever.
    std::lock_guard<std::mutex> g(runtime().mu);
    t.target = wait_target(e);
  }
  return submit(t, s);
}

aclError aclrtCreateEvent(aclrtEvent *event) {
  if (event == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return ACL_ERROR_UNINITIALIZE;
  }
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(wire::request(proto::Op::EventCreate), &rp); rc != ACL_SUCCESS) return rc;
  auto *e = new EventObj{static_cast<uint32_t>(rp.value[0]), current_device(), 0, 0, 0};
  std::lock_guard<std::mutex> g(r.mu);
  e->ctx = owning_context(r);
  r.events.insert(e);
  *event = e;
  return ACL_SUCCESS;
}

aclError aclrtDestroyEvent(aclrtEvent event) {
  Runtime &r = runtime();
  CallScope scope;
  EventObj *e = nullptr;
  if (int32_t rc = check_event(event, &e); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::EventDestroy);
  rq.event = e->id;
  if (int32_t rc = r.pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(r.mu);
  r.events.erase(e);
  delete e;
  return ACL_SUCCESS;
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
  CallScope scope;
  StreamObj *s = nullptr;
  EventObj *e = nullptr;
  if (int32_t rc = check_event(event, &e); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Task t{};
  t.kind = proto::TaskKind::RecordEvent;
  t.event = e->id;
  std::lock_guard<std::mutex> g(runtime().mu);  // keeps records in queue order across threads
  int32_t rc = submit(t, s);
  if (rc == ACL_SUCCESS && !capturing(s)) {  // a captured record counts when the model runs
    ++e->records;
    e->reset = false;
  }
  return rc;
}

aclError aclrtSynchronizeEvent(aclrtEvent event) { return aclrtSynchronizeEventWithTimeout(event, -1); }

// timeout: -1 waits for ever, else ms; ACL_ERROR_RT_EVENT_SYNC_TIMEOUT when not completed by then.
aclError aclrtSynchronizeEventWithTimeout(aclrtEvent event, int32_t timeout) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSynchronizeEventWithTimeout: timeout is -1 or >= 0 ms");
  CallScope scope;
  EventObj *e = nullptr;
  if (int32_t rc = check_event(event, &e); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::EventSync);
  rq.event = e->id;
  if (timeout >= 0) {
    rq.flags = proto::kSyncTimed;
    rq.timeout_ms = timeout;
  }
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (e->records == 0 || e->reset) return ACL_SUCCESS;  // nothing recorded: nothing to wait for
    rq.value[0] = e->records;
  }
  return runtime().pool.call(rq);
}

aclError aclrtEventElapsedTime(float *ms, aclrtEvent startEvent, aclrtEvent endEvent) {
  if (ms == nullptr) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  EventObj *a = nullptr, *b = nullptr;
  if (int32_t rc = check_event(startEvent, &a); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = check_event(endEvent, &b); rc != ACL_SUCCESS) return rc;
  EventState sa{}, sb{};
  if (int32_t rc = query_event(a, &sa); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = query_event(b, &sb); rc != ACL_SUCCESS) return rc;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (sa.completed == 0 || sb.completed == 0 || sa.completed < a->records || sb.completed < b->records)
      return ACL_ERROR_RT_EVENT_NOT_COMPLETE;
  }
  if (sb.timestamp_ns < sa.timestamp_ns) return ACL_ERROR_RT_EVENT_TIMESTAMP_REVERSAL;
  *ms = static_cast<float>(static_cast<double>(sb.timestamp_ns - sa.timestamp_ns) / 1e6);
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot: streams and events get new daemon ids behind the same handles; a recorded event
// stays recorded (its completed count and timestamp are saved).
namespace {

template <typename T>
std::vector<T *> snapshot_of(const std::set<T *> &live) {
  std::lock_guard<std::mutex> g(runtime().mu);
  return std::vector<T *>(live.begin(), live.end());
}

// A failed async task is reported by the stream's next synchronize (and, with
// ACL_STOP_ON_FAILURE, holds the stream until then): that pending failure goes with the stream.
int32_t backup_streams(const SnapshotPass &) {
  for (StreamObj *s : snapshot_of(runtime().streams)) {
    proto::Request rq = wire::request(proto::Op::StreamError);
    rq.stream = s->id;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    s->pending_error = static_cast<int32_t>(rp.value[0]);
  }
  return ACL_SUCCESS;
}

int32_t restore_streams(const SnapshotPass &) {
  for (StreamObj *s : snapshot_of(runtime().streams)) {
    proto::Request rq = wire::request(proto::Op::StreamCreate);
    rq.device = s->device;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    s->id = static_cast<uint32_t>(rp.value[0]);
    if (s->failure_mode == ACL_STOP_ON_FAILURE) {  // the daemon's half of the stream's settings
      proto::Request fm = wire::request(proto::Op::StreamFailureMode);
      fm.stream = s->id;
      fm.flags = 1;
      if (runtime().pool.call(fm) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    if (s->pending_error != ACL_SUCCESS) {
      proto::Request pe = wire::request(proto::Op::StreamError);
      pe.stream = s->id;
      pe.flags = 1;
      pe.value[0] = static_cast<uint64_t>(static_cast<uint32_t>(s->pending_error));
      if (runtime().pool.call(pe) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
  }
  return ACL_SUCCESS;
}

int32_t backup_events(const SnapshotPass &) {
  for (EventObj *e : snapshot_of(runtime().events)) {
    EventState st{};
    if (query_event(e, &st) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    e->completed = st.completed;
    e->timestamp_ns = st.timestamp_ns;
  }
  return ACL_SUCCESS;
}

int32_t restore_events(const SnapshotPass &) {
  for (EventObj *e : snapshot_of(runtime().events)) {
    proto::Request rq = wire::request(proto::Op::EventCreate);
    rq.value[0] = e->completed;
    rq.value[1] = e->timestamp_ns;
    proto::Reply rp{};
    if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    e->id = static_cast<uint32_t>(rp.value[0]);
    e->records = e->completed;
  }
  return ACL_SUCCESS;
}

const ResourceKind kStreams{"streams", 30, nullptr, backup_streams, restore_streams, nullptr,
                            [] { return runtime().streams.size(); }};
const ResourceKind kEvents{"events", 40, nullptr, backup_events, restore_events, nullptr,
                           [] { return runtime().events.size(); }};
NPUSIM_RESOURCE_KIND(kStreams);
NPUSIM_RESOURCE_KIND(kEvents);

}  // namespace

extern "C" {

// A captured record or wait is performed by the model when it runs, on the real event, whatever
// the flag (npusim has no capture-internal events), so both flags come down to the plain calls.
aclError aclrtRecordEventWithFlag(aclrtEvent event, aclrtStream stream, uint32_t flag) {
  if (flag != ACL_EVENT_RECORD_DEFAULT && flag != ACL_EVENT_RECORD_EXTERNAL) return ACL_ERROR_INVALID_PARAM;
  return aclrtRecordEvent(event, stream);
}

// cann-kernel-host: CANN wants the stream's tasks that use the event finished before a reset (the
// caller's duty), so the reset takes effect at once: the event reads as not recorded, and a wait
// queued from now on waits for its next record.
aclError aclrtResetEvent(aclrtEvent event, aclrtStream stream) {
  CallScope scope;
  StreamObj *s = nullptr;
  EventObj *e = nullptr;
  if (int32_t rc = check_event(event, &e); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  e->reset = true;
  return ACL_SUCCESS;
}

aclError aclrtStreamWaitEventWithFlag(aclrtStream stream, aclrtEvent event, uint32_t timeout, uint32_t flag) {
  if (flag != ACL_EVENT_WAIT_DEFAULT && flag != ACL_EVENT_WAIT_EXTERNAL) return ACL_ERROR_INVALID_PARAM;
  if (timeout != 0 && flag == ACL_EVENT_WAIT_EXTERNAL) return ACL_ERROR_INVALID_PARAM;
  if (timeout > static_cast<uint32_t>(INT32_MAX)) return ACL_ERROR_RT_PARAM_INVALID;
  return aclrtStreamWaitEventWithTimeout(stream, event, static_cast<int32_t>(timeout));
}

}  // extern "C"

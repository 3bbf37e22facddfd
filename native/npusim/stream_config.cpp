// Stream and event configuration and queries: priorities, flags, failure mode, stable stream ids,
// stream config handles, event flags, event status and timestamps. The settings live on the
// handles (runtime.h), so a checkpoint keeps them; the failure mode also lives on the daemon's
// stream, and the streams kind sends it again after a restore.
#include <atomic>
#include <chrono>
#include <thread>

#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr uint32_t kMaxPriority = 7;  // CANN: 0 (highest) .. 7
constexpr uint32_t kStreamFlags = ACL_STREAM_FAST_LAUNCH | ACL_STREAM_FAST_SYNC | ACL_STREAM_PERSISTENT |
                                  ACL_STREAM_HUGE | ACL_STREAM_CPU_SCHEDULE | ACL_STREAM_DEVICE_USE_ONLY;
constexpr uint32_t kEventFlags = ACL_EVENT_SYNC | ACL_EVENT_CAPTURE_STREAM_PROGRESS | ACL_EVENT_TIME_LINE |
                                 ACL_EVENT_DEVICE_USE_ONLY | ACL_EVENT_EXTERNAL | ACL_EVENT_IPC;

aclError create_configured(aclrtStream *stream, uint32_t priority, uint64_t flags, const char *api) {
  if (stream == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": stream is NULL");
  if (priority > kMaxPriority)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": priority must be 0..7");
  if ((flags & ~static_cast<uint64_t>(kStreamFlags)) != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": unknown stream flag");
  if (aclError rc = aclrtCreateStream(stream); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  auto *s = static_cast<StreamObj *>(*stream);
  s->priority = priority;
  s->flags = static_cast<uint32_t>(flags);
  return ACL_SUCCESS;
}

// Reads one setting of a stream (NULL: the current context's default stream).
template <typename T, typename F>
aclError stream_setting(aclrtStream stream, T *out, F field, const char *api) {
  if (out == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": output is NULL");
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, api); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  *out = field(*s);
  return ACL_SUCCESS;
}

aclError event_of(aclrtEvent event, EventObj **out, const char *api) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, std::string(api) + ": aclInit was not called");
  auto *e = static_cast<EventObj *>(event);
  if (e == nullptr || r.events.count(e) == 0)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": not a live event");
  *out = e;
  return ACL_SUCCESS;
}

struct EventNow {
  uint64_t completed, timestamp_ns, records;
  bool reset;
};

aclError event_now(EventObj *e, EventNow *out) {
  proto::Request rq = wire::request(proto::Op::EventQuery);
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    rq.event = e->id;
    out->records = e->records;
    out->reset = e->reset;
  }
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  out->completed = rp.value[0];
  out->timestamp_ns = rp.value[1];
  return ACL_SUCCESS;
}

aclError create_event(aclrtEvent *event, uint32_t flag, const char *api) {
  if (event == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": event is NULL");
  if (flag == 0 || (flag & ~kEventFlags) != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": unknown event flag");
  // ACL_EVENT_IPC: such an event may be shared by aclrtIpcGetEventHandle (ipc_event_api.cpp).
  if (aclError rc = aclrtCreateEvent(event); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  static_cast<EventObj *>(*event)->flags = flag;
  return ACL_SUCCESS;
}

}  // namespace

aclError npusim::rt::stream_for(aclrtStream stream, StreamObj **out, const char *api) {
  if (aclError rc = resolve_stream(stream, out); rc != ACL_SUCCESS)
    return note_error(rc, std::string(api) + ": " + recent_error());
  return ACL_SUCCESS;
}

extern "C" {

aclError aclrtCreateStreamWithConfig(aclrtStream *stream, uint32_t priority, uint32_t flag) {
  return create_configured(stream, priority, flag, "aclrtCreateStreamWithConfig");
}

aclrtStreamConfigHandle *aclrtCreateStreamConfigHandle(void) { return new (std::nothrow) aclrtStreamConfigHandle{}; }

aclError aclrtDestroyStreamConfigHandle(aclrtStreamConfigHandle *handle) {
  if (handle == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyStreamConfigHandle: handle is NULL");
  delete handle;
  return ACL_SUCCESS;
}

aclError aclrtSetStreamConfigOpt(aclrtStreamConfigHandle *handle, aclrtStreamConfigAttr attr, const void *attrValue,
                                 size_t valueSize) {
  if (handle == nullptr || attrValue == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamConfigOpt: NULL argument");
  // Integers arrive as 4 or 8 bytes (CANN accepts either width for the flag and priority).
  auto as_u64 = [&](uint64_t *v) {
    if (valueSize == sizeof(uint32_t)) *v = *static_cast<const uint32_t *>(attrValue);
    else if (valueSize == sizeof(uint64_t)) *v = *static_cast<const uint64_t *>(attrValue);
    else return false;
    return true;
  };
  uint64_t v = 0;
  switch (attr) {
    case ACL_RT_STREAM_WORK_ADDR_PTR:
      if (valueSize != sizeof(void *)) break;
      handle->workptr = *static_cast<void *const *>(attrValue);
      return ACL_SUCCESS;
    case ACL_RT_STREAM_WORK_SIZE:
      if (!as_u64(&v)) break;
      handle->workSize = v;
      return ACL_SUCCESS;
    case ACL_RT_STREAM_FLAG:
      if (!as_u64(&v)) break;
      handle->flag = v;
      return ACL_SUCCESS;
    case ACL_RT_STREAM_PRIORITY:
      if (!as_u64(&v) || v > kMaxPriority) break;
      handle->priority = static_cast<uint32_t>(v);
      return ACL_SUCCESS;
  }
  return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamConfigOpt: bad attribute, value or size");
}

aclError aclrtCreateStreamV2(aclrtStream *stream, const aclrtStreamConfigHandle *handle) {
  if (handle == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateStreamV2: handle is NULL");
  return create_configured(stream, handle->priority, handle->flag, "aclrtCreateStreamV2");
}

aclError aclrtStreamGetPriority(aclrtStream stream, uint32_t *priority) {
  return stream_setting(stream, priority, [](StreamObj &s) { return s.priority; }, "aclrtStreamGetPriority");
}

aclError aclrtStreamGetFlags(aclrtStream stream, uint32_t *flags) {
  return stream_setting(stream, flags, [](StreamObj &s) { return s.flags; }, "aclrtStreamGetFlags");
}

aclError aclrtStreamGetId(aclrtStream stream, int32_t *streamId) {
  // The daemon's id changes on restore; the application sees one that does not.
  static std::atomic<int32_t> next_id{1};
  return stream_setting(stream, streamId, [](StreamObj &s) {
    if (s.public_id < 0) s.public_id = next_id++;
    return s.public_id;
  }, "aclrtStreamGetId");
}

aclError aclrtSetStreamFailureMode(aclrtStream stream, uint64_t mode) {
  if (stream == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: not on the default stream");
  if (mode != ACL_CONTINUE_ON_FAILURE && mode != ACL_STOP_ON_FAILURE)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: mode must be ACL_CONTINUE_ON_FAILURE or ACL_STOP_ON_FAILURE");
  CallScope scope;
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtSetStreamFailureMode"); rc != ACL_SUCCESS) return rc;
  if (s->is_default)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetStreamFailureMode: not on the default stream");
  proto::Request rq = wire::request(proto::Op::StreamFailureMode);
  rq.stream = s->id;
  rq.flags = mode == ACL_STOP_ON_FAILURE ? 1 : 0;
  if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  s->failure_mode = mode;
  return ACL_SUCCESS;
}

aclError aclrtStreamQuery(aclrtStream stream, aclrtStreamStatus *status) {
  if (status == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtStreamQuery: status is NULL");
  CallScope scope;
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtStreamQuery"); rc != ACL_SUCCESS) return rc;
  // Records a private event and asks whether the stream has reached it.
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(wire::request(proto::Op::EventCreate), &rp); rc != ACL_SUCCESS) return rc;
  const uint32_t probe = static_cast<uint32_t>(rp.value[0]);
  proto::Task t{};
  t.kind = proto::TaskKind::RecordEvent;
  t.event = probe;
  int32_t rc = submit(t, s);
  // An idle stream's worker takes a moment to reach the probe: ask a few times before saying
  // NOT_READY (a query may always report NOT_READY for a stream about to finish).
  for (int i = 0; rc == ACL_SUCCESS && i < 50; ++i) {
    proto::Request q = wire::request(proto::Op::EventQuery);
    q.event = probe;
    rc = runtime().pool.call(q, &rp);
    if (rc != ACL_SUCCESS || rp.value[0] >= 1) break;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  proto::Request d = wire::request(proto::Op::EventDestroy);
  d.event = probe;
  runtime().pool.call(d);
  if (rc != ACL_SUCCESS) return rc;
  *status = rp.value[0] >= 1 ? ACL_STREAM_STATUS_COMPLETE : ACL_STREAM_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtCreateEventWithFlag(aclrtEvent *event, uint32_t flag) {
  return create_event(event, flag, "aclrtCreateEventWithFlag");
}

aclError aclrtCreateEventExWithFlag(aclrtEvent *event, uint32_t flag) {
  return create_event(event, flag, "aclrtCreateEventExWithFlag");
}

aclError aclrtQueryEventStatus(aclrtEvent event, aclrtEventRecordedStatus *status) {
  if (status == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtQueryEventStatus: status is NULL");
  CallScope scope;
  EventObj *e = nullptr;
  if (aclError rc = event_of(event, &e, "aclrtQueryEventStatus"); rc != ACL_SUCCESS) return rc;
  EventNow now{};
  if (aclError rc = event_now(e, &now); rc != ACL_SUCCESS) return rc;
  *status = now.completed >= now.records && !now.reset ? ACL_EVENT_RECORDED_STATUS_COMPLETE
                                                       : ACL_EVENT_RECORDED_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtQueryEvent(aclrtEvent event, aclrtEventStatus *status) {
  if (status == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtQueryEvent: status is NULL");
  aclrtEventRecordedStatus st;
  if (aclError rc = aclrtQueryEventStatus(event, &st); rc != ACL_SUCCESS) return rc;
  *status = st == ACL_EVENT_RECORDED_STATUS_COMPLETE ? ACL_EVENT_STATUS_COMPLETE : ACL_EVENT_STATUS_NOT_READY;
  return ACL_SUCCESS;
}

aclError aclrtEventGetTimestamp(aclrtEvent event, uint64_t *timestamp) {
  if (timestamp == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtEventGetTimestamp: timestamp is NULL");
  CallScope scope;
  EventObj *e = nullptr;
  if (aclError rc = event_of(event, &e, "aclrtEventGetTimestamp"); rc != ACL_SUCCESS) return rc;
  EventNow now{};
  if (aclError rc = event_now(e, &now); rc != ACL_SUCCESS) return rc;
  if (now.records == 0 || now.reset || now.completed < now.records)
    return note_error(ACL_ERROR_RT_EVENT_NOT_COMPLETE, "aclrtEventGetTimestamp: the event's last record has not run");
  *timestamp = now.timestamp_ns / 1000;  // CANN reports microseconds
  return ACL_SUCCESS;
}

}  // extern "C"

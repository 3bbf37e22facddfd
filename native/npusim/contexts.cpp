// Contexts: aclrtCreateContext / DestroyContext / SetCurrentContext / GetCurrentContext and the
// default stream of the current context. A context is a client object; what it owns on the
// daemon (its default stream, streams and events) is carried by the streams and events kinds, and
// each thread's current context is a pointer in this process's memory, so a checkpoint keeps it.
#include "contexts.h"

#include <set>
#include <vector>

#include "resources.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

thread_local ContextObj *t_ctx = nullptr;

// Guarded by runtime().mu.
std::set<ContextObj *> &live_contexts() {
  static auto *s = new std::set<ContextObj *>;
  return *s;
}

std::map<int32_t, ContextObj *> &default_contexts() {
  static auto *m = new std::map<int32_t, ContextObj *>;
  return *m;
}

void end_context(ContextObj *c) {
  c->alive = false;
  live_contexts().erase(c);
  if (c->is_default) default_contexts().erase(c->device);
}

// Frees on the daemon, then here, what a destroyed context owned. No lock held.
void free_owned(ContextObj *c) {
  Runtime &r = runtime();
  std::vector<StreamObj *> streams;
  std::vector<EventObj *> events;
  {
    std::lock_guard<std::mutex> g(r.mu);
    for (StreamObj *s : r.streams)
      if (s->ctx == c) streams.push_back(s);
    for (EventObj *e : r.events)
      if (e->ctx == c) events.push_back(e);
  }
  for (StreamObj *s : streams) {
    proto::Request rq = wire::request(proto::Op::StreamDestroy);
    rq.stream = s->id;
    rq.flags = 1;
    r.pool.call(rq);
  }
  for (EventObj *e : events) {
    proto::Request rq = wire::request(proto::Op::EventDestroy);
    rq.event = e->id;
    r.pool.call(rq);
  }
  std::lock_guard<std::mutex> g(r.mu);
  for (StreamObj *s : streams) {
    r.streams.erase(s);
    delete s;
  }
  for (EventObj *e : events) {
    r.events.erase(e);
    delete e;
  }
}

}  // namespace

namespace npusim::rt {

ContextObj *thread_context() {
  ContextObj *c = t_ctx;
  return c != nullptr && c->alive ? c : nullptr;
}

void set_thread_context(ContextObj *ctx) { t_ctx = ctx; }

ContextObj *owning_context(Runtime &r) {
  if (ContextObj *c = thread_context()) return c;
  auto it = default_contexts().find(current_device());
  (void)r;
  return it == default_contexts().end() ? nullptr : it->second;
}

ContextObj *make_default_context(Runtime &, int32_t device, StreamObj *default_stream) {
  auto *c = new ContextObj{device, default_stream, true};
  default_stream->ctx = c;
  live_contexts().insert(c);
  default_contexts()[device] = c;
  return c;
}

void end_contexts(Runtime &, int32_t device) {
  std::vector<ContextObj *> ended;
  for (ContextObj *c : live_contexts())
    if (device < 0 || c->device == device) ended.push_back(c);
  for (ContextObj *c : ended) end_context(c);
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtCreateContext(aclrtContext *context, int32_t deviceId) {
  if (context == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateContext: context is NULL");
  Runtime &r = runtime();
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtCreateContext: aclInit was not called");
    if (deviceId < 0 || static_cast<uint32_t>(deviceId) >= r.pool.device_count)
      return note_error(ACL_ERROR_RT_INVALID_DEVICEID, "aclrtCreateContext: no device " + std::to_string(deviceId));
  }
  // The device opens implicitly (CANN): a reference that aclrtDestroyContext gives back.
  const int32_t before = current_device();
  ContextObj *before_ctx = thread_context();
  if (aclError rc = aclrtSetDevice(deviceId); rc != ACL_SUCCESS) return rc;
  CallScope scope;
  proto::Request rq = wire::request(proto::Op::StreamCreate);
  rq.device = deviceId;
  proto::Reply rp{};
  if (int32_t rc = r.pool.call(rq, &rp); rc != ACL_SUCCESS) {
    aclrtResetDevice(deviceId);
    set_thread_device(before);
    set_thread_context(before_ctx);
    return rc;
  }
  std::lock_guard<std::mutex> g(r.mu);
  auto *s = new StreamObj{static_cast<uint32_t>(rp.value[0]), deviceId, true};
  auto *c = new ContextObj{deviceId, s, false};
  s->ctx = c;
  r.streams.insert(s);
  live_contexts().insert(c);
  set_thread_context(c);  // the new context is current for the calling thread
  *context = c;
  return ACL_SUCCESS;
}

aclError aclrtDestroyContext(aclrtContext context) {
  Runtime &r = runtime();
  auto *c = static_cast<ContextObj *>(context);
  int32_t device;
  {
    CallScope scope;
    std::lock_guard<std::mutex> g(r.mu);
    if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtDestroyContext: aclInit was not called");
    if (c == nullptr || live_contexts().count(c) == 0)
      return note_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyContext: not a live context");
    if (c->is_default)
      return note_error(ACL_ERROR_INVALID_PARAM,
                        "aclrtDestroyContext: a device's default context ends with aclrtResetDevice");
    end_context(c);
    device = c->device;
  }
  {
    CallScope scope;
    free_owned(c);
  }
  if (thread_context() == nullptr && t_ctx == c) set_thread_context(nullptr);
  return aclrtResetDevice(device);  // the reference aclrtCreateContext took
}

aclError aclrtSetCurrentContext(aclrtContext context) {
  Runtime &r = runtime();
  auto *c = static_cast<ContextObj *>(context);
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtSetCurrentContext: aclInit was not called");
  if (c == nullptr || live_contexts().count(c) == 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetCurrentContext: not a live context");
  set_thread_context(c);
  set_thread_device(c->device);
  return ACL_SUCCESS;
}

aclError aclrtGetCurrentContext(aclrtContext *context) {
  if (context == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetCurrentContext: context is NULL");
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtGetCurrentContext: aclInit was not called");
  ContextObj *c = owning_context(r);
  if (c == nullptr) return note_error(ACL_ERROR_RT_CONTEXT_NULL, "aclrtGetCurrentContext: no current context");
  *context = c;
  return ACL_SUCCESS;
}

aclError aclrtCtxGetCurrentDefaultStream(aclrtStream *stream) {
  if (stream == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCtxGetCurrentDefaultStream: stream is NULL");
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  if (!r.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclrtCtxGetCurrentDefaultStream: aclInit was not called");
  ContextObj *c = owning_context(r);
  if (c == nullptr) return note_error(ACL_ERROR_RT_CONTEXT_NULL, "aclrtCtxGetCurrentDefaultStream: no current context");
  *stream = c->default_stream;
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot kind "contexts": nothing lives on the daemon but what the streams and events kinds
// re-create; Restore checks that each context's device exists on the daemon now answering.
namespace {

int32_t restore_contexts(const SnapshotPass &) {
  Runtime &r = runtime();
  std::lock_guard<std::mutex> g(r.mu);
  for (ContextObj *c : live_contexts())
    if (static_cast<uint32_t>(c->device) >= r.pool.device_count) {
      note_error("snapshot: contexts: device " + std::to_string(c->device) + " is missing on the daemon");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
  return ACL_SUCCESS;
}

const ResourceKind kContexts{"contexts", 20, nullptr, nullptr, restore_contexts, nullptr,
                             [] { return live_contexts().size(); }};
NPUSIM_RESOURCE_KIND(kContexts);

}  // namespace

// Host callbacks: aclrtLaunchHostFunc, aclrtLaunchCallback with aclrtSubscribeReport /
// aclrtProcessReport, and aclrtSubscribeHostFunc / aclrtProcessHostFunc.
//
// A stream cannot call into the process, so each stream with callbacks gets a channel: two daemon
// events, "reached" and "done". A launch queues a record of "reached" on the stream and, when the
// callback blocks the stream, a wait for the next record of "done". The channel's dispatcher
// thread waits until the stream has reached the callback, runs it (or hands it to the subscribed
// thread and waits for that thread to run it), then signals "done", and the stream goes on.
//
// Snapshot kind "callbacks": Lock's drain lets every reached callback run (the dispatcher is not
// held at the gate); queued callbacks that the subscribed thread has not run yet are plain memory
// and survive as they are. Backup saves the channels' event counts, Restore re-creates the events.
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <thread>

#include "acl/acl_rt.h"
#include "resources.h"
#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

enum class Via { Report, HostFunc };

struct Callback {
  void (*fn)(void *);
  void *arg;
  bool blocking;
  Via via;
  uint64_t reached;  // the record of "reached" that marks this callback on the stream
  bool ran = false;
};

struct Channel {
  uint64_t epoch = 0;                          // the aclInit its events belong to
  uint32_t reached_event = 0, done_event = 0;  // daemon ids, new after a restore
  uint64_t reached_records = 0;                // records of "reached" queued so far
  uint64_t reached_saved = 0, done_saved = 0;  // completed counts saved by Backup
  std::deque<std::shared_ptr<Callback>> pending;  // launched, in stream order, not yet dispatched
  bool busy = false;                              // the dispatcher holds one between the two
};

struct State {
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::map<StreamObj *, std::unique_ptr<Channel>> channels;
  std::map<std::pair<Via, StreamObj *>, uint64_t> subscriptions;  // (kind, stream) -> thread
  std::map<std::pair<Via, uint64_t>, std::deque<std::shared_ptr<Callback>>> handed;  // per thread
};

// Never destroyed: dispatchers wait on cv until the process ends (a destroyed condition variable
// with waiters blocks exit).
State &state() {
  static State *s = new State;
  return *s;
}

std::mutex &mu = state().mu;
std::condition_variable &cv = state().cv;
auto &channels = state().channels;
auto &subscriptions = state().subscriptions;
auto &handed = state().handed;

uint64_t self() { return static_cast<uint64_t>(::pthread_self()); }

int32_t daemon_event_create(uint64_t completed, uint32_t *id) {
  proto::Request rq = wire::request(proto::Op::EventCreate);
  rq.value[0] = completed;
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp); rc != ACL_SUCCESS) return rc;
  *id = static_cast<uint32_t>(rp.value[0]);
  return ACL_SUCCESS;
}

void run_or_hand(Channel &ch, StreamObj *stream, const std::shared_ptr<Callback> &cb, std::unique_lock<std::mutex> &l) {
  auto sub = subscriptions.find({cb->via, stream});
  if (sub == subscriptions.end()) {  // a host function of a stream no thread subscribed: run it here
    l.unlock();
    cb->fn(cb->arg);
    l.lock();
    cb->ran = true;
    return;
  }
  handed[{cb->via, sub->second}].push_back(cb);
  cv.notify_all();
  if (cb->blocking) cv.wait(l, [&] { return cb->ran; });
  (void)ch;
}

void dispatcher(StreamObj *stream, Channel *ch) {
  std::unique_lock<std::mutex> l(mu);
  for (;;) {
    cv.wait(l, [&] { return !ch->pending.empty(); });
    std::shared_ptr<Callback> cb = ch->pending.front();
    ch->pending.pop_front();
    ch->busy = true;
    proto::Request wait = wire::request(proto::Op::EventSync);
    wait.event = ch->reached_event;
    wait.value[0] = cb->reached;
    l.unlock();
    // Not behind the snapshot gate: Lock's drain needs the stream to get past this callback.
    int32_t rc = runtime().pool.call(wait);
    l.lock();
    if (rc == ACL_SUCCESS) run_or_hand(*ch, stream, cb, l);
    // Every callback signals "done" once, so the n-th signal is the n-th callback's (a blocking
    // one waits for it; a non-blocking one was handed over and the stream never waited).
    proto::Request done = wire::request(proto::Op::EventSignal);
    done.event = ch->done_event;
    l.unlock();
    runtime().pool.call(done);
    l.lock();
    ch->busy = false;
    cv.notify_all();
  }
}

uint64_t current_epoch() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return runtime().epoch;
}

// The stream's channel, made (events and dispatcher) on first use, its events made again after
// aclFinalize and aclInit (epoch: current_epoch(), read before mu: runtime().mu comes first).
// With mu held.
int32_t channel_of(StreamObj *s, uint64_t epoch, Channel **out) {
  auto make_events = [&](Channel &ch) {
    ch.reached_records = 0;
    ch.epoch = epoch;
    int32_t rc = daemon_event_create(0, &ch.reached_event);
    return rc != ACL_SUCCESS ? rc : daemon_event_create(0, &ch.done_event);
  };
  auto it = channels.find(s);
  if (it != channels.end()) {
    *out = it->second.get();
    return it->second->epoch == epoch ? ACL_SUCCESS : make_events(*it->second);
  }
  auto ch = std::make_unique<Channel>();
  if (int32_t rc = make_events(*ch); rc != ACL_SUCCESS) return rc;
  *out = ch.get();
  std::thread(dispatcher, s, ch.get()).detach();  // lives as long as the process
  channels[s] = std::move(ch);
  return ACL_SUCCESS;
}

aclError launch(aclrtStream stream, void (*fn)(void *), void *arg, bool blocking, Via via, const char *api) {
  if (fn == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": fn is NULL");
  CallScope scope;
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, api); rc != ACL_SUCCESS) return rc;
  const uint64_t epoch = current_epoch();
  std::lock_guard<std::mutex> g(mu);
  if (via == Via::Report && subscriptions.count({Via::Report, s}) == 0)
    return note_error(ACL_ERROR_RT_STREAM_SUBSCRIBE,
                      std::string(api) + ": no thread subscribed to this stream (aclrtSubscribeReport)");
  Channel *ch = nullptr;
  if (int32_t rc = channel_of(s, epoch, &ch); rc != ACL_SUCCESS) return rc;
  proto::Task reach{};
  reach.kind = proto::TaskKind::RecordEvent;
  reach.event = ch->reached_event;
  if (int32_t rc = submit(reach, s); rc != ACL_SUCCESS) return rc;
  const uint64_t n = ++ch->reached_records;
  if (blocking) {
    proto::Task hold{};
    hold.kind = proto::TaskKind::WaitEvent;
    hold.event = ch->done_event;
    hold.target = n;
    if (int32_t rc = submit(hold, s); rc != ACL_SUCCESS) return rc;
  }
  ch->pending.push_back(std::make_shared<Callback>(Callback{fn, arg, blocking, via, n}));
  cv.notify_all();
  return ACL_SUCCESS;
}

aclError subscribe(Via via, uint64_t thread, aclrtStream stream, const char *api) {
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, api); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(mu);
  if (!subscriptions.emplace(std::make_pair(via, s), thread).second)
    return note_error(ACL_ERROR_REPEAT_SUBSCRIBE, std::string(api) + ": the stream is subscribed already");
  return ACL_SUCCESS;
}

aclError unsubscribe(Via via, uint64_t thread, aclrtStream stream, const char *api) {
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, api); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(mu);
  auto it = subscriptions.find({via, s});
  if (it == subscriptions.end() || it->second != thread)
    return note_error(ACL_ERROR_STREAM_NOT_SUBSCRIBE, std::string(api) + ": the stream is not subscribed to that thread");
  subscriptions.erase(it);
  return ACL_SUCCESS;
}

aclError process(Via via, int32_t timeout, const char *api) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": timeout must be -1 or >= 0");
  const uint64_t me = self();
  std::unique_lock<std::mutex> l(mu);
  bool subscribed = false;
  for (auto &[key, thread] : subscriptions)
    if (key.first == via && thread == me) subscribed = true;
  auto &queue = handed[{via, me}];
  if (!subscribed && queue.empty())
    return note_error(ACL_ERROR_THREAD_NOT_SUBSCRIBE, std::string(api) + ": no stream is subscribed to this thread");
  auto ready = [&] { return !queue.empty(); };
  if (timeout < 0) cv.wait(l, ready);
  else if (!cv.wait_for(l, std::chrono::milliseconds(timeout), ready))
    return note_error(ACL_ERROR_WAIT_CALLBACK_TIMEOUT, std::string(api) + ": no callback within the timeout");
  std::shared_ptr<Callback> cb = queue.front();
  queue.pop_front();
  l.unlock();
  cb->fn(cb->arg);
  l.lock();
  cb->ran = true;
  cv.notify_all();
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtLaunchHostFunc(aclrtStream stream, aclrtHostFunc fn, void *args) {
  return launch(stream, fn, args, true, Via::HostFunc, "aclrtLaunchHostFunc");
}

aclError aclrtLaunchCallback(aclrtCallback fn, void *userData, aclrtCallbackBlockType blockType, aclrtStream stream) {
  if (blockType != ACL_CALLBACK_NO_BLOCK && blockType != ACL_CALLBACK_BLOCK)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtLaunchCallback: unknown block type");
  return launch(stream, fn, userData, blockType == ACL_CALLBACK_BLOCK, Via::Report, "aclrtLaunchCallback");
}

aclError aclrtSubscribeReport(uint64_t threadId, aclrtStream stream) {
  return subscribe(Via::Report, threadId, stream, "aclrtSubscribeReport");
}

aclError aclrtUnSubscribeReport(uint64_t threadId, aclrtStream stream) {
  return unsubscribe(Via::Report, threadId, stream, "aclrtUnSubscribeReport");
}

aclError aclrtProcessReport(int32_t timeout) { return process(Via::Report, timeout, "aclrtProcessReport"); }

aclError aclrtSubscribeHostFunc(uint64_t hostFuncThreadId, aclrtStream exeStream) {
  return subscribe(Via::HostFunc, hostFuncThreadId, exeStream, "aclrtSubscribeHostFunc");
}

aclError aclrtUnSubscribeHostFunc(uint64_t hostFuncThreadId, aclrtStream exeStream) {
  return unsubscribe(Via::HostFunc, hostFuncThreadId, exeStream, "aclrtUnSubscribeHostFunc");
}

aclError aclrtProcessHostFunc(int32_t timeout) { return process(Via::HostFunc, timeout, "aclrtProcessHostFunc"); }

}  // extern "C"

namespace {

// At Lock, after the drain: a callback the stream has not reached (its stream was destroyed with
// it queued, say) would wait on an event that no longer advances; refuse rather than carry it.
int32_t check_callbacks(std::string *why) {
  std::unique_lock<std::mutex> l(mu);
  auto idle = [] {
    for (auto &[s, ch] : channels)
      if (ch->busy || !ch->pending.empty()) return false;
    return true;
  };
  if (cv.wait_for(l, std::chrono::seconds(2), idle)) return ACL_SUCCESS;
  size_t n = 0;
  for (auto &[s, ch] : channels) n += ch->pending.size() + (ch->busy ? 1 : 0);
  *why = std::to_string(n) + " host callback(s) launched on a stream that never reaches them";
  return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
}

int32_t backup_callbacks(const SnapshotPass &) {
  std::lock_guard<std::mutex> g(mu);
  for (auto &[s, ch] : channels) {
    for (auto [id, saved] : {std::make_pair(ch->reached_event, &ch->reached_saved),
                             std::make_pair(ch->done_event, &ch->done_saved)}) {
      proto::Request rq = wire::request(proto::Op::EventQuery);
      rq.event = id;
      proto::Reply rp{};
      if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
      *saved = rp.value[0];
    }
  }
  return ACL_SUCCESS;
}

int32_t restore_callbacks(const SnapshotPass &) {
  std::lock_guard<std::mutex> g(mu);
  for (auto &[s, ch] : channels) {
    if (daemon_event_create(ch->reached_saved, &ch->reached_event) != ACL_SUCCESS ||
        daemon_event_create(ch->done_saved, &ch->done_event) != ACL_SUCCESS) {
      note_error("snapshot: callbacks: cannot re-create a stream's callback events");
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
  }
  return ACL_SUCCESS;
}

// Subscriptions plus callbacks launched or handed to a thread and not run yet.
size_t count_callbacks() {
  std::lock_guard<std::mutex> g(mu);
  size_t n = subscriptions.size();
  for (auto &[s, ch] : channels) n += ch->pending.size();
  for (auto &[key, q] : handed) n += q.size();
  return n;
}

const ResourceKind kCallbacks{"callbacks", 70, check_callbacks, backup_callbacks, restore_callbacks, nullptr,
                              count_callbacks};
NPUSIM_RESOURCE_KIND(kCallbacks);

}  // namespace

// Streams and events. Each stream has its own worker thread, so work is FIFO within a stream and
// streams run concurrently, as on a real device. A stream whose head is a WaitEvent stalls until
// the event has completed the record it waits for (forever, if it is never recorded).
#include <time.h>

#include <chrono>

#include "acl/acl_base.h"
#include "builtin_tasks.h"
#include "device_state.h"

namespace npusim::streams {
namespace {

uint64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);  // system-wide: timestamps survive a daemon restart
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

bool head_ready(Session &s, const Work &w) {
  if (w.task.kind == proto::TaskKind::WaitNotify) {
    auto it = s.notifies.find(w.task.event);
    return it == s.notifies.end() || it->second->set;
  }
  if (w.task.kind == proto::TaskKind::ValueWait) return builtin::value_met(w);
  if (w.task.kind != proto::TaskKind::WaitEvent) return true;
  auto it = s.events.find(w.task.event);
  return it == s.events.end() || it->second.done() >= w.task.target;
}

// A notify or an IPC event may be shared with (and set by) another client's session, whose
// streams cannot wake this one's condition variable; a stream whose head waits on one polls it.
constexpr auto kNotifyPoll = std::chrono::milliseconds(1);

bool waits_on_notify(Session &s, const Stream &st) {
  if (st.queue.empty()) return false;
  const proto::Task &t = st.queue.front().task;
  if (t.kind == proto::TaskKind::WaitEvent) {  // an IPC event (another process may record it), or a timed wait
    auto it = s.events.find(t.event);
    return it != s.events.end() && (it->second.ipc != nullptr || t.m != 0);
  }
  return t.kind == proto::TaskKind::WaitNotify;
}

// Runs a notify task at the head of st (s.mu held); false if it is a wait that is not over yet.
// A wait past its timeout (ms; 0 waits forever) fails the stream like a failed task.
bool notify_step(Session &s, Stream &st, std::chrono::steady_clock::time_point since) {
  const proto::Task &t = st.queue.front().task;
  if (t.kind == proto::TaskKind::WaitEvent) {
    if (head_ready(s, st.queue.front())) return true;
    // A timed wait (aclrtStreamWaitEventWithTimeout) past its time fails the stream, as a notify's.
    if (t.m == 0 || std::chrono::steady_clock::now() - since < std::chrono::milliseconds(t.m)) return false;
    if (st.error == ACL_SUCCESS) st.error = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
    return true;
  }
  auto it = s.notifies.find(t.event);
  if (t.kind == proto::TaskKind::RecordNotify) {
    if (it != s.notifies.end()) it->second->set = true;
    return true;
  }
  if (it == s.notifies.end() || it->second->set.exchange(false)) return true;
  if (t.target != 0 && std::chrono::steady_clock::now() - since >= std::chrono::milliseconds(t.target)) {
    if (st.error == ACL_SUCCESS) st.error = ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
    return true;
  }
  return false;
}

void worker(Session *s, std::shared_ptr<Stream> st) {
  std::unique_lock<std::mutex> l(s->mu);
  for (;;) {
    if (waits_on_notify(*s, *st)) {
      const auto since = std::chrono::steady_clock::now();
      while (!st->cancel && waits_on_notify(*s, *st) && !notify_step(*s, *st, since)) s->cv.wait_for(l, kNotifyPoll);
      if (st->cancel) return;
      if (waits_on_notify(*s, *st)) {  // the wait is over
        st->queue.pop_front();
        ++st->done;
        s->cv.notify_all();
      }
      continue;
    }
    while (!st->cancel && (st->queue.empty() || !head_ready(*s, st->queue.front()))) {
      if (waits_on_notify(*s, *st)) break;  // polled above
      // A value wait is met by any write to device memory, and not every write wakes the stream
      // workers (a synchronous copy does not): look again every millisecond.
      if (!st->queue.empty() && st->queue.front().task.kind == proto::TaskKind::ValueWait)
        s->cv.wait_for(l, std::chrono::milliseconds(1));
      else
        s->cv.wait(l);
    }
    if (st->cancel) return;
    if (waits_on_notify(*s, *st)) continue;
    if (st->queue.front().task.kind == proto::TaskKind::RecordNotify) {
      notify_step(*s, *st, {});
      st->queue.pop_front();
      ++st->done;
      s->cv.notify_all();
      continue;
    }
    Work w = std::move(st->queue.front());
    st->queue.pop_front();
    if (w.task.kind == proto::TaskKind::RecordEvent) {
      auto it = s->events.find(w.task.event);
      if (it != s->events.end()) it->second.complete(now_ns());
    } else if (st->stop_on_failure && st->error != ACL_SUCCESS) {
      // ACL_STOP_ON_FAILURE: nothing runs after a failed task until a synchronize reports it.
    } else if (w.task.kind != proto::TaskKind::WaitEvent) {
      l.unlock();
      int32_t rc = run_work(w);
      w.hold.clear();
      l.lock();
      if (rc != ACL_SUCCESS && st->error == ACL_SUCCESS) st->error = rc;
    }
    ++st->done;
    s->cv.notify_all();
  }
}

std::shared_ptr<Stream> find(Session &s, uint32_t id) {
  auto it = s.streams.find(id);
  return it == s.streams.end() ? nullptr : it->second;
}

// Waits (s.mu held) until st has run everything queued before this call.
// With a deadline: ACL_ERROR_RT_STREAM_SYNC_TIMEOUT once it passed (the work stays queued).
int32_t wait_stream(Session &s, std::unique_lock<std::mutex> &l, const std::shared_ptr<Stream> &st,
                    const std::chrono::steady_clock::time_point *deadline = nullptr) {
  const uint64_t target = st->enqueued;
  auto over = [&] { return st->cancel || st->done >= target; };
  if (deadline == nullptr) s.cv.wait(l, over);
  else if (!s.cv.wait_until(l, *deadline, over)) return ACL_ERROR_RT_STREAM_SYNC_TIMEOUT;
  int32_t rc = st->error;
  st->error = ACL_SUCCESS;
  return rc;
}

}  // namespace

uint32_t create(Session &s, uint32_t device) {
  auto st = std::make_shared<Stream>();
  std::lock_guard<std::mutex> g(s.mu);
  st->id = s.next_id++;
  st->device = device;
  s.streams[st->id] = st;
  st->worker = std::thread(worker, &s, st);
  return st->id;
}

int32_t destroy(Session &s, uint32_t id, bool force) {
  std::shared_ptr<Stream> st;
  {
    std::unique_lock<std::mutex> l(s.mu);
    st = find(s, id);
    if (!st) return ACL_ERROR_INVALID_PARAM;
    if (!force) wait_stream(s, l, st);
    st->cancel = true;
    st->queue.clear();
    s.streams.erase(id);
    s.cv.notify_all();
  }
  st->worker.join();
  return ACL_SUCCESS;
}

bool device_of(Session &s, uint32_t id, uint32_t *device) {
  std::lock_guard<std::mutex> g(s.mu);
  auto st = find(s, id);
  if (st) *device = st->device;
  return st != nullptr;
}

int32_t enqueue(Session &s, uint32_t id, Work &&w) {
  std::lock_guard<std::mutex> g(s.mu);
  auto st = find(s, id);
  if (!st) return ACL_ERROR_INVALID_PARAM;
  st->queue.push_back(std::move(w));
  ++st->enqueued;
  s.cv.notify_all();
  return ACL_SUCCESS;
}

namespace {
std::chrono::steady_clock::time_point deadline_in(int64_t timeout_ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
}
}  // namespace

int32_t sync(Session &s, uint32_t id, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(s.mu);
  auto st = find(s, id);
  if (!st) return ACL_ERROR_INVALID_PARAM;
  const auto deadline = deadline_in(timeout_ms);
  return wait_stream(s, l, st, timeout_ms < 0 ? nullptr : &deadline);
}

int32_t sync_device(Session &s, uint32_t device, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(s.mu);
  const auto deadline = deadline_in(timeout_ms);
  std::vector<std::shared_ptr<Stream>> on_device;
  for (auto &[id, st] : s.streams)
    if (st->device == device) on_device.push_back(st);
  int32_t rc = ACL_SUCCESS;
  for (auto &st : on_device) {
    int32_t r = wait_stream(s, l, st, timeout_ms < 0 ? nullptr : &deadline);
    if (r == ACL_ERROR_RT_STREAM_SYNC_TIMEOUT) return r;
    if (rc == ACL_SUCCESS) rc = r;
  }
  return rc;
}

int32_t drain(Session &s, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(s.mu);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const bool idle = s.cv.wait_until(l, deadline, [&] {
    for (auto &[id, st] : s.streams)
      if (st->done < st->enqueued) return false;
    return true;
  });
  return idle ? ACL_SUCCESS : ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT;
}

void stop_all(Session &s) {
  std::map<uint32_t, std::shared_ptr<Stream>> stopped;
  {
    std::lock_guard<std::mutex> g(s.mu);
    stopped.swap(s.streams);
    for (auto &[id, st] : stopped) {
      st->cancel = true;
      st->queue.clear();
    }
    s.events.clear();
    s.notifies.clear();
    s.cv.notify_all();
  }
  for (auto &[id, st] : stopped) st->worker.join();
}

uint32_t event_create(Session &s, uint64_t completed, uint64_t timestamp_ns) {
  std::lock_guard<std::mutex> g(s.mu);
  uint32_t id = s.next_id++;
  s.events[id] = Event{completed, timestamp_ns, nullptr};
  return id;
}

int32_t event_destroy(Session &s, uint32_t id) {
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.events.find(id);
  if (it == s.events.end()) return ACL_ERROR_INVALID_PARAM;
  if (it->second.ipc) ipc::drop_event_import(s.pid, it->second.ipc);  // no-op for the exporter
  s.events.erase(it);
  s.cv.notify_all();  // streams waiting on it move on
  return ACL_SUCCESS;
}

int32_t event_query(Session &s, uint32_t id, Event *out) {
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.events.find(id);
  if (it == s.events.end()) return ACL_ERROR_INVALID_PARAM;
  *out = it->second.state();
  return ACL_SUCCESS;
}

int32_t event_sync(Session &s, uint32_t id, uint64_t target, int64_t timeout_ms) {
  std::unique_lock<std::mutex> l(s.mu);
  if (s.events.find(id) == s.events.end()) return ACL_ERROR_INVALID_PARAM;
  auto reached = [&] {
    auto it = s.events.find(id);
    return it == s.events.end() || it->second.done() >= target;
  };
  // An IPC event may be recorded by another process, which cannot wake this session: poll it.
  const auto deadline = deadline_in(timeout_ms);
  while (!reached()) {
    if (timeout_ms >= 0 && std::chrono::steady_clock::now() >= deadline) return ACL_ERROR_RT_EVENT_SYNC_TIMEOUT;
    s.cv.wait_for(l, std::chrono::milliseconds(1));
  }
  return ACL_SUCCESS;
}

int32_t set_failure_mode(Session &s, uint32_t id, bool stop_on_failure) {
  std::lock_guard<std::mutex> g(s.mu);
  auto st = find(s, id);
  if (!st) return ACL_ERROR_INVALID_PARAM;
  st->stop_on_failure = stop_on_failure;
  return ACL_SUCCESS;
}

int32_t pending_error(Session &s, uint32_t id, bool set, uint64_t *out, uint64_t value) {
  std::lock_guard<std::mutex> g(s.mu);
  auto st = find(s, id);
  if (!st) return ACL_ERROR_INVALID_PARAM;
  if (set) st->error = static_cast<int32_t>(value);
  else *out = static_cast<uint64_t>(static_cast<uint32_t>(st->error));
  return ACL_SUCCESS;
}

int32_t event_signal(Session &s, uint32_t id) {
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.events.find(id);
  if (it == s.events.end()) return ACL_ERROR_INVALID_PARAM;
  ++it->second.completed;
  it->second.timestamp_ns = now_ns();
  s.cv.notify_all();
  return ACL_SUCCESS;
}

}  // namespace npusim::streams

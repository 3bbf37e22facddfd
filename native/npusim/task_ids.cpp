// Task ids (cann-last): a task's id is its place on its stream, counted by the daemon (1, 2, ...),
// so the id aclrtGetThreadLastTaskId hands the queuing thread is the one the exception info of
// that task reports when it fails (StreamSync names the failed task). A kernel launch's function
// handle and argument bytes are kept for its stream's last launches, so the exception callback can
// tell what a failed kernel was called with (aclrtGetArgsFromExceptionInfo /
// aclrtGetFuncHandleFromExceptionInfo, errors.cpp).
//
// Ids restart on the stream the daemon re-creates after a restore; the records are keyed by the
// daemon's stream id too, so a restored stream never reports a launch of its old life.
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "runtime.h"

using namespace npusim::rt;

namespace {

constexpr size_t kLaunchesKept = 64;  // per stream: a failure is reported by the next synchronize

struct Launch {
  uint64_t ordinal;
  void *function;
  std::string args;
};

struct StreamLaunches {
  uint32_t daemon_id;
  std::deque<Launch> launches;
};

thread_local uint32_t t_last_task = 0;
std::mutex g_mu;
std::map<StreamObj *, StreamLaunches> g_launches;

}  // namespace

namespace npusim::rt {

void note_task(StreamObj *stream, uint64_t ordinal, void *function, const std::string *args) {
  t_last_task = static_cast<uint32_t>(ordinal);
  if (function == nullptr || args == nullptr) return;
  std::lock_guard<std::mutex> g(g_mu);
  StreamLaunches &l = g_launches[stream];
  if (l.daemon_id != stream->id) l = StreamLaunches{stream->id, {}};
  l.launches.push_back(Launch{ordinal, function, *args});
  if (l.launches.size() > kLaunchesKept) l.launches.pop_front();
}

bool find_launch(StreamObj *stream, uint64_t ordinal, FailedLaunch *out) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_launches.find(stream);
  if (it == g_launches.end() || it->second.daemon_id != stream->id) return false;
  for (const Launch &l : it->second.launches)
    if (l.ordinal == ordinal) {
      *out = FailedLaunch{l.function, l.args};
      return true;
    }
  return false;
}

void forget_tasks(StreamObj *stream) {
  std::lock_guard<std::mutex> g(g_mu);
  g_launches.erase(stream);
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtGetThreadLastTaskId(uint32_t *taskId) {
  if (taskId == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtGetThreadLastTaskId: taskId is NULL");
  *taskId = t_last_task;
  return ACL_SUCCESS;
}

}  // extern "C"

// Stopping a stream's work and stream state callbacks (cann-last): aclrtStreamStop and
// aclrtStreamAbort drop the tasks queued on a stream that have not started (the daemon's
// streams::abort; a task already running finishes, npusim cannot pause a kernel halfway), and the
// stream stays usable. After an abort the next synchronize reports ACL_ERROR_RT_STREAM_ABORT;
// after a stop it reports nothing. aclrtRegStreamStateCallback calls a named callback after each
// stream the application creates and before each it destroys.
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

std::mutex g_mu;
std::map<std::string, std::pair<aclrtStreamStateCallback, void *>> g_callbacks;  // by registration name

aclError drop_queued(aclrtStream stream, bool abort, const char *api) {
  if (stream == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": stream is NULL");
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  proto::Request rq = wire::request(proto::Op::StreamAbort);
  rq.stream = s->id;
  rq.flags = abort ? 1 : 0;
  if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return note_error(rc, std::string(api) + ": the device refused");
  return ACL_SUCCESS;
}

}  // namespace

namespace npusim::rt {

void notify_stream_state(aclrtStream stream, aclrtStreamState state) {
  std::vector<std::pair<aclrtStreamStateCallback, void *>> calls;
  {
    std::lock_guard<std::mutex> g(g_mu);
    for (auto &[name, cb] : g_callbacks) calls.push_back(cb);
  }
  for (auto &[cb, args] : calls) cb(stream, state, args);  // outside the lock: a callback may register
}

}  // namespace npusim::rt

extern "C" {

aclError aclrtStreamStop(aclrtStream stream) { return drop_queued(stream, false, "aclrtStreamStop"); }

aclError aclrtStreamAbort(aclrtStream stream) { return drop_queued(stream, true, "aclrtStreamAbort"); }

// callback NULL removes the registration of regName.
aclError aclrtRegStreamStateCallback(const char *regName, aclrtStreamStateCallback callback, void *args) {
  if (regName == nullptr || regName[0] == '\0')
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtRegStreamStateCallback: regName is NULL or empty");
  std::lock_guard<std::mutex> g(g_mu);
  if (callback == nullptr) g_callbacks.erase(regName);
  else g_callbacks[regName] = {callback, args};
  return ACL_SUCCESS;
}

}  // extern "C"

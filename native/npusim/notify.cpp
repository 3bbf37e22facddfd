// Notifies in the daemon: per-session ids for shared flag objects (an imported notify is the
// exporter's object under a new id of the importer's session).
#include "acl/acl_base.h"
#include "device_state.h"

namespace npusim::notify {

uint32_t adopt(Session &s, std::shared_ptr<Notify> n) {
  std::lock_guard<std::mutex> g(s.mu);
  uint32_t id = s.next_id++;
  s.notifies[id] = std::move(n);
  return id;
}

uint32_t create(Session &s, bool set) {
  auto n = std::make_shared<Notify>();
  n->set = set;
  return adopt(s, std::move(n));
}

int32_t destroy(Session &s, uint32_t id) {
  std::lock_guard<std::mutex> g(s.mu);
  if (s.notifies.erase(id) == 0) return ACL_ERROR_INVALID_PARAM;
  s.cv.notify_all();  // streams waiting on it move on
  return ACL_SUCCESS;
}

std::shared_ptr<Notify> find(Session &s, uint32_t id) {
  std::lock_guard<std::mutex> g(s.mu);
  auto it = s.notifies.find(id);
  return it == s.notifies.end() ? nullptr : it->second;
}

}  // namespace npusim::notify

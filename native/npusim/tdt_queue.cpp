// tdt queues (acl_tdt_queue.h): queues of buffers with a depth, buffers with user data and chains,
// and routes: while a route src -> dst is bound, what is enqueued on src goes to dst. Queues live
// in this process (a checkpoint carries them as they are), so no other process can be granted one.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "acl/acl_tdt_queue.h"
#include "resources.h"
#include "runtime.h"

using namespace npusim::rt;

struct tagMemQueueAttr {
  const char *name = nullptr;  // the caller's string, as CANN keeps the pointer
  uint32_t depth = 8;          // CANN's default depth
};

struct acltdtQueueRoute {
  uint32_t src, dst;
  int32_t status = ACL_TDT_QUEUE_ROUTE_UNBIND;
};

struct acltdtQueueRouteList {
  std::vector<acltdtQueueRoute> routes;
};

struct acltdtQueueRouteQueryInfo {
  acltdtQueueRouteQueryMode mode = ACL_TDT_QUEUE_ROUTE_QUERY_SRC_AND_DST;
  uint32_t src = 0, dst = 0;
};

namespace {

constexpr size_t kUserDataSize = 96;  // CANN's per-buffer private area
constexpr uint32_t kMaxDepth = 8192;

struct Buf {
  std::vector<uint8_t> data;
  size_t len = 0;
  uint8_t user[kUserDataSize] = {};
  std::vector<Buf *> chain;  // the head's followers
};

struct Queue {
  std::string name;
  uint32_t depth;
  std::deque<Buf *> items;
};

struct State {
  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::map<uint32_t, Queue> queues;
  std::vector<acltdtQueueRoute> bound;
  uint32_t next_id = 1;
};

State &state() {
  static auto *s = new State;  // never destroyed: a dequeuer may still wait at exit
  return *s;
}

template <typename F>
bool wait_for(std::unique_lock<std::mutex> &l, int32_t timeout, F ready) {
  if (timeout < 0) {
    state().cv.wait(l, ready);
    return true;
  }
  return state().cv.wait_for(l, std::chrono::milliseconds(timeout), ready);
}

// The queue that what is enqueued on qid ends up on (bound routes forward it). With mu held.
uint32_t destination(uint32_t qid) {
  for (int hops = 0; hops < 64; ++hops) {
    auto it = std::find_if(state().bound.begin(), state().bound.end(), [&](auto &r) { return r.src == qid; });
    if (it == state().bound.end()) break;
    qid = it->dst;
  }
  return qid;
}

aclError enqueue(uint32_t qid, Buf *buf, int32_t timeout, const char *api) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": bad timeout");
  std::unique_lock<std::mutex> l(state().mu);
  if (state().queues.count(qid) == 0) return note_error(ACL_ERROR_INVALID_QUEUE_ID, std::string(api) + ": no such queue");
  const uint32_t to = destination(qid);
  auto room = [&] { auto it = state().queues.find(to); return it == state().queues.end() || it->second.items.size() < it->second.depth; };
  if (!wait_for(l, timeout, room)) return note_error(ACL_ERROR_RT_QUEUE_FULL, std::string(api) + ": the queue is full");
  auto it = state().queues.find(to);
  if (it == state().queues.end()) return note_error(ACL_ERROR_INVALID_QUEUE_ID, std::string(api) + ": the queue was destroyed");
  it->second.items.push_back(buf);
  state().cv.notify_all();
  return ACL_SUCCESS;
}

aclError dequeue(uint32_t qid, Buf **buf, int32_t timeout, const char *api) {
  if (timeout < -1) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": bad timeout");
  std::unique_lock<std::mutex> l(state().mu);
  if (state().queues.count(qid) == 0) return note_error(ACL_ERROR_INVALID_QUEUE_ID, std::string(api) + ": no such queue");
  auto some = [&] { auto it = state().queues.find(qid); return it == state().queues.end() || !it->second.items.empty(); };
  if (!wait_for(l, timeout, some)) return note_error(ACL_ERROR_RT_QUEUE_EMPTY, std::string(api) + ": the queue is empty");
  auto it = state().queues.find(qid);
  if (it == state().queues.end()) return note_error(ACL_ERROR_INVALID_QUEUE_ID, std::string(api) + ": the queue was destroyed");
  *buf = it->second.items.front();
  it->second.items.pop_front();
  state().cv.notify_all();
  return ACL_SUCCESS;
}

void free_buf(Buf *b) {
  for (Buf *c : b->chain) delete c;
  delete b;
}

template <typename T>
aclError put(void *param, size_t len, size_t *ret, const T &value) {
  if (param == nullptr || len < sizeof(T)) return ACL_ERROR_INVALID_PARAM;
  std::memcpy(param, &value, sizeof(T));
  if (ret) *ret = sizeof(T);
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

acltdtQueueAttr *acltdtCreateQueueAttr() { return new tagMemQueueAttr; }

aclError acltdtDestroyQueueAttr(const acltdtQueueAttr *attr) {
  if (attr == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyQueueAttr: NULL");
  delete attr;
  return ACL_SUCCESS;
}

aclError acltdtSetQueueAttr(acltdtQueueAttr *attr, acltdtQueueAttrType type, size_t len, const void *param) {
  if (attr == nullptr || param == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetQueueAttr: NULL argument");
  if (type == ACL_TDT_QUEUE_NAME_PTR && len == sizeof(char *)) {
    attr->name = *static_cast<char *const *>(param);
    return ACL_SUCCESS;
  }
  if (type == ACL_TDT_QUEUE_DEPTH_UINT32 && len == sizeof(uint32_t)) {
    uint32_t depth = *static_cast<const uint32_t *>(param);
    if (depth < 2 || depth > kMaxDepth) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetQueueAttr: depth must be 2..8192");
    attr->depth = depth;
    return ACL_SUCCESS;
  }
  return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetQueueAttr: bad attribute or size");
}

aclError acltdtGetQueueAttr(const acltdtQueueAttr *attr, acltdtQueueAttrType type, size_t len, size_t *paramRetSize,
                            void *param) {
  if (attr == nullptr || paramRetSize == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetQueueAttr: NULL argument");
  aclError rc = type == ACL_TDT_QUEUE_NAME_PTR     ? put(param, len, paramRetSize, attr->name)
                : type == ACL_TDT_QUEUE_DEPTH_UINT32 ? put(param, len, paramRetSize, attr->depth)
                                                     : ACL_ERROR_INVALID_PARAM;
  return rc == ACL_SUCCESS ? rc : note_error(rc, "acltdtGetQueueAttr: bad attribute or size");
}

aclError acltdtCreateQueue(const acltdtQueueAttr *attr, uint32_t *qid) {
  if (attr == nullptr || qid == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtCreateQueue: NULL argument");
  std::lock_guard<std::mutex> g(state().mu);
  std::string name = attr->name ? attr->name : "";
  if (name.size() > 127) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtCreateQueue: the name is longer than 127 bytes");
  if (name.empty()) name = "npusim_queue_" + std::to_string(state().next_id);
  for (auto &[id, q] : state().queues)
    if (q.name == name) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtCreateQueue: a queue " + name + " exists already");
  *qid = state().next_id++;
  state().queues[*qid] = Queue{name, attr->depth, {}};
  return ACL_SUCCESS;
}

aclError acltdtDestroyQueue(uint32_t qid) {
  std::lock_guard<std::mutex> g(state().mu);
  auto it = state().queues.find(qid);
  if (it == state().queues.end()) return note_error(ACL_ERROR_INVALID_QUEUE_ID, "acltdtDestroyQueue: no such queue");
  for (const acltdtQueueRoute &r : state().bound)
    if (r.src == qid || r.dst == qid)
      return note_error(ACL_ERROR_FAILURE, "acltdtDestroyQueue: unbind the queue's routes first");
  for (Buf *b : it->second.items) free_buf(b);
  state().queues.erase(it);
  state().cv.notify_all();
  return ACL_SUCCESS;
}

aclError acltdtEnqueue(uint32_t qid, acltdtBuf buf, int32_t timeout) {
  if (buf == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtEnqueue: buf is NULL");
  return enqueue(qid, static_cast<Buf *>(buf), timeout, "acltdtEnqueue");  // the queue owns it now
}

aclError acltdtDequeue(uint32_t qid, acltdtBuf *buf, int32_t timeout) {
  if (buf == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDequeue: buf is NULL");
  Buf *b = nullptr;
  if (aclError rc = dequeue(qid, &b, timeout, "acltdtDequeue"); rc != ACL_SUCCESS) return rc;
  *buf = b;  // the caller's to acltdtFreeBuf
  return ACL_SUCCESS;
}

aclError acltdtEnqueueData(uint32_t qid, const void *data, size_t dataSize, const void *userData, size_t userDataSize,
                           int32_t timeout, uint32_t rsv) {
  if ((data == nullptr && dataSize > 0) || userDataSize > kUserDataSize || (userData == nullptr && userDataSize > 0) || rsv != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtEnqueueData: bad data, user data (<= 96 bytes) or rsv");
  auto *b = new Buf;
  b->data.assign(static_cast<const uint8_t *>(data), static_cast<const uint8_t *>(data) + dataSize);
  b->len = dataSize;
  if (userDataSize) std::memcpy(b->user, userData, userDataSize);
  aclError rc = enqueue(qid, b, timeout, "acltdtEnqueueData");
  if (rc != ACL_SUCCESS) free_buf(b);
  return rc;
}

aclError acltdtDequeueData(uint32_t qid, void *data, size_t dataSize, size_t *retDataSize, void *userData,
                           size_t userDataSize, int32_t timeout) {
  if (retDataSize == nullptr || userDataSize > kUserDataSize || (userData == nullptr && userDataSize > 0))
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDequeueData: bad argument");
  Buf *b = nullptr;
  if (aclError rc = dequeue(qid, &b, timeout, "acltdtDequeueData"); rc != ACL_SUCCESS) return rc;
  const size_t n = std::min(dataSize, b->len);
  if (n) std::memcpy(data, b->data.data(), n);
  *retDataSize = n;
  if (userDataSize) std::memcpy(userData, b->user, userDataSize);
  free_buf(b);
  return ACL_SUCCESS;
}

aclError acltdtGrantQueue(uint32_t qid, int32_t pid, uint32_t permission, int32_t timeout) {
  (void)permission;
  (void)timeout;
  std::lock_guard<std::mutex> g(state().mu);
  if (state().queues.count(qid) == 0) return note_error(ACL_ERROR_INVALID_QUEUE_ID, "acltdtGrantQueue: no such queue");
  if (pid == static_cast<int32_t>(::getpid())) return ACL_SUCCESS;
  return note_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, "acltdtGrantQueue: npusim's queues live in their process");
}

aclError acltdtAttachQueue(uint32_t qid, int32_t timeout, uint32_t *permission) {
  (void)timeout;
  if (permission == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtAttachQueue: permission is NULL");
  std::lock_guard<std::mutex> g(state().mu);
  if (state().queues.count(qid) == 0) return note_error(ACL_ERROR_INVALID_QUEUE_ID, "acltdtAttachQueue: no such queue");
  *permission = ACL_TDT_QUEUE_PERMISSION_MANAGE | ACL_TDT_QUEUE_PERMISSION_DEQUEUE | ACL_TDT_QUEUE_PERMISSION_ENQUEUE;
  return ACL_SUCCESS;
}

aclError acltdtBindQueueRoutes(acltdtQueueRouteList *qRouteList) {
  if (qRouteList == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtBindQueueRoutes: NULL");
  std::lock_guard<std::mutex> g(state().mu);
  aclError rc = ACL_SUCCESS;
  for (acltdtQueueRoute &r : qRouteList->routes) {
    const bool ok = r.src != r.dst && state().queues.count(r.src) && state().queues.count(r.dst) &&
                    std::none_of(state().bound.begin(), state().bound.end(), [&](auto &b) { return b.src == r.src; });
    r.status = ok ? ACL_TDT_QUEUE_ROUTE_BIND : ACL_TDT_QUEUE_ROUTE_BIND_ABNORMAL;
    if (ok) state().bound.push_back(r);
    else rc = note_error(ACL_ERROR_FAILURE, "acltdtBindQueueRoutes: a route names a missing queue or a bound source");
  }
  return rc;
}

aclError acltdtUnbindQueueRoutes(acltdtQueueRouteList *qRouteList) {
  if (qRouteList == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtUnbindQueueRoutes: NULL");
  std::lock_guard<std::mutex> g(state().mu);
  for (acltdtQueueRoute &r : qRouteList->routes) {
    auto &b = state().bound;
    b.erase(std::remove_if(b.begin(), b.end(), [&](auto &x) { return x.src == r.src && x.dst == r.dst; }), b.end());
    r.status = ACL_TDT_QUEUE_ROUTE_UNBIND;
  }
  return ACL_SUCCESS;
}

aclError acltdtQueryQueueRoutes(const acltdtQueueRouteQueryInfo *queryInfo, acltdtQueueRouteList *qRouteList) {
  if (queryInfo == nullptr || qRouteList == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtQueryQueueRoutes: NULL");
  std::lock_guard<std::mutex> g(state().mu);
  qRouteList->routes.clear();
  for (const acltdtQueueRoute &r : state().bound) {
    const bool src = r.src == queryInfo->src, dst = r.dst == queryInfo->dst;
    const bool match = queryInfo->mode == ACL_TDT_QUEUE_ROUTE_QUERY_SRC ? src
                       : queryInfo->mode == ACL_TDT_QUEUE_ROUTE_QUERY_DST ? dst
                       : queryInfo->mode == ACL_TDT_QUEUE_ROUTE_QUERY_SRC_AND_DST ? src && dst
                                                                                  : false;  // no abnormal routes here
    if (match) qRouteList->routes.push_back(r);
  }
  return ACL_SUCCESS;
}

aclError acltdtAllocBuf(size_t size, uint32_t type, acltdtBuf *buf) {
  if (buf == nullptr || (type != ACL_TDT_NORMAL_MEM && type != ACL_TDT_DVPP_MEM))
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtAllocBuf: bad type or buf");
  auto *b = new Buf;
  b->data.resize(size);
  b->len = size;
  *buf = b;
  return ACL_SUCCESS;
}

aclError acltdtFreeBuf(acltdtBuf buf) {
  if (buf == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtFreeBuf: NULL");
  free_buf(static_cast<Buf *>(buf));
  return ACL_SUCCESS;
}

aclError acltdtGetBufData(const acltdtBuf buf, void **dataPtr, size_t *size) {
  if (buf == nullptr || dataPtr == nullptr || size == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetBufData: NULL");
  auto *b = static_cast<Buf *>(buf);
  *dataPtr = b->data.data();
  *size = b->data.size();
  return ACL_SUCCESS;
}

aclError acltdtSetBufDataLen(acltdtBuf buf, size_t len) {
  auto *b = static_cast<Buf *>(buf);
  if (b == nullptr || len > b->data.size()) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetBufDataLen: longer than the buffer");
  b->len = len;
  return ACL_SUCCESS;
}

aclError acltdtGetBufDataLen(acltdtBuf buf, size_t *len) {
  if (buf == nullptr || len == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetBufDataLen: NULL");
  *len = static_cast<Buf *>(buf)->len;
  return ACL_SUCCESS;
}

aclError acltdtAppendBufChain(acltdtBuf headBuf, acltdtBuf buf) {
  if (headBuf == nullptr || buf == nullptr || headBuf == buf) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtAppendBufChain: bad buffers");
  static_cast<Buf *>(headBuf)->chain.push_back(static_cast<Buf *>(buf));
  return ACL_SUCCESS;
}

aclError acltdtGetBufChainNum(acltdtBuf headBuf, uint32_t *num) {
  if (headBuf == nullptr || num == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetBufChainNum: NULL");
  *num = static_cast<uint32_t>(static_cast<Buf *>(headBuf)->chain.size() + 1);
  return ACL_SUCCESS;
}

aclError acltdtGetBufFromChain(acltdtBuf headBuf, uint32_t index, acltdtBuf *buf) {
  auto *h = static_cast<Buf *>(headBuf);
  if (h == nullptr || buf == nullptr || index > h->chain.size()) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetBufFromChain: bad index");
  *buf = index == 0 ? h : h->chain[index - 1];
  return ACL_SUCCESS;
}

aclError acltdtGetBufUserData(const acltdtBuf buf, void *dataPtr, size_t size, size_t offset) {
  if (buf == nullptr || dataPtr == nullptr || offset + size > kUserDataSize)
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetBufUserData: outside the 96-byte user area");
  std::memcpy(dataPtr, static_cast<Buf *>(buf)->user + offset, size);
  return ACL_SUCCESS;
}

aclError acltdtSetBufUserData(acltdtBuf buf, const void *dataPtr, size_t size, size_t offset) {
  if (buf == nullptr || dataPtr == nullptr || offset + size > kUserDataSize)
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetBufUserData: outside the 96-byte user area");
  std::memcpy(static_cast<Buf *>(buf)->user + offset, dataPtr, size);
  return ACL_SUCCESS;
}

aclError acltdtCopyBufRef(const acltdtBuf buf, acltdtBuf *newBuf) {
  if (buf == nullptr || newBuf == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtCopyBufRef: NULL");
  *newBuf = new Buf(*static_cast<Buf *>(buf));  // a copy: freeing either leaves the other intact
  static_cast<Buf *>(*newBuf)->chain.clear();
  return ACL_SUCCESS;
}

acltdtQueueRoute *acltdtCreateQueueRoute(uint32_t srcId, uint32_t dstId) { return new acltdtQueueRoute{srcId, dstId}; }

aclError acltdtDestroyQueueRoute(const acltdtQueueRoute *route) {
  if (route == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyQueueRoute: NULL");
  delete route;
  return ACL_SUCCESS;
}

aclError acltdtGetQueueRouteParam(const acltdtQueueRoute *route, acltdtQueueRouteParamType type, size_t len,
                                  size_t *paramRetSize, void *param) {
  if (route == nullptr || paramRetSize == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetQueueRouteParam: NULL");
  aclError rc = type == ACL_TDT_QUEUE_ROUTE_SRC_UINT32      ? put(param, len, paramRetSize, route->src)
                : type == ACL_TDT_QUEUE_ROUTE_DST_UINT32    ? put(param, len, paramRetSize, route->dst)
                : type == ACL_TDT_QUEUE_ROUTE_STATUS_INT32 ? put(param, len, paramRetSize, route->status)
                                                            : ACL_ERROR_INVALID_PARAM;
  return rc == ACL_SUCCESS ? rc : note_error(rc, "acltdtGetQueueRouteParam: bad parameter or size");
}

acltdtQueueRouteList *acltdtCreateQueueRouteList() { return new acltdtQueueRouteList; }

aclError acltdtDestroyQueueRouteList(const acltdtQueueRouteList *routeList) {
  if (routeList == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyQueueRouteList: NULL");
  delete routeList;
  return ACL_SUCCESS;
}

aclError acltdtAddQueueRoute(acltdtQueueRouteList *routeList, const acltdtQueueRoute *route) {
  if (routeList == nullptr || route == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtAddQueueRoute: NULL");
  routeList->routes.push_back(*route);
  return ACL_SUCCESS;
}

aclError acltdtGetQueueRoute(const acltdtQueueRouteList *routeList, size_t index, acltdtQueueRoute *route) {
  if (routeList == nullptr || route == nullptr || index >= routeList->routes.size())
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtGetQueueRoute: bad index");
  *route = routeList->routes[index];
  return ACL_SUCCESS;
}

size_t acltdtGetQueueRouteNum(const acltdtQueueRouteList *routeList) { return routeList ? routeList->routes.size() : 0; }

acltdtQueueRouteQueryInfo *acltdtCreateQueueRouteQueryInfo() { return new acltdtQueueRouteQueryInfo; }

aclError acltdtDestroyQueueRouteQueryInfo(const acltdtQueueRouteQueryInfo *info) {
  if (info == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtDestroyQueueRouteQueryInfo: NULL");
  delete info;
  return ACL_SUCCESS;
}

aclError acltdtSetQueueRouteQueryInfo(acltdtQueueRouteQueryInfo *param, acltdtQueueRouteQueryInfoParamType type, size_t len,
                                      const void *value) {
  if (param == nullptr || value == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetQueueRouteQueryInfo: NULL");
  if (type == ACL_TDT_QUEUE_ROUTE_QUERY_MODE_ENUM && len == sizeof(acltdtQueueRouteQueryMode))
    param->mode = *static_cast<const acltdtQueueRouteQueryMode *>(value);
  else if (type == ACL_TDT_QUEUE_ROUTE_QUERY_SRC_ID_UINT32 && len == sizeof(uint32_t))
    param->src = *static_cast<const uint32_t *>(value);
  else if (type == ACL_TDT_QUEUE_ROUTE_QUERY_DST_ID_UINT32 && len == sizeof(uint32_t))
    param->dst = *static_cast<const uint32_t *>(value);
  else
    return note_error(ACL_ERROR_INVALID_PARAM, "acltdtSetQueueRouteQueryInfo: bad parameter or size");
  return ACL_SUCCESS;
}

}  // extern "C"

// Snapshot kind "tdt_queues": process memory only (see tdt_channel.cpp's kind).
namespace {

size_t count_queues() {
  std::lock_guard<std::mutex> g(state().mu);
  return state().queues.size();
}

const ResourceKind kQueues{"tdt_queues", 72, nullptr, nullptr, nullptr, nullptr, count_queues};
NPUSIM_RESOURCE_KIND(kQueues);

}  // namespace

// External allocators (acl_rt_allocator.h): descriptors the application fills in, bound to
// streams. The runtime only keeps and returns them; the functions are the application's and run
// in its own memory, so a checkpoint carries them as they are.
#include <map>
#include <mutex>

#include "acl/acl_rt_allocator.h"
#include "runtime.h"

using namespace npusim::rt;

namespace {

struct Desc {
  aclrtAllocator obj = nullptr;
  aclrtAllocatorAllocFunc alloc = nullptr;
  aclrtAllocatorFreeFunc free = nullptr;
  aclrtAllocatorAllocAdviseFunc advise = nullptr;
  aclrtAllocatorGetAddrFromBlockFunc addr = nullptr;
};

std::mutex mu;
std::map<StreamObj *, Desc> bound;  // guarded by mu

Desc *desc_of(aclrtAllocatorDesc d) { return static_cast<Desc *>(d); }

template <typename F>
aclError set_field(aclrtAllocatorDesc d, F &&set, const char *api) {
  if (d == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": allocatorDesc is NULL");
  std::lock_guard<std::mutex> g(mu);
  set(*desc_of(d));
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclrtAllocatorDesc aclrtAllocatorCreateDesc() { return new (std::nothrow) Desc; }

aclError aclrtAllocatorDestroyDesc(aclrtAllocatorDesc allocatorDesc) {
  if (allocatorDesc == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtAllocatorDestroyDesc: allocatorDesc is NULL");
  delete desc_of(allocatorDesc);  // streams keep their own copy
  return ACL_SUCCESS;
}

aclError aclrtAllocatorSetObjToDesc(aclrtAllocatorDesc allocatorDesc, aclrtAllocator allocator) {
  return set_field(allocatorDesc, [&](Desc &d) { d.obj = allocator; }, "aclrtAllocatorSetObjToDesc");
}

aclError aclrtAllocatorSetAllocFuncToDesc(aclrtAllocatorDesc allocatorDesc, aclrtAllocatorAllocFunc func) {
  return set_field(allocatorDesc, [&](Desc &d) { d.alloc = func; }, "aclrtAllocatorSetAllocFuncToDesc");
}

aclError aclrtAllocatorSetFreeFuncToDesc(aclrtAllocatorDesc allocatorDesc, aclrtAllocatorFreeFunc func) {
  return set_field(allocatorDesc, [&](Desc &d) { d.free = func; }, "aclrtAllocatorSetFreeFuncToDesc");
}

aclError aclrtAllocatorSetAllocAdviseFuncToDesc(aclrtAllocatorDesc allocatorDesc, aclrtAllocatorAllocAdviseFunc func) {
  return set_field(allocatorDesc, [&](Desc &d) { d.advise = func; }, "aclrtAllocatorSetAllocAdviseFuncToDesc");
}

aclError aclrtAllocatorSetGetAddrFromBlockFuncToDesc(aclrtAllocatorDesc allocatorDesc,
                                                     aclrtAllocatorGetAddrFromBlockFunc func) {
  return set_field(allocatorDesc, [&](Desc &d) { d.addr = func; }, "aclrtAllocatorSetGetAddrFromBlockFuncToDesc");
}

aclError aclrtAllocatorRegister(aclrtStream stream, aclrtAllocatorDesc allocatorDesc) {
  if (allocatorDesc == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtAllocatorRegister: allocatorDesc is NULL");
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtAllocatorRegister"); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(mu);
  const Desc &d = *desc_of(allocatorDesc);
  // CANN wants the object and the alloc, free and get-address functions; advise is optional.
  if (d.obj == nullptr || d.alloc == nullptr || d.free == nullptr || d.addr == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtAllocatorRegister: the descriptor lacks the object or a function");
  bound[s] = d;
  return ACL_SUCCESS;
}

aclError aclrtAllocatorGetByStream(aclrtStream stream, aclrtAllocatorDesc *allocatorDesc, aclrtAllocator *allocator,
                                   aclrtAllocatorAllocFunc *allocFunc, aclrtAllocatorFreeFunc *freeFunc,
                                   aclrtAllocatorAllocAdviseFunc *allocAdviseFunc,
                                   aclrtAllocatorGetAddrFromBlockFunc *getAddrFromBlockFunc) {
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtAllocatorGetByStream"); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(mu);
  auto it = bound.find(s);
  if (it == bound.end()) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtAllocatorGetByStream: no allocator on this stream");
  Desc &d = it->second;
  if (allocatorDesc) *allocatorDesc = &d;
  if (allocator) *allocator = d.obj;
  if (allocFunc) *allocFunc = d.alloc;
  if (freeFunc) *freeFunc = d.free;
  if (allocAdviseFunc) *allocAdviseFunc = d.advise;
  if (getAddrFromBlockFunc) *getAddrFromBlockFunc = d.addr;
  return ACL_SUCCESS;
}

aclError aclrtAllocatorUnregister(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (aclError rc = stream_for(stream, &s, "aclrtAllocatorUnregister"); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(mu);
  if (bound.erase(s) == 0) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtAllocatorUnregister: no allocator on this stream");
  return ACL_SUCCESS;
}

}  // extern "C"

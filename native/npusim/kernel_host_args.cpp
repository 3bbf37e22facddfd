// aclrtLaunchKernelWithHostArgs: a launch whose argument bytes come from host memory, with
// placeholders: hostArgs holds the arguments and, after them, data the kernel reads through a
// pointer; each aclrtPlaceHolderInfo says where in the arguments the device address of that data
// goes (addrOffset) and where the data starts in hostArgs (dataOffset). The runtime copies hostArgs
// to fresh device memory at the call (so the caller may reuse its buffer once the call returned) and
// writes the addresses into the arguments the kernel gets.
//
// The device copy is an ordinary allocation (carried by a checkpoint like any other); it is freed
// once the launch is done, noticed at a later launch of this kind, or with the device. In a model
// run instance being captured it lives as long as the process: the model may run it again.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "capture.h"
#include "kernel_objects.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct Scratch {
  void *dev;
  aclrtEvent done;  // recorded after the launch
};

std::mutex g_mu;  // guards g_scratch
std::vector<Scratch> g_scratch;

// Frees the copies of launches that are done.
void reap() {
  std::vector<Scratch> done, live;
  {
    std::lock_guard<std::mutex> g(g_mu);
    for (const Scratch &s : g_scratch) {
      aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
      (aclrtQueryEventStatus(s.done, &st) == ACL_SUCCESS && st == ACL_EVENT_RECORDED_STATUS_COMPLETE ? done : live)
          .push_back(s);
    }
    g_scratch = std::move(live);
  }
  for (const Scratch &s : done) {
    aclrtDestroyEvent(s.done);
    aclrtFree(s.dev);
  }
}

}  // namespace

extern "C" {

aclError aclrtLaunchKernelWithHostArgs(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                       aclrtLaunchKernelCfg *cfg, void *hostArgs, size_t argsSize,
                                       aclrtPlaceHolderInfo *placeHolderArray, size_t placeHolderNum) {
  const char *api = "aclrtLaunchKernelWithHostArgs";
  if (numBlocks == 0 || (argsSize > 0 && hostArgs == nullptr) || (placeHolderNum > 0 && placeHolderArray == nullptr) ||
      (cfg != nullptr && cfg->numAttrs > 0 && cfg->attrs == nullptr))
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": numBlocks is 0, or hostArgs / placeHolderArray / cfg->attrs is NULL");
  for (size_t i = 0; i < placeHolderNum; ++i) {
    const aclrtPlaceHolderInfo &p = placeHolderArray[i];
    if (static_cast<size_t>(p.addrOffset) + sizeof(uint64_t) > argsSize || p.dataOffset >= argsSize)
      return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": placeholder " + std::to_string(i) + " lies outside hostArgs");
  }
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  FunctionObj *f = static_cast<FunctionObj *>(funcHandle);
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (f == nullptr || kernel_objects().functions.count(f) == 0)
      return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": not a function handle");
  }
  std::string bytes(static_cast<const char *>(hostArgs), argsSize);
  if (placeHolderNum == 0) return launch_kernel(f, numBlocks, bytes, s);

  reap();
  Scratch sc{};
  if (aclError rc = aclrtMalloc(&sc.dev, argsSize, ACL_MEM_MALLOC_HUGE_FIRST); rc != ACL_SUCCESS) return rc;
  for (size_t i = 0; i < placeHolderNum; ++i) {
    const uint64_t addr = reinterpret_cast<uint64_t>(sc.dev) + placeHolderArray[i].dataOffset;
    std::memcpy(&bytes[placeHolderArray[i].addrOffset], &addr, sizeof(addr));
  }
  // The copy is fresh memory nothing queued uses: copied now, in no stream's order, and the caller
  // may reuse hostArgs once the call returned.
  int32_t rc = aclrtMemcpy(sc.dev, argsSize, hostArgs, argsSize, ACL_MEMCPY_HOST_TO_DEVICE);
  if (rc == ACL_SUCCESS) rc = launch_kernel(f, numBlocks, bytes, s);
  if (rc != ACL_SUCCESS || capturing(s)) {
    if (rc != ACL_SUCCESS) aclrtFree(sc.dev);
    return rc;  // a captured launch keeps its copy: the model may run it again
  }
  if (aclrtCreateEvent(&sc.done) != ACL_SUCCESS || aclrtRecordEvent(sc.done, s->is_default ? nullptr : s) != ACL_SUCCESS)
    return ACL_SUCCESS;  // the copy then lives until the device is reset
  std::lock_guard<std::mutex> g(g_mu);
  g_scratch.push_back(sc);
  return ACL_SUCCESS;
}

}  // extern "C"

// Kernel-argument handles (aclrtKernelArgs*): argument bytes built one parameter at a time, and
// aclrtLaunchKernelWithConfig, which launches a function with them. A placeholder parameter is a
// slot the runtime fills with the device address of data the application writes into a host
// buffer: the data goes to the device in stream order right before each launch.
#include <cstring>
#include <new>

#include "capture.h"
#include "kernel_objects.h"
#include "resources.h"
#include "va.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr size_t kSlot = sizeof(uint64_t);  // placeholders are device addresses
constexpr size_t kMaxArgs = 64 << 10;

int32_t check_args(aclrtArgsHandle argsHandle, ArgsObj **out) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  auto *a = static_cast<ArgsObj *>(argsHandle);
  if (a == nullptr || kernel_objects().args.count(a) == 0) return ACL_ERROR_INVALID_PARAM;
  *out = a;
  return ACL_SUCCESS;
}

bool own_param(const ArgsObj *a, const void *paramHandle) {
  for (auto &p : a->params)
    if (p.get() == paramHandle) return true;
  return false;
}

aclError append(aclrtArgsHandle argsHandle, const void *param, size_t size, bool placeholder,
                aclrtParamHandle *paramHandle) {
  ArgsObj *a = nullptr;
  if (int32_t rc = check_args(argsHandle, &a); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (a->finalized || a->bytes.size() + size > kMaxArgs) return ACL_ERROR_INVALID_PARAM;
  auto p = std::make_unique<ParamObj>(ParamObj{a->bytes.size(), size, placeholder, {}, 0});
  if (placeholder)
    a->bytes.append(kSlot, '\0');
  else
    a->bytes.append(static_cast<const char *>(param), size);
  *paramHandle = p.get();
  a->params.push_back(std::move(p));
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtKernelArgsGetHandleMemSize(aclrtFuncHandle funcHandle, size_t *memSize) {
  if (funcHandle == nullptr || memSize == nullptr) return ACL_ERROR_INVALID_PARAM;
  *memSize = sizeof(ArgsObj);
  return ACL_SUCCESS;
}

aclError aclrtKernelArgsGetMemSize(aclrtFuncHandle funcHandle, size_t userArgsSize, size_t *actualArgsSize) {
  if (funcHandle == nullptr || actualArgsSize == nullptr || userArgsSize > kMaxArgs) return ACL_ERROR_INVALID_PARAM;
  *actualArgsSize = userArgsSize;  // npusim adds nothing to the user's arguments
  return ACL_SUCCESS;
}

aclError aclrtKernelArgsInit(aclrtFuncHandle funcHandle, aclrtArgsHandle *argsHandle) {
  if (argsHandle == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  auto *f = static_cast<FunctionObj *>(funcHandle);
  if (f == nullptr || kernel_objects().functions.count(f) == 0) return ACL_ERROR_INVALID_PARAM;
  auto *a = new ArgsObj{f, {}, {}, false, false, nullptr, 0};
  kernel_objects().args.insert(a);
  *argsHandle = a;
  return ACL_SUCCESS;
}

// CANN's variant with the caller's memory: argsHandle points to aclrtKernelArgsGetHandleMemSize
// bytes the caller owns (the handle lives there), userHostMem to room for the arguments.
aclError aclrtKernelArgsInitByUserMem(aclrtFuncHandle funcHandle, aclrtArgsHandle argsHandle, void *userHostMem,
                                      size_t actualArgsSize) {
  if (argsHandle == nullptr || userHostMem == nullptr || actualArgsSize > kMaxArgs) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  auto *f = static_cast<FunctionObj *>(funcHandle);
  if (f == nullptr || kernel_objects().functions.count(f) == 0) return ACL_ERROR_INVALID_PARAM;
  auto *a = new (argsHandle) ArgsObj{f, {}, {}, false, true, nullptr, 0};
  kernel_objects().args.insert(a);
  return ACL_SUCCESS;
}

aclError aclrtKernelArgsAppend(aclrtArgsHandle argsHandle, void *param, size_t paramSize, aclrtParamHandle *paramHandle) {
  if (param == nullptr || paramSize == 0 || paramHandle == nullptr) return ACL_ERROR_INVALID_PARAM;
  return append(argsHandle, param, paramSize, false, paramHandle);
}

aclError aclrtKernelArgsAppendPlaceHolder(aclrtArgsHandle argsHandle, aclrtParamHandle *paramHandle) {
  if (paramHandle == nullptr) return ACL_ERROR_INVALID_PARAM;
  return append(argsHandle, nullptr, kSlot, true, paramHandle);
}

aclError aclrtKernelArgsGetPlaceHolderBuffer(aclrtArgsHandle argsHandle, aclrtParamHandle paramHandle, size_t dataSize,
                                             void **bufferAddr) {
  if (bufferAddr == nullptr || dataSize == 0 || dataSize > kMaxArgs) return ACL_ERROR_INVALID_PARAM;
  ArgsObj *a = nullptr;
  if (int32_t rc = check_args(argsHandle, &a); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (a->finalized || !own_param(a, paramHandle)) return ACL_ERROR_INVALID_PARAM;
  auto *p = static_cast<ParamObj *>(paramHandle);
  if (!p->placeholder) return ACL_ERROR_INVALID_PARAM;
  p->data.assign(dataSize, 0);
  *bufferAddr = p->data.data();
  return ACL_SUCCESS;
}

aclError aclrtKernelArgsParaUpdate(aclrtArgsHandle argsHandle, aclrtParamHandle paramHandle, void *param,
                                   size_t paramSize) {
  if (param == nullptr) return ACL_ERROR_INVALID_PARAM;
  ArgsObj *a = nullptr;
  if (int32_t rc = check_args(argsHandle, &a); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!own_param(a, paramHandle)) return ACL_ERROR_INVALID_PARAM;
  auto *p = static_cast<ParamObj *>(paramHandle);
  if (p->placeholder) {
    if (paramSize != p->data.size()) return ACL_ERROR_INVALID_PARAM;
    std::memcpy(p->data.data(), param, paramSize);
  } else {
    if (paramSize != p->size) return ACL_ERROR_INVALID_PARAM;
    std::memcpy(a->bytes.data() + p->offset, param, paramSize);
  }
  return ACL_SUCCESS;
}

// Gives the placeholders their device memory (one allocation for all) and their slots its address.
aclError aclrtKernelArgsFinalize(aclrtArgsHandle argsHandle) {
  ArgsObj *a = nullptr;
  if (int32_t rc = check_args(argsHandle, &a); rc != ACL_SUCCESS) return rc;
  size_t total = 0;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    if (a->finalized) return ACL_ERROR_INVALID_PARAM;
    for (auto &p : a->params)
      if (p->placeholder) {
        p->device_offset = total;
        total += (p->data.size() + 31) / 32 * 32;
      }
  }
  void *dev = nullptr;
  if (total > 0)
    if (aclError rc = aclrtMalloc(&dev, total, ACL_MEM_MALLOC_HUGE_FIRST); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  a->placeholder_dev = dev;
  a->placeholder_size = total;
  for (auto &p : a->params)
    if (p->placeholder) {
      const uint64_t addr = p->data.empty() ? 0 : reinterpret_cast<uint64_t>(dev) + p->device_offset;
      std::memcpy(a->bytes.data() + p->offset, &addr, kSlot);
    }
  a->finalized = true;
  return ACL_SUCCESS;
}

aclError aclrtLaunchKernelWithConfig(aclrtFuncHandle funcHandle, uint32_t numBlocks, aclrtStream stream,
                                     aclrtLaunchKernelCfg *cfg, aclrtArgsHandle argsHandle, void *reserve) {
  if (numBlocks == 0 || reserve != nullptr || (cfg != nullptr && cfg->numAttrs > 0 && cfg->attrs == nullptr))
    return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  ArgsObj *a = nullptr;
  StreamObj *s = nullptr;
  if (int32_t rc = check_args(argsHandle, &a); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::string bytes;
  std::vector<proto::Task> uploads;
  FunctionObj *f = nullptr;
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    f = static_cast<FunctionObj *>(funcHandle);
    if (!a->finalized || a->function != f || kernel_objects().functions.count(f) == 0) return ACL_ERROR_INVALID_PARAM;
    bytes = a->bytes;
    for (auto &p : a->params) {
      if (!p->placeholder || p->data.empty()) continue;
      proto::Task t{};
      t.kind = proto::TaskKind::HostToDevice;
      t.dst = reinterpret_cast<uint64_t>(a->placeholder_dev) + p->device_offset;
      t.src = reinterpret_cast<uint64_t>(p->data.data());
      t.size = p->data.size();
      uploads.push_back(t);
    }
  }
  for (const proto::Task &t : uploads)
    if (int32_t rc = submit(t, s); rc != ACL_SUCCESS) return rc;
  return launch_kernel(f, numBlocks, bytes, s);
}

}  // extern "C"

// Snapshot: argument handles live in this process (CRIU carries them) and refer to functions by
// handle; their placeholders' device memory is an ordinary allocation (kind "memory").
namespace {

const ResourceKind kKernelArgs{"kernel args", 52, nullptr, nullptr, nullptr, nullptr,
                               [] { return kernel_objects().args.size(); }};
NPUSIM_RESOURCE_KIND(kKernelArgs);

}  // namespace

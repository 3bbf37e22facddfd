// Managed memory (cann-last): aclrtMemAllocManaged and its advice and prefetch calls. Unified
// memory needs one address the CPU and the device both reach; npusim's device addresses are
// non-canonical on purpose (the CPU faults on them), so its SoC reports what CANN's SoCs without
// UVM (the Ascend 910 series) report: ACL_ERROR_RT_FEATURE_NOT_SUPPORT, after checking the
// arguments as CANN does. CANN's own samples take that answer as "skip".
#include <string>

#include "runtime.h"

using namespace npusim::rt;

namespace {

aclError not_supported(const char *api) {
  return note_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                    std::string(api) + ": npusim's SoC has no unified (managed) memory; use aclrtMalloc, or "
                    "aclrtHostRegister for host memory the device reaches in place");
}

}  // namespace

extern "C" {

aclError aclrtMemAllocManaged(void **ptr, uint64_t size, uint32_t flag) {
  if (ptr == nullptr || size == 0 || flag != ACL_RT_MEM_ATTACH_GLOBAL)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtMemAllocManaged: ptr is NULL, size is 0 or flag is not ACL_RT_MEM_ATTACH_GLOBAL");
  *ptr = nullptr;
  return not_supported("aclrtMemAllocManaged");
}

aclError aclrtMemManagedAdvise(const void *const ptr, uint64_t size, aclrtMemManagedAdviseType advise,
                               aclrtMemManagedLocation location) {
  (void)advise;
  (void)location;
  if (ptr == nullptr || size == 0) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtMemManagedAdvise: ptr is NULL or size is 0");
  return not_supported("aclrtMemManagedAdvise");
}

aclError aclrtMemManagedPrefetchAsync(const void *ptr, size_t size, aclrtMemManagedLocation location, uint32_t flags,
                                      aclrtStream stream) {
  (void)location;
  (void)flags;
  (void)stream;
  if (ptr == nullptr || size == 0) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtMemManagedPrefetchAsync: ptr is NULL or size is 0");
  return not_supported("aclrtMemManagedPrefetchAsync");
}

aclError aclrtMemManagedPrefetchBatchAsync(const void **ptrs, size_t *sizes, size_t count,
                                           aclrtMemManagedLocation *prefetchLocs, size_t *prefetchLocIdxs,
                                           size_t numPrefetchLocs, uint64_t flags, aclrtStream stream) {
  (void)flags;
  (void)stream;
  if (ptrs == nullptr || sizes == nullptr || count == 0 || prefetchLocs == nullptr || prefetchLocIdxs == nullptr ||
      numPrefetchLocs == 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtMemManagedPrefetchBatchAsync: a NULL array or a zero count");
  return not_supported("aclrtMemManagedPrefetchBatchAsync");
}

}  // extern "C"

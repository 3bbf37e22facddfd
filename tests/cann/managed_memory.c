/* Managed memory on npusim (tests/cann/test_managed_memory.py): every call checks its arguments as
 * CANN does, then answers ACL_ERROR_RT_FEATURE_NOT_SUPPORT (no unified memory) with a message.
 * Prints one line of codes, then "done". */
#include <acl/acl.h>
#include <stdint.h>

#include "cann_check.h"

int main(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    void *p = (void *)1;
    aclError alloc = aclrtMemAllocManaged(&p, 4096, ACL_RT_MEM_ATTACH_GLOBAL);
    const char *why = aclGetRecentErrMsg();
    aclrtMemManagedLocation loc = {ACL_MEM_LOCATIONTYPE_DEVICE, 0};
    int x = 0;
    const void *ptrs[1] = {&x};
    size_t sizes[1] = {sizeof x}, idxs[1] = {0};
    printf("managed %d %d %d advise %d %d prefetch %d %d batch %d %d\n", alloc, p == NULL, why != NULL,
           aclrtMemManagedAdvise(&x, sizeof x, ACL_MEM_ADVISE_SET_READ_MOSTLY, loc),
           aclrtMemManagedAdvise(NULL, 0, ACL_MEM_ADVISE_SET_READ_MOSTLY, loc),
           aclrtMemManagedPrefetchAsync(&x, sizeof x, loc, 0, NULL), aclrtMemManagedPrefetchAsync(NULL, 4, loc, 0, NULL),
           aclrtMemManagedPrefetchBatchAsync(ptrs, sizes, 1, &loc, idxs, 1, 0, NULL),
           aclrtMemManagedPrefetchBatchAsync(NULL, sizes, 1, &loc, idxs, 1, 0, NULL));
    printf("bad alloc %d %d\n", aclrtMemAllocManaged(NULL, 4096, ACL_RT_MEM_ATTACH_GLOBAL),
           aclrtMemAllocManaged(&p, 4096, 0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

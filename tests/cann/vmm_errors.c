/* Misuse of the virtual memory and notify API gets CANN's codes, and the objects stay usable
 * (tests/cann/test_builtin_tasks.py). Prints "name: code" lines, then "done". */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                          \
    do {                                                                  \
        aclError rc_ = (x);                                               \
        if (rc_ != ACL_SUCCESS) {                                         \
            printf("ERR line %d: %s = %d\n", __LINE__, #x, rc_);          \
            exit(1);                                                      \
        }                                                                 \
    } while (0)
#define SHOW(name, x) printf("%s: %d\n", name, (int)(x))

int main(void) {
    aclrtPhysicalMemProp prop = {0};
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    aclrtDrvMemHandle h = NULL, h2 = NULL;
    char *va = NULL;
    SHOW("malloc physical before init", aclrtMallocPhysical(&h, 2 << 20, &prop, 0));
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    printf("granularity: %zu\n", g);
    SHOW("granularity bad option", aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_UNDEF, &g));
    SHOW("physical unaligned size", aclrtMallocPhysical(&h, g + 1, &prop, 0));
    SHOW("physical flags", aclrtMallocPhysical(&h, g, &prop, 1));
    prop.location.id = 7;
    SHOW("physical bad device", aclrtMallocPhysical(&h, g, &prop, 0));
    prop.location.id = 0;
    CHECK(aclrtMallocPhysical(&h, g, &prop, 0));
    CHECK(aclrtMallocPhysical(&h2, g, &prop, 0));
    SHOW("reserve with expectPtr", aclrtReserveMemAddress((void **)&va, g, 0, (void *)0x1000, 0));
    SHOW("reserve unaligned size", aclrtReserveMemAddress((void **)&va, 100, 0, NULL, 0));
    SHOW("reserve bad alignment", aclrtReserveMemAddress((void **)&va, g, 3, NULL, 0));
    CHECK(aclrtReserveMemAddress((void **)&va, 2 * g, 0, NULL, 0));
    SHOW("map outside a reservation", aclrtMapMem(va + 2 * g, g, 0, h, 0));
    SHOW("map past the physical end", aclrtMapMem(va, g, g, h, 0));
    CHECK(aclrtMapMem(va, g, 0, h, 0));
    SHOW("map over a mapping", aclrtMapMem(va, g, 0, h2, 0));
    SHOW("free a mapped address", aclrtFree(va));
    SHOW("free physical while mapped", aclrtFreePhysical(h));
    SHOW("release while mapped", aclrtReleaseMemAddress(va));
    SHOW("unmap not a mapping", aclrtUnmapMem(va + g));
    aclrtMemAccessDesc d = {0};
    d.flags = ACL_RT_MEM_ACCESS_FLAGS_READ;
    d.location.type = ACL_MEM_LOCATION_TYPE_HOST;
    SHOW("set access on the host", aclrtMemSetAccess(va, g, &d, 1));
    d.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    SHOW("set access past the mapping", aclrtMemSetAccess(va, 2 * g, &d, 1));
    CHECK(aclrtMemSetAccess(va, g, &d, 1));
    uint64_t flags = 99;
    aclrtMemLocation loc = {0, ACL_MEM_LOCATION_TYPE_DEVICE};
    CHECK(aclrtMemGetAccess(va, &loc, &flags));
    printf("access after set: %llu\n", (unsigned long long)flags);
    CHECK(aclrtMapMem(va + g, g, 0, h2, 0));
    CHECK(aclrtUnmapMem(va + g));

    /* A fabric handle (V2) names h on this daemon: imported back, it maps the same memory. */
    aclrtMemFabricHandle fabric = {{0}};
    SHOW("export V2 bad type", aclrtMemExportToShareableHandleV2(h, 0, (aclrtMemSharedHandleType)7, &fabric));
    CHECK(aclrtMemExportToShareableHandleV2(h, ACL_RT_VMM_EXPORT_FLAG_DISABLE_PID_VALIDATION,
                                            ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, &fabric));
    SHOW("export twice", aclrtMemExportToShareableHandleV2(h, 0, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, &fabric));
    aclrtDrvMemHandle back = NULL;
    CHECK(aclrtMemImportFromShareableHandleV2(&fabric, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &back));
    CHECK(aclrtMapMem(va + g, g, 0, back, 0));
    uint64_t x = 0x1122334455667788ULL, y = 0;
    CHECK(aclrtMemcpy(va + 64, 8, &x, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(&y, 8, va + g + 64, 8, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("fabric round trip: %s\n", x == y ? "same memory" : "BAD");
    CHECK(aclrtUnmapMem(va + g));
    CHECK(aclrtFreePhysical(back));
    aclrtMemFabricHandle junk = {{0}};
    SHOW("import V2 junk", aclrtMemImportFromShareableHandleV2(&junk, ACL_MEM_SHARE_HANDLE_TYPE_FABRIC, 0, &back));
    CHECK(aclrtUnmapMem(va));
    SHOW("unmap twice", aclrtUnmapMem(va));
    CHECK(aclrtReleaseMemAddress(va));
    SHOW("release twice", aclrtReleaseMemAddress(va));
    CHECK(aclrtFreePhysical(h));
    CHECK(aclrtFreePhysical(h2));
    SHOW("free physical twice", aclrtFreePhysical(h));

    aclrtNotify n = NULL;
    SHOW("notify bad flag", aclrtCreateNotify(&n, 9));
    CHECK(aclrtCreateNotify(&n, 0));
    char key[8];
    SHOW("notify key too short", aclrtNotifyGetExportKey(n, key, sizeof(key), 0));
    int32_t pid = 1;
    SHOW("notify pids before export", aclrtNotifySetImportPid(n, &pid, 1));
    aclrtNotify other = NULL;
    SHOW("import a bogus key", aclrtNotifyImportByKey(&other, "nonsense", 0));
    SHOW("ipc import a bogus key", aclrtIpcMemImportByKey((void **)&va, "npusim-ipcmem-ffff", 0));
    SHOW("ipc close unknown", aclrtIpcMemClose("npusim-ipcmem-ffff"));
    CHECK(aclrtDestroyNotify(n));
    SHOW("notify destroy twice", aclrtDestroyNotify(n));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/* Virtual memory and notifies live across a checkpoint (tests/cann/test_vmm_notify_snapshot.py).
 *
 * Two physical allocations are mapped into reservations: A (two granules) at R1, and A's second
 * granule once more at R2, so writes through one address show through the other; B (one granule)
 * after A's at R1. Each step writes through the mappings, runs a kernel on them, and prints a
 * checksum of what it reads back through other addresses. A notify recorded at odd steps is
 * waited for at even ones, so at a checkpoint between the two its "recorded" state must be
 * carried, or the wait times out and the output differs.
 *
 * Usage: vmm_notify_steps STEPS SLEEP_MS. Prints "ready pid N", "step I HASH ..." lines, "done". */
#include <acl/acl.h>
#include <acl/npusim.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cann_check.h"

static uint64_t fnv(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 10, sleep_ms = argc > 2 ? atoi(argv[2]) : 0;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream s1, s2;
    CHECK(aclrtCreateStream(&s1));
    CHECK(aclrtCreateStream(&s2));

    aclrtPhysicalMemProp prop = {0};
    prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.memAttr = ACL_HBM_MEM_NORMAL;
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_RECOMMENDED, &g));
    aclrtDrvMemHandle a, b;
    CHECK(aclrtMallocPhysical(&a, 2 * g, &prop, 0));
    CHECK(aclrtMallocPhysical(&b, g, &prop, 0));
    char *r1, *r2;
    CHECK(aclrtReserveMemAddress((void **)&r1, 4 * g, 0, NULL, 0));
    CHECK(aclrtReserveMemAddress((void **)&r2, g, 0, NULL, 0));
    CHECK(aclrtMapMem(r1, 2 * g, 0, a, 0));
    CHECK(aclrtMapMem(r1 + 2 * g, g, 0, b, 0));
    CHECK(aclrtMapMem(r2, g, g, a, 0));  /* A's second granule, again */
    aclrtMemAccessDesc desc = {0};
    desc.flags = ACL_RT_MEM_ACCESS_FLAGS_READWRITE;
    desc.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = 0;
    CHECK(aclrtMemSetAccess(r1, 3 * g, &desc, 1));

    aclrtNotify flag, idle;
    CHECK(aclrtCreateNotify(&flag, ACL_NOTIFY_DEFAULT));
    CHECK(aclrtCreateNotify(&idle, ACL_NOTIFY_DEFAULT));  /* never recorded: stays that way */
    uint32_t id = 0;
    CHECK(aclrtGetNotifyId(flag, &id));

    const size_t n = 4096;
    uint32_t *host = malloc(n * 4), *back = malloc(g);
    printf("ready pid %d\n", (int)getpid());
    fflush(stdout);
    for (int step = 0; step < steps; step++) {
        for (size_t i = 0; i < n; i++) host[i] = (uint32_t)(i * 2654435761u + (uint32_t)step);
        /* Into A's second granule through R1; read back through R2. */
        CHECK(aclrtMemcpy(r1 + g + 512 * (step % 8), n * 4, host, n * 4, ACL_MEMCPY_HOST_TO_DEVICE));
        /* A kernel through a mapping: fill B through R1 + 2g, and copy A's data next to it. */
        CHECK(npusimLaunchFill(r1 + 2 * g, n, (float)step, s1));
        CHECK(npusimLaunchCopy(r1 + 2 * g + n * 4, r2 + 512 * (step % 8), n * 4, s1));
        if (step % 2 == 1) CHECK(aclrtRecordNotify(flag, s1));
        CHECK(aclrtSynchronizeStream(s1));
        int waited = 0;
        if (step % 2 == 0 && step > 0) {
            CHECK(aclrtWaitAndResetNotify(flag, s2, 5000));
            waited = aclrtSynchronizeStream(s2) == ACL_SUCCESS;
        }
        CHECK(aclrtMemcpy(back, g, r1 + 2 * g, 2 * n * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        uint64_t h = fnv(back, 2 * n * 4, 1469598103934665603ULL);
        CHECK(aclrtMemcpy(back, g, r2, g, ACL_MEMCPY_DEVICE_TO_HOST));
        h = fnv(back, g, h);
        printf("step %d %016llx waited=%d\n", step, (unsigned long long)h, waited);
        fflush(stdout);
        if (sleep_ms > 0) {
            struct timespec ts = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        step_gate(step);
    }
    /* The notify never recorded is still unrecorded: a wait with a timeout fails. */
    CHECK(aclrtWaitAndResetNotify(idle, s2, 50));
    printf("idle wait %d\n", aclrtSynchronizeStream(s2));
    uint64_t access = 0;
    aclrtMemLocation loc = {0, ACL_MEM_LOCATION_TYPE_DEVICE};
    CHECK(aclrtMemGetAccess(r1, &loc, &access));
    printf("access %llu notify id %u\n", (unsigned long long)access, id);

    CHECK(aclrtDestroyNotify(flag));
    CHECK(aclrtDestroyNotify(idle));
    CHECK(aclrtUnmapMem(r2));
    CHECK(aclrtUnmapMem(r1 + 2 * g));
    CHECK(aclrtUnmapMem(r1));
    CHECK(aclrtReleaseMemAddress(r2));
    CHECK(aclrtReleaseMemAddress(r1));
    CHECK(aclrtFreePhysical(b));
    CHECK(aclrtFreePhysical(a));
    CHECK(aclrtDestroyStream(s1));
    CHECK(aclrtDestroyStream(s2));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

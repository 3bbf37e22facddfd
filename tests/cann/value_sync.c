/* aclrtValueWrite / aclrtValueWait (tests/cann/test_builtin_tasks.py): one stream waits on a word
 * of device memory that another stream writes, for each wait condition; the word is also reached
 * through a VMM mapping. Prints one line per check, then "done". */
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

/* The waiter's stream is queued first and must stay behind its wait until the writer's runs. */
static void round_trip(const char *name, void *word, uint64_t before, uint64_t written, uint64_t want,
                       uint32_t flag, aclrtStream waiter, aclrtStream writer) {
    uint64_t host = before, seen = 0;
    CHECK(aclrtMemcpy(word, 8, &host, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtValueWait(word, want, flag, waiter));
    CHECK(aclrtMemcpyAsync(&seen, 8, word, 8, ACL_MEMCPY_DEVICE_TO_HOST, waiter));
    CHECK(aclrtValueWrite(word, written, 0, writer));
    CHECK(aclrtSynchronizeStream(writer));
    CHECK(aclrtSynchronizeStream(waiter));
    printf("%s: waited for %llu, saw %llu\n", name, (unsigned long long)want, (unsigned long long)seen);
}

int main(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream a, b;
    CHECK(aclrtCreateStream(&a));
    CHECK(aclrtCreateStream(&b));
    char *mem;
    CHECK(aclrtMalloc((void **)&mem, 4096, ACL_MEM_MALLOC_HUGE_FIRST));

    round_trip("eq", mem, 0, 100, 100, ACL_STREAM_WAIT_VALUE_EQ, a, b);
    round_trip("geq", mem + 8, 1, 7, 5, ACL_STREAM_WAIT_VALUE_GEQ, a, b);
    round_trip("and", mem + 16, 0, 0x30, 0x10, ACL_STREAM_WAIT_VALUE_AND, a, b);
    round_trip("nor", mem + 24, ~0ULL, 0x0f, 0xf0, ACL_STREAM_WAIT_VALUE_NOR, a, b);

    /* Already met: the wait passes at once. */
    uint64_t v = 9;
    CHECK(aclrtMemcpy(mem + 32, 8, &v, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtValueWait(mem + 32, 9, ACL_STREAM_WAIT_VALUE_EQ, a));
    CHECK(aclrtSynchronizeStream(a));
    printf("met already: ok\n");

    /* Through a VMM mapping. */
    aclrtPhysicalMemProp prop = {0};
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    aclrtDrvMemHandle h;
    CHECK(aclrtMallocPhysical(&h, g, &prop, 0));
    char *va;
    CHECK(aclrtReserveMemAddress((void **)&va, g, 0, NULL, 0));
    CHECK(aclrtMapMem(va, g, 0, h, 0));
    round_trip("mapped", va + g - 8, 0, 42, 42, ACL_STREAM_WAIT_VALUE_EQ, a, b);

    printf("write flag 1: %d\n", aclrtValueWrite(mem, 1, 1, a));
    printf("wait flag 4: %d\n", aclrtValueWait(mem, 1, 4, a));
    printf("host address: %d\n", aclrtValueWrite(&v, 1, 0, a));
    printf("null: %d\n", aclrtValueWait(NULL, 1, 0, a));

    CHECK(aclrtUnmapMem(va));
    CHECK(aclrtReleaseMemAddress(va));
    CHECK(aclrtFreePhysical(h));
    CHECK(aclrtFree(mem));
    CHECK(aclrtDestroyStream(a));
    CHECK(aclrtDestroyStream(b));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

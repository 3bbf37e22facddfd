/* Host registration, and across a checkpoint (tests/cann/test_host_register.py).
 *
 * A 3-page aclrtMallocHost buffer is registered (V2, MAPPED) and a malloc'd, unaligned one with
 * aclrtHostRegister. Each step the host writes the buffer, the device copies it through the device
 * pointer into device memory and writes bytes back through the device pointer; the step prints
 * checksums of what the host sees and of what the device copied: in place both ways, or the
 * checksums differ. After a restore the range must still be shared with the device.
 *
 * Usage: host_register_steps STEPS SLEEP_MS. Prints "errors ...", "ready pid N", "step ..." lines, "done". */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cann_check.h"

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 6, pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    const size_t n = 3 * 4096;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    uint8_t *host, *copy, *dev;
    CHECK(aclrtMallocHost((void **)&host, n));
    for (size_t i = 0; i < n; i++) host[i] = (uint8_t)(i * 7);
    uint64_t before = fnv(host, n);
    CHECK(aclrtHostRegisterV2(host, n, ACL_HOST_REG_MAPPED));
    CHECK(aclrtHostGetDevicePointer(host + 5, (void **)&dev, 0));
    dev -= 5;
    printf("kept %d\n", fnv(host, n) == before);  /* registering leaves the content as it was */
    CHECK(aclrtMalloc((void **)&copy, n, ACL_MEM_MALLOC_HUGE_FIRST));

    char *odd = malloc(1000 + 64), *odd_dev;
    CHECK(aclrtHostRegister(odd + 3, 1000, ACL_HOST_REGISTER_MAPPED, (void **)&odd_dev));
    void *unregistered = NULL;
    printf("errors again %d inner %d lookup %d unreg %d io %d flag %d\n",
           aclrtHostRegisterV2(host + 4096, 16, ACL_HOST_REG_MAPPED),
           aclrtHostRegisterV2(odd + 500, 16, ACL_HOST_REG_MAPPED),
           aclrtHostGetDevicePointer(&unregistered, (void **)&unregistered, 0), aclrtHostUnregister(host + 1),
           aclrtHostRegisterV2(&unregistered, 8, ACL_HOST_REG_IOMEMORY),
           aclrtHostGetDevicePointer(host, (void **)&unregistered, 1));

    printf("ready pid %d\n", (int)getpid());
    fflush(stdout);
    uint8_t back[3 * 4096];
    for (int step = 0; step < steps; step++) {
        for (size_t i = 0; i < n; i++) host[i] = (uint8_t)(i * 13 + (size_t)step * 31);
        /* The device reads the host's bytes through dev, and writes through dev. */
        CHECK(aclrtMemcpyAsync(copy, n, dev, n, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
        CHECK(aclrtMemsetAsync(dev + 4096 + step, 64, 0xC0 + step, 64, s));
        strcpy(odd + 3, "zero copy");
        CHECK(aclrtMemsetAsync(odd_dev + 4, 1, 'X', 1, s));
        CHECK(aclrtSynchronizeStream(s));
        CHECK(aclrtMemcpy(back, n, copy, n, ACL_MEMCPY_DEVICE_TO_HOST));
        printf("step %d device %016llx host %016llx at %02x odd %s\n", step, (unsigned long long)fnv(back, n),
               (unsigned long long)fnv(host, n), host[4096 + step], odd + 3);
        fflush(stdout);
        sleep_ms(pause_ms);
        step_gate(step);
    }
    uint64_t last = fnv(host, n);
    CHECK(aclrtHostUnregister(host));
    CHECK(aclrtHostUnregister(odd + 3));
    printf("unregistered kept %d lookup %d\n", fnv(host, n) == last,
           aclrtHostGetDevicePointer(host, (void **)&unregistered, 0));
    CHECK(aclrtFreeHost(host));
    free(odd);
    CHECK(aclrtFree(copy));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/* A stateful workload of device-binary kernels, for live checkpoints: each step adds x to acc in
 * place with the binary's vadd (run by the kernel runner, which writes device memory through a
 * shared mapping) and prints a hash of acc, so every line depends on all the steps before it: a
 * checkpoint holding any byte acc got after it restores into other lines.
 * Usage: kernel_state STEPS SLEEP_MS KERNELS.so */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "acl/acl.h"
#include "../workloads/step_gate.h"

#define CHECK(x) do { aclError rc_ = (aclError)(x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "kernel_state: line %d: %s = %d\n", __LINE__, #x, rc_); fflush(stderr); exit(3); } } while (0)

enum { N = 1 << 20 };  /* 4 MiB a buffer: several chunks of the snapshot */

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const int steps = atoi(argv[1]), sleep_ms = atoi(argv[2]);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    void *x, *acc;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&acc, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    static float host[N];
    for (int i = 0; i < N; i++) host[i] = (float)((i * 7) % 101) / 8.0f;
    CHECK(aclrtMemcpy(x, N * 4, host, N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemset(acc, N * 4, 0, N * 4));
    aclrtBinHandle bin;
    CHECK(aclrtBinaryLoadFromFile(argv[3], NULL, &bin));
    aclrtFuncHandle vadd;
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &vadd));
    struct { uint64_t x, y, z, n; } va = {(uint64_t)x, (uint64_t)acc, (uint64_t)acc, N};  /* acc += x */
    printf("ready pid %d\n", (int)getpid());
    fflush(stdout);
    for (int s = 0; s < steps; s++) {
        CHECK(aclrtLaunchKernel(vadd, 4, &va, sizeof va, stream));
        CHECK(aclrtSynchronizeStream(stream));
        CHECK(aclrtMemcpy(host, N * 4, acc, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        printf("step %d %016llx\n", s, (unsigned long long)fnv(host, sizeof host));
        fflush(stdout);
        if (sleep_ms > 0) usleep((useconds_t)sleep_ms * 1000);
        step_gate(s);
    }
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

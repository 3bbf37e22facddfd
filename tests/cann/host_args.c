/* aclrtLaunchKernelWithHostArgs and kernels on registered host memory (tests/cann/test_host_args.py).
 * Usage: host_args KERNELS_SO. Prints one "name ..." line per check, then "done". */
#include <acl/acl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cann_check.h"

struct vadd_args { uint64_t x, y, z, n; };
struct affine_args { uint64_t x, y, n, params; };
struct affine_host { struct affine_args a; float params[2]; };  /* arguments, then placeholder data */

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    enum { N = 1000 };
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    aclrtBinHandle bin;
    aclrtFuncHandle vadd, affine;
    CHECK(aclrtBinaryLoadFromFile(argv[1], NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &vadd));
    CHECK(aclrtBinaryGetFunction(bin, "affine", &affine));
    float host[N], out[N];
    for (int i = 0; i < N; i++) host[i] = (float)i;
    float *x, *y;
    CHECK(aclrtMalloc((void **)&x, sizeof(host), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&y, sizeof(host), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(x, sizeof(host), host, sizeof(host), ACL_MEMCPY_HOST_TO_DEVICE));

    /* y = 2x + 1, then y = -x + 5 from the same host buffer changed right after the first call. */
    struct affine_host h = {{(uint64_t)x, (uint64_t)y, N, 0}, {2.0f, 1.0f}};
    aclrtPlaceHolderInfo ph = {offsetof(struct affine_args, params), offsetof(struct affine_host, params)};
    CHECK(aclrtLaunchKernelWithHostArgs(affine, 4, s, NULL, &h, sizeof(h), &ph, 1));
    h.params[0] = -1.0f;
    h.params[1] = 5.0f;
    CHECK(aclrtSynchronizeStream(s));
    CHECK(aclrtMemcpy(out, sizeof(out), y, sizeof(out), ACL_MEMCPY_DEVICE_TO_HOST));
    printf("placeholder %g %g\n", out[3], out[N - 1]);
    CHECK(aclrtLaunchKernelWithHostArgs(affine, 4, s, NULL, &h, sizeof(h), &ph, 1));
    CHECK(aclrtSynchronizeStream(s));
    CHECK(aclrtMemcpy(out, sizeof(out), y, sizeof(out), ACL_MEMCPY_DEVICE_TO_HOST));
    printf("placeholder again %g %g\n", out[3], out[N - 1]);
    aclrtPlaceHolderInfo bad = {sizeof(h) - 4, 0};
    printf("errors outside %d blocks %d\n", aclrtLaunchKernelWithHostArgs(affine, 4, s, NULL, &h, sizeof(h), &bad, 1),
           aclrtLaunchKernelWithHostArgs(affine, 0, s, NULL, &h, sizeof(h), &ph, 1));

    /* No placeholders: the bytes are the arguments; z is registered host memory, written in place. */
    float *z = NULL, *z_dev = NULL;
    CHECK(aclrtMallocHost((void **)&z, sizeof(host)));
    memset(z, 0, sizeof(host));
    CHECK(aclrtHostRegister(z, sizeof(host), ACL_HOST_REGISTER_MAPPED, (void **)&z_dev));
    struct vadd_args va = {(uint64_t)x, (uint64_t)x, (uint64_t)z_dev, N};
    CHECK(aclrtLaunchKernelWithHostArgs(vadd, 3, s, NULL, &va, sizeof(va), NULL, 0));
    CHECK(aclrtSynchronizeStream(s));
    printf("zero copy %g %g\n", z[7], z[N - 1]);  /* read straight from host memory: no copy back */
    CHECK(aclrtHostUnregister(z));
    CHECK(aclrtFreeHost(z));

    CHECK(aclrtFree(x));
    CHECK(aclrtFree(y));
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/* A kernel that crashes fails its launch with ACL_ERROR_RT_AICORE_EXCEPTION; the process and the
 * device go on. Usage: kernel_crash KERNELS.so; prints "ok" lines and "done". */
#include <stdio.h>
#include <stdlib.h>

#include "acl/acl.h"

#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "line %d: %s = %d\n", __LINE__, #x, rc_); exit(1); } } while (0)
#define EXPECT(x, code) do { aclError rc_ = (x); if (rc_ != (code)) { \
    fprintf(stderr, "line %d: %s = %d, expected %d\n", __LINE__, #x, rc_, (int)(code)); exit(1); } } while (0)

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    aclrtBinHandle bin;
    aclrtFuncHandle crash;
    CHECK(aclrtBinaryLoadFromFile(argv[1], NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "crash", &crash));
    char args[8] = {0};
    CHECK(aclrtLaunchKernel(crash, 1, args, sizeof args, stream));  /* queued: fails when it runs */
    EXPECT(aclrtSynchronizeStream(stream), ACL_ERROR_RT_AICORE_EXCEPTION);
    printf("ok crash reported\n");
    int host = 42, back = 0;
    void *dev;
    CHECK(aclrtMalloc(&dev, sizeof host, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(dev, sizeof host, &host, sizeof host, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(&back, sizeof back, dev, sizeof back, ACL_MEMCPY_DEVICE_TO_HOST));
    if (back != 42) return 1;
    printf("ok device goes on\n");
    CHECK(aclrtFree(dev));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

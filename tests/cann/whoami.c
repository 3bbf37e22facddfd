/* Launches the `whoami` kernel (test_kernels.c), which reports the uid and gid it runs with and
 * tries to open PATH for writing. Usage: whoami KERNELS.so PATH; prints
 * "uid U gid G opened 0|1 errno E". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"

#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "whoami: line %d: %s = %d\n", __LINE__, #x, rc_); exit(1); } } while (0)

int main(int argc, char **argv) {
    if (argc != 3 || strlen(argv[2]) >= 240) return 2;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    void *out;
    CHECK(aclrtMalloc(&out, 16, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtBinHandle bin;
    aclrtFuncHandle f;
    CHECK(aclrtBinaryLoadFromFile(argv[1], NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "whoami", &f));
    struct { uint64_t out; char path[240]; } args = {(uint64_t)out, {0}};
    strcpy(args.path, argv[2]);
    CHECK(aclrtLaunchKernel(f, 1, &args, sizeof args, NULL));
    CHECK(aclrtSynchronizeDevice());
    int32_t got[4];
    CHECK(aclrtMemcpy(got, sizeof got, out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("uid %d gid %d opened %d errno %d\n", got[0], got[1], got[2], got[3]);
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtFree(out));
    CHECK(aclFinalize());
    return 0;
}

/* Every kernel-binary call on npusim, CANN sample style: load (file, data, aclrtBinary), find,
 * launch (plain, V2, with an argument handle and a placeholder), unload, and the errors.
 * Usage: kernel_api KERNELS.so; prints "ok ..." lines and "done". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"

#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "line %d: %s = %d\n", __LINE__, #x, rc_); exit(1); } } while (0)
#define EXPECT(x, code) do { aclError rc_ = (x); if (rc_ != (code)) { \
    fprintf(stderr, "line %d: %s = %d, expected %d\n", __LINE__, #x, rc_, (int)(code)); exit(1); } } while (0)
#define ASSERT(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); exit(1); } } while (0)

enum { N = 10000 };
struct vadd_args { uint64_t x, y, z, n; };

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(*len);
    ASSERT(fread(buf, 1, *len, f) == *len);
    fclose(f);
    return buf;
}

static void check_sum(void *z, const float *x, const float *y, int n) {
    static float got[N];
    CHECK(aclrtMemcpy(got, sizeof(float) * n, z, sizeof(float) * n, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < n; i++) ASSERT(got[i] == x[i] + y[i]);
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    aclrtBinHandle bin = NULL;
    EXPECT(aclrtBinaryLoadFromFile(argv[1], NULL, &bin), ACL_ERROR_UNINITIALIZE);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));

    static float hx[N], hy[N];
    for (int i = 0; i < N; i++) { hx[i] = (float)i * 0.5f; hy[i] = (float)(N - i); }
    void *x, *y, *z;
    CHECK(aclrtMalloc(&x, sizeof hx, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&y, sizeof hy, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&z, sizeof hx, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(x, sizeof hx, hx, sizeof hx, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(y, sizeof hy, hy, sizeof hy, ACL_MEMCPY_HOST_TO_DEVICE));

    /* Loading: a missing file, bytes that are no binary, then the real one three ways. */
    EXPECT(aclrtBinaryLoadFromFile("/nonexistent/kernels.so", NULL, &bin), ACL_ERROR_INVALID_FILE);
    EXPECT(aclrtBinaryLoadFromData("not an ELF object", 17, NULL, &bin), ACL_ERROR_INVALID_FILE);
    EXPECT(aclrtBinaryLoadFromFile(argv[1], NULL, NULL), ACL_ERROR_INVALID_PARAM);
    aclrtBinaryLoadOption lazy = {ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD, {.isLazyLoad = 1}};
    aclrtBinaryLoadOptions options = {&lazy, 1};
    CHECK(aclrtBinaryLoadFromFile(argv[1], &options, &bin));
    size_t len = 0;
    char *bytes = read_file(argv[1], &len);
    aclrtBinHandle bin2 = NULL, bin3 = NULL;
    CHECK(aclrtBinaryLoadFromData(bytes, len, NULL, &bin2));
    aclrtBinary desc = aclrtCreateBinary(bytes, len);
    ASSERT(desc != NULL);
    CHECK(aclrtBinaryLoad(desc, &bin3));
    CHECK(aclrtDestroyBinary(desc));
    free(bytes);
    printf("ok load\n");

    aclrtFuncHandle vadd = NULL, again = NULL, none = NULL;
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &vadd));
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &again));
    ASSERT(again == vadd);
    EXPECT(aclrtBinaryGetFunction(bin, "no_such_kernel", &none), ACL_ERROR_RT_SYMBOL_NOT_FOUND);
    char name[16];
    CHECK(aclrtGetFunctionName(vadd, sizeof name, name));
    ASSERT(strcmp(name, "vadd") == 0);
    printf("ok function\n");

    /* Plain launches: blocks in parallel, argument bytes as given. */
    struct vadd_args va = {(uint64_t)x, (uint64_t)y, (uint64_t)z, N};
    EXPECT(aclrtLaunchKernel(vadd, 0, &va, sizeof va, stream), ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtLaunchKernel(vadd, 7, &va, sizeof va, stream));
    CHECK(aclrtSynchronizeStream(stream));
    check_sum(z, hx, hy, N);
    CHECK(aclrtMemset(z, sizeof hx, 0, sizeof hx));
    aclrtLaunchKernelAttr attr = {ACL_RT_LAUNCH_KERNEL_ATTR_TIMEOUT, {.timeout = 10}};
    aclrtLaunchKernelCfg cfg = {&attr, 1};
    aclrtFuncHandle vadd3;
    CHECK(aclrtBinaryGetFunction(bin3, "vadd", &vadd3));
    CHECK(aclrtLaunchKernelV2(vadd3, 3, &va, sizeof va, &cfg, stream));
    CHECK(aclrtSynchronizeStream(stream));
    check_sum(z, hx, hy, N);
    printf("ok launch\n");

    /* npusimKernelGm: one block per slot, and NULL for ranges outside one allocation. */
    aclrtFuncHandle probe;
    CHECK(aclrtBinaryGetFunction(bin2, "probe", &probe));
    void *out;
    CHECK(aclrtMalloc(&out, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(out, 64, 0, 64));
    struct { uint64_t out, bytes; } pa = {(uint64_t)out, 64};
    CHECK(aclrtLaunchKernel(probe, 5, &pa, sizeof pa, NULL));
    CHECK(aclrtSynchronizeDevice());
    int32_t got[16];
    CHECK(aclrtMemcpy(got, sizeof got, out, sizeof got, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int b = 0; b < 5; b++) ASSERT(got[b] == 1 + b);
    ASSERT(got[5] == 1 && got[6] == 1 && got[7] == 1);
    printf("ok gm\n");

    /* An argument handle: two pointers and a count appended, a placeholder for {scale, bias}. */
    aclrtFuncHandle affine;
    CHECK(aclrtBinaryGetFunction(bin, "affine", &affine));
    size_t actual = 0;
    CHECK(aclrtKernelArgsGetMemSize(affine, 32, &actual));
    ASSERT(actual >= 32);
    aclrtArgsHandle args;
    aclrtParamHandle px, py, pn, pp;
    uint64_t n = N;
    CHECK(aclrtKernelArgsInit(affine, &args));
    CHECK(aclrtKernelArgsAppend(args, &x, sizeof x, &px));
    CHECK(aclrtKernelArgsAppend(args, &z, sizeof z, &py));
    CHECK(aclrtKernelArgsAppend(args, &n, sizeof n, &pn));
    CHECK(aclrtKernelArgsAppendPlaceHolder(args, &pp));
    float *params = NULL;
    CHECK(aclrtKernelArgsGetPlaceHolderBuffer(args, pp, 2 * sizeof(float), (void **)&params));
    params[0] = 2.0f;
    params[1] = 1.0f;
    EXPECT(aclrtLaunchKernelWithConfig(affine, 4, stream, NULL, args, NULL), ACL_ERROR_INVALID_PARAM);  /* not final */
    CHECK(aclrtKernelArgsFinalize(args));
    EXPECT(aclrtKernelArgsAppend(args, &n, sizeof n, &pn), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtLaunchKernelWithConfig(vadd, 4, stream, NULL, args, NULL), ACL_ERROR_INVALID_PARAM);  /* other kernel */
    CHECK(aclrtLaunchKernelWithConfig(affine, 4, stream, NULL, args, NULL));
    CHECK(aclrtSynchronizeStream(stream));
    static float hz[N];
    CHECK(aclrtMemcpy(hz, sizeof hz, z, sizeof hz, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < N; i++) ASSERT(hz[i] == 2.0f * hx[i] + 1.0f);
    /* Updated in place: the next launch sees the new values. */
    float newp[2] = {-1.0f, 0.25f};
    CHECK(aclrtKernelArgsParaUpdate(args, pp, newp, sizeof newp));
    CHECK(aclrtKernelArgsParaUpdate(args, px, &y, sizeof y));
    CHECK(aclrtLaunchKernelWithConfig(affine, 2, stream, &cfg, args, NULL));
    CHECK(aclrtSynchronizeStream(stream));
    CHECK(aclrtMemcpy(hz, sizeof hz, z, sizeof hz, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < N; i++) ASSERT(hz[i] == -hy[i] + 0.25f);
    printf("ok args\n");

    /* The caller's memory variant: the handle lives in the caller's buffer. */
    size_t handle_size = 0;
    CHECK(aclrtKernelArgsGetHandleMemSize(vadd, &handle_size));
    void *handle_mem = calloc(1, handle_size);
    char user_args[64];
    CHECK(aclrtKernelArgsInitByUserMem(vadd, handle_mem, user_args, sizeof user_args));
    aclrtParamHandle p;
    CHECK(aclrtKernelArgsAppend(handle_mem, &va, sizeof va, &p));
    CHECK(aclrtKernelArgsFinalize(handle_mem));
    CHECK(aclrtMemset(z, sizeof hx, 0, sizeof hx));
    CHECK(aclrtLaunchKernelWithConfig(vadd, 2, stream, NULL, handle_mem, NULL));
    CHECK(aclrtSynchronizeStream(stream));
    check_sum(z, hx, hy, N);
    printf("ok user memory\n");

    /* Unload: its functions are gone with it. */
    CHECK(aclrtBinaryUnLoad(bin3));
    EXPECT(aclrtLaunchKernel(vadd3, 1, &va, sizeof va, stream), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtBinaryUnLoad(bin3), ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtBinaryUnLoad(bin2));
    CHECK(aclrtBinaryUnLoad(bin));
    printf("ok unload\n");

    CHECK(aclrtFree(out));
    CHECK(aclrtFree(x));
    CHECK(aclrtFree(y));
    CHECK(aclrtFree(z));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

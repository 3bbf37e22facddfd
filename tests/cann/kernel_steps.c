/* A workload with every kernel resource live, for checkpoint/restore: a device binary loaded from
 * a file that is deleted right after, its functions, an argument handle with a placeholder, a model
 * run instance captured from a kernel launch and an aclnnAdd, and the operator API's own binary.
 * Each step feeds new input, launches with the argument handle, replays the model and prints a
 * hash of the result; the output depends only on the step number.
 * Usage: kernel_steps STEPS SLEEP_MS KERNELS.so (the file is unlinked once loaded). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_add.h"
#include "../workloads/step_gate.h"

#define CHECK(x) do { aclError rc_ = (aclError)(x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "kernel_steps: line %d: %s = %d\n", __LINE__, #x, rc_); fflush(stderr); exit(3); } } while (0)

enum { N = 4096 };

static uint64_t fnv(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
    return h;
}

static aclTensor *tensor(void *dev) {
    int64_t shape[2] = {N / 64, 64}, strides[2] = {64, 1};
    return aclCreateTensor(shape, 2, ACL_FLOAT, strides, 0, ACL_FORMAT_ND, shape, 2, dev);
}

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    const int steps = atoi(argv[1]), sleep_ms = atoi(argv[2]);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream, capture;
    CHECK(aclrtCreateStream(&stream));
    CHECK(aclrtCreateStream(&capture));
    void *x, *y, *z, *w;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&y, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&z, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&w, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));

    aclrtBinHandle bin;
    CHECK(aclrtBinaryLoadFromFile(argv[3], NULL, &bin));
    if (unlink(argv[3]) != 0) return 4;  /* restore must not need the file */
    aclrtFuncHandle vadd, affine;
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &vadd));
    CHECK(aclrtBinaryGetFunction(bin, "affine", &affine));

    /* y = scale * x + bias through an argument handle (the placeholder carries scale, bias). */
    aclrtArgsHandle args;
    aclrtParamHandle p;
    uint64_t n = N;
    float *params;
    CHECK(aclrtKernelArgsInit(affine, &args));
    CHECK(aclrtKernelArgsAppend(args, &x, sizeof x, &p));
    CHECK(aclrtKernelArgsAppend(args, &y, sizeof y, &p));
    CHECK(aclrtKernelArgsAppend(args, &n, sizeof n, &p));
    CHECK(aclrtKernelArgsAppendPlaceHolder(args, &p));
    CHECK(aclrtKernelArgsGetPlaceHolderBuffer(args, p, 2 * sizeof(float), (void **)&params));
    CHECK(aclrtKernelArgsFinalize(args));

    /* The model: z = x + y (a kernel), w = z + 0.5 * x (aclnnAdd), recorded, not run. */
    aclTensor *tz = tensor(z), *tx = tensor(x), *tw = tensor(w);
    float half = 0.5f;
    aclScalar *alpha = aclCreateScalar(&half, ACL_FLOAT);
    uint64_t ws = 0;
    aclOpExecutor *exec;
    CHECK(aclnnAddGetWorkspaceSize(tz, tx, alpha, tw, &ws, &exec));
    struct { uint64_t x, y, z, n; } va = {(uint64_t)x, (uint64_t)y, (uint64_t)z, N};
    aclmdlRI model;
    CHECK(aclmdlRICaptureBegin(capture, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    CHECK(aclrtLaunchKernel(vadd, 4, &va, sizeof va, capture));
    CHECK(aclnnAdd(NULL, ws, exec, capture));
    CHECK(aclmdlRICaptureEnd(capture, &model));

    printf("ready pid %d\n", (int)getpid());
    fflush(stdout);
    static float host[N];
    for (int s = 0; s < steps; s++) {
        for (int i = 0; i < N; i++) host[i] = (float)((i * 7 + s * 13) % 101) / 8.0f;
        CHECK(aclrtMemcpy(x, N * 4, host, N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
        params[0] = 1.0f + (float)s / 4.0f;
        params[1] = (float)(s % 5);
        CHECK(aclrtLaunchKernelWithConfig(affine, 3, stream, NULL, args, NULL));
        CHECK(aclrtSynchronizeStream(stream));
        CHECK(aclmdlRIExecuteAsync(model, stream));
        CHECK(aclrtSynchronizeStream(stream));
        CHECK(aclrtMemcpy(host, N * 4, w, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
        printf("step %d %016llx %g\n", s, (unsigned long long)fnv(host, sizeof host), host[N - 1]);
        fflush(stdout);
        if (sleep_ms > 0) usleep((useconds_t)sleep_ms * 1000);
        step_gate(s);
    }
    CHECK(aclmdlRIDestroy(model));
    CHECK(aclDestroyTensor(tz));
    CHECK(aclDestroyTensor(tx));
    CHECK(aclDestroyTensor(tw));
    CHECK(aclDestroyScalar(alpha));
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtDestroyStream(capture));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

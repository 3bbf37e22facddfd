/* Model run instances on npusim, CANN sample style: work captured on a stream is recorded, not
 * run, and replays on aclmdlRIExecuteAsync; a model built from bound streams; the operator API
 * inside a capture. Usage: model_ri KERNELS.so; prints "ok ..." lines and "done". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "aclnnop/aclnn_add.h"
#include "aclnnop/aclnn_mul.h"

#define CHECK(x) do { aclError rc_ = (aclError)(x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "line %d: %s = %d\n", __LINE__, #x, rc_); exit(1); } } while (0)
#define EXPECT(x, code) do { aclError rc_ = (x); if (rc_ != (code)) { \
    fprintf(stderr, "line %d: %s = %d, expected %d\n", __LINE__, #x, rc_, (int)(code)); exit(1); } } while (0)
#define ASSERT(c) do { if (!(c)) { fprintf(stderr, "line %d: %s\n", __LINE__, #c); exit(1); } } while (0)

enum { N = 8 };

static aclTensor *tensor(void *dev) {
    int64_t shape[1] = {N};
    return aclCreateTensor(shape, 1, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, shape, 1, dev);
}

static void read_back(float *host, void *dev) {
    CHECK(aclrtMemcpy(host, N * 4, dev, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
}

int main(int argc, char **argv) {
    ASSERT(argc == 2);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream stream, exec;
    CHECK(aclrtCreateStream(&stream));
    CHECK(aclrtCreateStream(&exec));
    float ha[N], hb[N], got[N];
    for (int i = 0; i < N; i++) { ha[i] = (float)(i + 1); hb[i] = 2.0f; }
    void *a, *b, *c, *d;
    CHECK(aclrtMalloc(&a, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&b, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&c, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&d, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(c, N * 4, 0, N * 4));
    CHECK(aclrtMemset(d, N * 4, 0, N * 4));
    CHECK(aclrtMemcpy(b, N * 4, hb, N * 4, ACL_MEMCPY_HOST_TO_DEVICE));
    float *pinned;
    CHECK(aclrtMallocHost((void **)&pinned, N * 4));
    memcpy(pinned, ha, sizeof ha);

    /* Capture: an async copy and two operators, c = (a + 1.5 * b) * b. Nothing runs yet. */
    aclTensor *ta = tensor(a), *tb = tensor(b), *tc = tensor(c), *td = tensor(d);
    float alphaValue = 1.5f;
    aclScalar *alpha = aclCreateScalar(&alphaValue, ACL_FLOAT);
    uint64_t ws = 1;
    aclOpExecutor *add, *mul;
    CHECK(aclnnAddGetWorkspaceSize(ta, tb, alpha, td, &ws, &add));
    ASSERT(ws == 0);
    CHECK(aclnnMulGetWorkspaceSize(td, tb, tc, &ws, &mul));
    aclmdlRICaptureStatus status;
    aclmdlRI model = NULL, seen = NULL;
    CHECK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    ASSERT(status == ACL_MODEL_RI_CAPTURE_STATUS_NONE && seen == NULL);
    CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    EXPECT(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL), ACL_ERROR_RT_STREAM_CAPTURED);
    CHECK(aclmdlRICaptureGetInfo(stream, &status, &seen));
    ASSERT(status == ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE && seen != NULL);
    CHECK(aclrtMemcpyAsync(a, N * 4, pinned, N * 4, ACL_MEMCPY_HOST_TO_DEVICE, stream));
    aclmdlRICaptureMode mode = ACL_MODEL_RI_CAPTURE_MODE_RELAXED;
    CHECK(aclmdlRICaptureThreadExchangeMode(&mode));
    ASSERT(mode == ACL_MODEL_RI_CAPTURE_MODE_GLOBAL);
    CHECK(aclmdlRICaptureThreadExchangeMode(&mode));
    CHECK(aclnnAdd(NULL, 0, add, stream));
    CHECK(aclnnMul(NULL, 0, mul, stream));
    EXPECT(aclmdlRIExecuteAsync(seen, exec), ACL_ERROR_RT_MODEL_CAPTURED);  /* still capturing */
    CHECK(aclmdlRICaptureEnd(stream, &model));
    ASSERT(model == seen);
    EXPECT(aclmdlRICaptureEnd(stream, &model), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
    CHECK(aclrtSynchronizeStream(stream));
    read_back(got, c);
    for (int i = 0; i < N; i++) ASSERT(got[i] == 0.0f);  /* recorded, not run */
    printf("ok capture\n");

    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < N; i++) pinned[i] = ha[i] + (float)round;
        CHECK(aclmdlRIExecuteAsync(model, exec));
        CHECK(aclrtSynchronizeStream(exec));
        read_back(got, c);
        for (int i = 0; i < N; i++) ASSERT(got[i] == (ha[i] + (float)round + 1.5f * 2.0f) * 2.0f);
    }
    CHECK(aclmdlRIExecute(model, -1));
    CHECK(aclmdlRIDebugPrint(model));
    CHECK(aclmdlRIDebugJsonPrint(model, "/dev/null", 0));
    printf("ok execute\n");

    /* A kernel and an event inside a capture; replayed on another stream. */
    aclrtBinHandle bin;
    aclrtFuncHandle vadd;
    CHECK(aclrtBinaryLoadFromFile(argv[1], NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &vadd));
    struct { uint64_t x, y, z, n; } va = {(uint64_t)b, (uint64_t)b, (uint64_t)d, N};
    aclrtEvent done;
    CHECK(aclrtCreateEvent(&done));
    aclmdlRI model2;
    CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclrtLaunchKernel(vadd, 2, &va, sizeof va, stream));
    CHECK(aclrtRecordEvent(done, stream));
    CHECK(aclmdlRICaptureEnd(stream, &model2));
    CHECK(aclrtMemset(d, N * 4, 0, N * 4));
    CHECK(aclmdlRIExecuteAsync(model2, exec));
    CHECK(aclrtSynchronizeEvent(done));
    read_back(got, d);
    for (int i = 0; i < N; i++) ASSERT(got[i] == 4.0f);
    printf("ok kernel in a model\n");

    /* A model built from a bound stream. */
    aclmdlRI built;
    CHECK(aclmdlRIBuildBegin(&built, 0));
    CHECK(aclmdlRIBindStream(built, stream, ACL_MODEL_STREAM_FLAG_HEAD));
    CHECK(aclrtMemsetAsync(d, N * 4, 0, N * 4, stream));
    CHECK(aclrtLaunchKernel(vadd, 1, &va, sizeof va, stream));
    CHECK(aclmdlRIEndTask(built, stream));
    CHECK(aclmdlRIBuildEnd(built, NULL));
    CHECK(aclmdlRIUnbindStream(built, stream));
    EXPECT(aclmdlRIUnbindStream(built, stream), ACL_ERROR_RT_STREAM_MODEL);
    CHECK(aclrtMemset(d, N * 4, 0x7f, N * 4));
    CHECK(aclmdlRIExecuteAsync(built, exec));
    CHECK(aclrtSynchronizeStream(exec));
    read_back(got, d);
    for (int i = 0; i < N; i++) ASSERT(got[i] == 4.0f);
    printf("ok built model\n");

    /* A task group, updated after the capture: the same operator with another alpha. */
    aclmdlRI grouped;
    aclrtTaskGrp group;
    aclrtStream update;
    CHECK(aclrtCreateStream(&update));
    aclOpExecutor *add1, *add2;
    CHECK(aclnnAddGetWorkspaceSize(ta, tb, alpha, td, &ws, &add1));
    CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclmdlRICaptureTaskGrpBegin(stream));
    CHECK(aclnnAdd(NULL, 0, add1, stream));
    CHECK(aclmdlRICaptureTaskGrpEnd(stream, &group));
    CHECK(aclmdlRICaptureEnd(stream, &grouped));
    CHECK(aclmdlRIExecuteAsync(grouped, exec));
    CHECK(aclrtSynchronizeStream(exec));
    read_back(got, d);
    for (int i = 0; i < N; i++) ASSERT(got[i] == ha[i] + 2.0f + 1.5f * 2.0f);  /* a is ha + 2 since round 2 */
    float minusOne = -1.0f;
    aclScalar *alpha2 = aclCreateScalar(&minusOne, ACL_FLOAT);
    CHECK(aclnnAddGetWorkspaceSize(ta, tb, alpha2, td, &ws, &add2));
    CHECK(aclmdlRICaptureTaskUpdateBegin(update, group));
    CHECK(aclnnAdd(NULL, 0, add2, update));
    CHECK(aclmdlRICaptureTaskUpdateEnd(update));
    CHECK(aclmdlRIExecuteAsync(grouped, exec));
    CHECK(aclrtSynchronizeStream(exec));
    read_back(got, d);
    for (int i = 0; i < N; i++) ASSERT(got[i] == ha[i] + 2.0f - 2.0f);
    EXPECT(aclmdlRICaptureTaskUpdateEnd(update), ACL_ERROR_RT_STREAM_NOT_CAPTURED);
    CHECK(aclmdlRIDestroy(grouped));
    CHECK(aclDestroyScalar(alpha2));
    CHECK(aclrtDestroyStream(update));
    printf("ok task group update\n");

    /* Conditions: IF with two branches; WHILE whose body clears its condition (one iteration). */
    aclrtStream sub;
    CHECK(aclrtCreateStream(&sub));
    aclmdlRI parent = NULL, branches[2] = {NULL, NULL}, loop = NULL, body[1] = {NULL};
    aclmdlRICondHandle cond, cond2;
    uint64_t *condDev, *condDev2;
    CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclmdlRICaptureGetInfo(stream, &status, &parent));
    CHECK(aclmdlRICondHandleCreate(parent, 0, ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT, &cond));
    CHECK(aclmdlRICondHandleGetCondPtr(cond, &condDev));
    aclmdlRICondTaskParams ifParams = {cond, ACL_MODEL_RI_COND_TYPE_IF, 2, branches};
    CHECK(aclmdlRIAddCondTask(ifParams, stream, 0));
    ASSERT(branches[0] != NULL && branches[1] != NULL);
    CHECK(aclmdlRICaptureToModelRIBegin(sub, branches[0], ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclrtMemsetAsync(d, N * 4, 0x11, N * 4, sub));
    CHECK(aclmdlRICaptureEnd(sub, &branches[0]));
    CHECK(aclmdlRICaptureToModelRIBegin(sub, branches[1], ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclrtMemsetAsync(d, N * 4, 0x22, N * 4, sub));
    CHECK(aclmdlRICaptureEnd(sub, &branches[1]));
    CHECK(aclmdlRICaptureEnd(stream, &parent));
    const uint64_t one = 1, zero = 0;
    unsigned char bytes[N * 4];
    CHECK(aclrtMemcpy(condDev, 8, &one, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclmdlRIExecuteAsync(parent, exec));
    CHECK(aclrtSynchronizeStream(exec));
    CHECK(aclrtMemcpy(bytes, sizeof bytes, d, sizeof bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    ASSERT(bytes[0] == 0x11 && bytes[N * 4 - 1] == 0x11);
    CHECK(aclrtMemcpy(condDev, 8, &zero, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclmdlRIExecuteAsync(parent, exec));
    CHECK(aclrtSynchronizeStream(exec));
    CHECK(aclrtMemcpy(bytes, sizeof bytes, d, sizeof bytes, ACL_MEMCPY_DEVICE_TO_HOST));
    ASSERT(bytes[0] == 0x22 && bytes[N * 4 - 1] == 0x22);

    void *zeroDev;
    CHECK(aclrtMalloc(&zeroDev, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(zeroDev, 64, 0, 64));
    struct { uint64_t x, y, z, n; } acc = {(uint64_t)d, (uint64_t)b, (uint64_t)d, N};
    CHECK(aclmdlRICaptureBegin(stream, ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclmdlRICaptureGetInfo(stream, &status, &loop));
    CHECK(aclmdlRICondHandleCreate(loop, 0, 0, &cond2));
    CHECK(aclmdlRICondHandleGetCondPtr(cond2, &condDev2));
    aclmdlRICondTaskParams whileParams = {cond2, ACL_MODEL_RI_COND_TYPE_WHILE, 1, body};
    CHECK(aclmdlRIAddCondTask(whileParams, stream, 0));
    CHECK(aclmdlRICaptureToModelRIBegin(sub, body[0], ACL_MODEL_RI_CAPTURE_MODE_RELAXED));
    CHECK(aclrtLaunchKernel(vadd, 2, &acc, sizeof acc, sub));  /* d += b */
    CHECK(aclrtMemcpyAsync(condDev2, 8, zeroDev, 8, ACL_MEMCPY_DEVICE_TO_DEVICE, sub));
    CHECK(aclmdlRICaptureEnd(sub, &body[0]));
    CHECK(aclmdlRICaptureEnd(stream, &loop));
    CHECK(aclrtMemset(d, N * 4, 0, N * 4));
    CHECK(aclrtMemcpy(condDev2, 8, &one, 8, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclmdlRIExecuteAsync(loop, exec));
    CHECK(aclrtSynchronizeStream(exec));
    read_back(got, d);
    for (int i = 0; i < N; i++) ASSERT(got[i] == 2.0f);
    CHECK(aclmdlRIDestroy(parent));
    CHECK(aclmdlRIDestroy(loop));
    CHECK(aclrtFree(zeroDev));
    CHECK(aclrtDestroyStream(sub));
    printf("ok conditions\n");

    CHECK(aclmdlRIDestroy(built));
    CHECK(aclmdlRIDestroy(model2));
    CHECK(aclmdlRIDestroy(model));
    EXPECT(aclmdlRIDestroy(model), ACL_ERROR_INVALID_PARAM);
    CHECK(aclDestroyTensor(ta));
    CHECK(aclDestroyTensor(tb));
    CHECK(aclDestroyTensor(tc));
    CHECK(aclDestroyTensor(td));
    CHECK(aclDestroyScalar(alpha));
    CHECK(aclrtDestroyEvent(done));
    CHECK(aclrtBinaryUnLoad(bin));
    CHECK(aclrtFreeHost(pinned));
    CHECK(aclrtFree(a));
    CHECK(aclrtFree(b));
    CHECK(aclrtFree(c));
    CHECK(aclrtFree(d));
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtDestroyStream(exec));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/* The runtime calls cann-kernel-host added, with their semantics checked (tests/cann/
 * test_kernel_host_api.py): data buffers, aclrtResetEvent, device status / utilization / stream
 * priority range, mstx marks and ranges in the profiler's data, the dump settings from aclInit's
 * configuration, acldumpSaveExceptionInfo, the kernel argument dump, and a kernel on VMM-mapped
 * memory. Prints one "ok NAME" line per check; exits non-zero at the first failure.
 * Usage: kernel_host_api ACL_JSON PROFILE_DIR ARGS_DUMP_DIR KERNELS.so */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "acl/acl.h"
#include "acl/acl_dump.h"
#include "acl/acl_prof.h"
#include "mstx/ms_tools_ext.h"

#define CHECK(x) do { aclError rc_ = (aclError)(x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "kernel_host_api: line %d: %s = %d\n", __LINE__, #x, rc_); exit(3); } } while (0)
#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "kernel_host_api: line %d: %s\n", __LINE__, #c); exit(4); } } while (0)

enum { N = 256 };

static void data_buffers(void *dev) {
    aclDataBuffer *b = aclCreateDataBuffer(dev, N * 4);
    EXPECT(b != NULL && aclGetDataBufferAddr(b) == dev && aclGetDataBufferSizeV2(b) == N * 4);
    EXPECT(aclGetDataBufferSize(b) == N * 4);
    char host[8];
    CHECK(aclUpdateDataBuffer(b, host, sizeof host));
    EXPECT(aclGetDataBufferAddr(b) == host && aclGetDataBufferSizeV2(b) == sizeof host);
    CHECK(aclDestroyDataBuffer(b));
    aclDataBuffer *empty = aclCreateDataBuffer(NULL, 0);
    EXPECT(empty != NULL && aclGetDataBufferAddr(empty) == NULL && aclGetDataBufferSizeV2(empty) == 0);
    CHECK(aclDestroyDataBuffer(empty));
    EXPECT(aclDestroyDataBuffer(NULL) == ACL_ERROR_INVALID_PARAM);
    EXPECT(aclGetDataBufferAddr(NULL) == NULL && aclGetDataBufferSizeV2(NULL) == 0);
    printf("ok data buffers\n");
}

/* After a reset the event is not recorded, and a wait queued then waits for the next record: the
 * copy stream b makes after its wait sees what stream a wrote before recording again. */
static void reset_event(void *x, void *y) {
    aclrtStream a, b;
    aclrtEvent e;
    aclrtEventRecordedStatus st;
    CHECK(aclrtCreateStream(&a));
    CHECK(aclrtCreateStream(&b));
    CHECK(aclrtCreateEvent(&e));
    CHECK(aclrtRecordEvent(e, a));
    CHECK(aclrtSynchronizeEvent(e));
    CHECK(aclrtQueryEventStatus(e, &st));
    EXPECT(st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    CHECK(aclrtResetEvent(e, a));
    CHECK(aclrtQueryEventStatus(e, &st));
    EXPECT(st == ACL_EVENT_RECORDED_STATUS_NOT_READY);
    CHECK(aclrtSynchronizeEvent(e));  /* nothing recorded since the reset: returns at once */
    static int in[N], out[N];
    for (int i = 0; i < N; i++) in[i] = 7000 + i;
    CHECK(aclrtMemset(y, N * 4, 0, N * 4));
    CHECK(aclrtStreamWaitEvent(b, e));
    CHECK(aclrtMemcpyAsync(y, N * 4, x, N * 4, ACL_MEMCPY_DEVICE_TO_DEVICE, b));
    CHECK(aclrtMemcpyAsync(x, N * 4, in, N * 4, ACL_MEMCPY_HOST_TO_DEVICE, a));
    CHECK(aclrtRecordEvent(e, a));
    CHECK(aclrtSynchronizeStream(b));
    CHECK(aclrtMemcpy(out, sizeof out, y, N * 4, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT(memcmp(in, out, sizeof in) == 0);
    CHECK(aclrtQueryEventStatus(e, &st));
    EXPECT(st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    EXPECT(aclrtResetEvent(NULL, a) != ACL_SUCCESS);
    CHECK(aclrtDestroyEvent(e));
    CHECK(aclrtDestroyStream(a));
    CHECK(aclrtDestroyStream(b));
    printf("ok reset event\n");
}

/* Status, utilization (memory: the share in use, with an eighth of the device allocated) and the
 * priority range that aclrtCreateStreamWithConfig accepts. */
static void device_queries(void) {
    aclrtDeviceStatus st = ACL_RT_DEVICE_STATUS_END;
    CHECK(aclrtQueryDeviceStatus(0, &st));
    EXPECT(st == ACL_RT_DEVICE_STATUS_NORMAL);
    EXPECT(aclrtQueryDeviceStatus(99, &st) == ACL_ERROR_RT_INVALID_DEVICEID);
    size_t free_bytes, total;
    CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free_bytes, &total));
    void *eighth;
    CHECK(aclrtMalloc(&eighth, total / 8, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtUtilizationInfo u;
    memset(&u, 0xff, sizeof u);
    u.utilizationExtend = NULL;
    CHECK(aclrtGetDeviceUtilizationRate(0, &u));
    EXPECT(u.cubeUtilization == 0 && u.vectorUtilization == 0 && u.aicpuUtilization == 0);
    EXPECT(u.memoryUtilization >= 12 && u.memoryUtilization <= 100);
    u.utilizationExtend = (aclrtUtilizationExtendInfo *)&u;
    EXPECT(aclrtGetDeviceUtilizationRate(0, &u) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtFree(eighth));
    int32_t least = -1, greatest = -1;
    CHECK(aclrtDeviceGetStreamPriorityRange(&least, &greatest));
    EXPECT(least == 7 && greatest == 0);
    aclrtStream s;
    CHECK(aclrtCreateStreamWithConfig(&s, (uint32_t)least, 0));
    CHECK(aclrtDestroyStream(s));
    EXPECT(aclrtCreateStreamWithConfig(&s, (uint32_t)least + 1, 0) == ACL_ERROR_INVALID_PARAM);
    printf("ok device queries\n");
}

static void mstx(const char *dir) {
    CHECK(aclprofInit(dir, strlen(dir)));
    mstxDomainHandle_t d = mstxDomainCreateA("demo");
    EXPECT(d != NULL && mstxDomainCreateA(NULL) == NULL);
    mstxMarkA("plain mark", NULL);
    mstxRangeId outer = mstxRangeStartA("outer range", NULL);
    mstxDomainMarkA(d, "domain mark", NULL);
    mstxRangeId inner = mstxDomainRangeStartA(d, "inner range", NULL);
    EXPECT(outer != MSTX_INVALID_ID && inner != MSTX_INVALID_ID && inner != outer);
    EXPECT(mstxRangeStartA(NULL, NULL) == MSTX_INVALID_ID);
    mstxDomainRangeEnd(d, inner);
    mstxRangeEnd(outer);
    mstxDomainDestroy(d);
    CHECK(aclprofFinalize());
    printf("ok mstx\n");
}

static void dump(void *x, const char *args_dir, const char *kernels) {
    const char *data = acldumpGetPath(DATA_DUMP);
    EXPECT(data != NULL);
    printf("data dump path %s\n", data);
    char exc[ACL_DUMP_MAX_FILE_PATH_LENGTH];
    CHECK(acldumpGetExceptionInfoPath(exc, sizeof exc));
    EXPECT(strcmp(exc, data) == 0);
    EXPECT(acldumpGetExceptionInfoPath(exc, 2) == ACL_ERROR_INVALID_PARAM);
    EXPECT(acldumpGetPath(OVERFLOW_DUMP) == NULL);

    static float dev_in[N], host_t[4] = {1.5f, -2.0f, 3.25f, 0.0f};
    for (int i = 0; i < N; i++) dev_in[i] = (float)i * 0.5f;
    CHECK(aclrtMemcpy(x, N * 4, dev_in, sizeof dev_in, ACL_MEMCPY_HOST_TO_DEVICE));
    acldumpTensorInfo t[2];
    memset(t, 0, sizeof t);
    t[0].type = ACL_DUMP_TENSOR_INPUT;
    t[0].tensorSize = sizeof dev_in;
    t[0].dataType = ACL_FLOAT;
    t[0].tensorAddr = (int64_t *)x;
    t[0].addrType = ACL_DUMP_ADDR_RAW;
    t[0].placement = ACL_DUMP_PLACEMENT_DEVICE;
    t[0].shapeNum = 2;
    t[0].shape[0] = 16;
    t[0].shape[1] = 16;
    t[1] = t[0];
    t[1].type = ACL_DUMP_TENSOR_OUTPUT;
    t[1].tensorSize = sizeof host_t;
    t[1].tensorAddr = (int64_t *)host_t;
    t[1].placement = ACL_DUMP_PLACEMENT_HOST;
    t[1].shapeNum = 1;
    t[1].shape[0] = 4;
    CHECK(acldumpSaveExceptionInfo("check", "stage=test", t, 2));
    EXPECT(acldumpSaveExceptionInfo("../escape", "x", t, 2) == ACL_ERROR_INVALID_PARAM);

    int32_t (*cb)(const acldumpChunk *, int32_t) = NULL;
    EXPECT(acldumpRegCallback(cb, 0) == ACL_ERROR_INVALID_PARAM);

    aclrtBinHandle bin;
    aclrtFuncHandle fn;
    CHECK(aclrtBinaryLoadFromFile(kernels, NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "vadd", &fn));
    EXPECT(aclopStartDumpArgs(2, args_dir) == ACL_ERROR_INVALID_PARAM);
    CHECK(aclopStartDumpArgs(ACL_OP_DUMP_OP_AICORE_ARGS, args_dir));
    struct { void *a, *b, *c; uint64_t n; } va = {x, x, x, 4};
    CHECK(aclrtLaunchKernel(fn, 2, &va, sizeof va, NULL));
    CHECK(aclopStopDumpArgs(ACL_OP_DUMP_OP_AICORE_ARGS));
    CHECK(aclrtLaunchKernel(fn, 3, &va, sizeof va, NULL));  /* not dumped */
    CHECK(aclrtSynchronizeStream(NULL));

    /* A kernel on memory reached through a VMM mapping (an alias of a physical allocation), at an
     * offset of a page into the physical allocation: it computes there like on aclrtMalloc memory. */
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    aclrtDrvMemHandle phys;
    void *mapped;
    CHECK(aclrtMallocPhysical(&phys, 2 * g, &prop, 0));
    CHECK(aclrtReserveMemAddress(&mapped, g, 0, NULL, 0));
    CHECK(aclrtMapMem(mapped, g, g, phys, 0));
    static float ones[N], twice[N];
    for (int i = 0; i < N; i++) ones[i] = 1.0f + (float)i;
    CHECK(aclrtMemcpy(mapped, g, ones, sizeof ones, ACL_MEMCPY_HOST_TO_DEVICE));
    struct { void *a, *b, *c; uint64_t n; } vm = {mapped, mapped, mapped, N};
    CHECK(aclrtLaunchKernel(fn, 2, &vm, sizeof vm, NULL));
    CHECK(aclrtSynchronizeStream(NULL));
    CHECK(aclrtMemcpy(twice, sizeof twice, mapped, sizeof twice, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < N; i++) EXPECT(twice[i] == 2.0f * ones[i]);
    CHECK(aclrtUnmapMem(mapped));
    CHECK(aclrtReleaseMemAddress(mapped));
    CHECK(aclrtFreePhysical(phys));
    CHECK(aclrtBinaryUnLoad(bin));
    printf("args %p\n", x);

    EXPECT(aclmdlSetDump("/nonexistent.json") == ACL_ERROR_DUMP_NOT_RUN);
    CHECK(aclmdlInitDump());
    EXPECT(aclmdlInitDump() == ACL_ERROR_DUMP_ALREADY_RUN);
    CHECK(aclmdlFinalizeDump());
    EXPECT(aclmdlFinalizeDump() == ACL_ERROR_DUMP_NOT_RUN);
    printf("ok dump\n");
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    CHECK(aclInit(argv[1]));
    CHECK(aclrtSetDevice(0));
    void *x, *y;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&y, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    data_buffers(x);
    reset_event(x, y);
    device_queries();
    mstx(argv[2]);
    dump(x, argv[3], argv[4]);
    CHECK(aclrtFree(x));
    CHECK(aclrtFree(y));
    CHECK(aclrtResetDeviceForce(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/*
 * CANN's documented semantics of the runtime surface, checked one by one against npusim
 * (tests/cann/test_cann_api.py): errors and system info, contexts, stream and event
 * configuration, host callbacks, external allocators, overflow controls, profiling, tdt channels
 * and queues, aclrtMemset on host memory and the P2P sample's reset order. Needs a daemon with 2
 * devices; profiling writes under the directory in $CANN_API_PROF_DIR.
 *
 *     cann_api        prints "ok NAME" or "FAIL NAME: why" per check, then "checks N failed F";
 *                     exit 0 only if none failed
 */
#include <acl/acl.h>
#include <acl/acl_prof.h>
#include <acl/acl_tdt.h>
#include <acl/acl_tdt_queue.h>
#include <securec.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int checks, failed;

#define EXPECT(name, cond) do { checks++; if (cond) printf("ok %s\n", name); \
    else { failed++; printf("FAIL %s: %s (line %d)\n", name, #cond, __LINE__); } } while (0)
#define MUST(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    printf("FAIL setup: %s = %d\n", #x, rc_); exit(3); } } while (0)

static void errors_and_system(void) {
    aclrtRunMode mode = ACL_DEVICE;
    EXPECT("run mode is host", aclrtGetRunMode(&mode) == ACL_SUCCESS && mode == ACL_HOST);
    aclError ret = aclrtGetRunMode(NULL);
    EXPECT("bad argument fails", ret == ACL_ERROR_INVALID_PARAM);
    EXPECT("peek keeps the last error", aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM &&
                                        aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    EXPECT("get returns the last error", aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM);
    EXPECT("get cleared it", aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS &&
                             aclrtPeekAtLastError(ACL_RT_THREAD_LEVEL) == ACL_SUCCESS);
    const char *msg = aclGetRecentErrMsg();
    EXPECT("recent message names the call", msg != NULL && strstr(msg, "aclrtGetRunMode") != NULL);
    EXPECT("recent message is read once", aclGetRecentErrMsg() == NULL);
    aclrtErrorInfo info;
    memset(&info, 0xff, sizeof(info));
    EXPECT("verbose error info: none", aclrtGetErrorVerbose(0, &info) == ACL_SUCCESS && info.errorType == ACL_RT_NO_ERROR);

    char pkg[] = "runtime", bad[] = "no-such-package", ver[128] = "";
    int32_t num = 0;
    EXPECT("version string", aclsysGetVersionStr(pkg, ver) == ACL_SUCCESS && strcmp(ver, "9.1.0") == 0);
    EXPECT("version number", aclsysGetVersionNum(pkg, &num) == ACL_SUCCESS && num == 90100);
    EXPECT("unknown package", aclsysGetVersionStr(bad, ver) == ACL_ERROR_INVALID_FILE);
    const char *soc = aclrtGetSocName();
    int32_t compatible = -1;
    EXPECT("soc name", soc != NULL && strcmp(soc, "npusim") == 0);
    EXPECT("own arch is compatible", aclrtCheckArchCompatibility(soc, &compatible) == ACL_SUCCESS && compatible == 1);
    EXPECT("other arch is not", aclrtCheckArchCompatibility("Ascend910B1", &compatible) == ACL_SUCCESS && compatible == 0);
    int32_t cap = -1;
    EXPECT("device capability", aclrtGetDeviceCapability(0, ACL_FEATURE_TSCPU_TASK_UPDATE_SUPPORT_AIC_AIV, &cap) == ACL_SUCCESS &&
                                cap == ACL_DEV_FEATURE_NOT_SUPPORT);
    int64_t cores = 0, mem = 0;
    EXPECT("device info", aclrtGetDeviceInfo(0, ACL_DEV_ATTR_AICORE_CORE_NUM, &cores) == ACL_SUCCESS && cores > 0 &&
                          aclrtGetDeviceInfo(1, ACL_DEV_ATTR_TOTAL_GLOBAL_MEM_SIZE, &mem) == ACL_SUCCESS && mem > 0);
    EXPECT("device info: bad device", aclrtGetDeviceInfo(7, ACL_DEV_ATTR_AICORE_CORE_NUM, &cores) == ACL_ERROR_RT_INVALID_DEVICEID);
    const aclCannAttr *attrs = NULL;
    size_t nattrs = 0;
    int32_t v = -1;
    EXPECT("cann attributes", aclGetCannAttributeList(&attrs, &nattrs) == ACL_SUCCESS && nattrs == 3 &&
                              aclGetCannAttribute(attrs[0], &v) == ACL_SUCCESS && (v == 0 || v == 1));
    EXPECT("data type sizes", aclDataTypeSize(ACL_FLOAT) == 4 && aclDataTypeSize(ACL_FLOAT16) == 2 &&
                              aclDataTypeSize(ACL_INT64) == 8 && aclDataTypeSize(ACL_BOOL) == 1 &&
                              aclDataTypeSize(ACL_DT_UNDEFINED) == 0);
    EXPECT("fp16 known values", aclFloatToFloat16(1.0f) == 0x3c00 && aclFloatToFloat16(-2.0f) == 0xc000 &&
                                aclFloatToFloat16(65504.0f) == 0x7bff && aclFloat16ToFloat(0x3555) > 0.333f &&
                                aclFloat16ToFloat(0x3555) < 0.3334f && aclFloat16ToFloat(0x0001) > 5.9e-8f);
    EXPECT("fp16 inf/nan as CANN documents", aclFloat16ToFloat(0x7c00) == 65536.0f &&
                                              aclFloat16ToFloat(0xfc00) == -65536.0f && aclFloat16ToFloat(0x7e00) == 98304.0f);
    int round_trip = 1;
    for (uint32_t h = 0; h < 0x7c00; h++)
        if (aclFloatToFloat16(aclFloat16ToFloat((aclFloat16)h)) != h) round_trip = 0;
    EXPECT("fp16 round trip of every finite half", round_trip);
    int32_t major = 0, minor = 0, patch = -1;
    EXPECT("runtime version", aclrtGetVersion(&major, &minor, &patch) == ACL_SUCCESS && major == ACL_MAJOR_VERSION);
}

static aclrtContext thread_saw;
static void *thread_context(void *arg) {
    /* A thread that set no context uses the process's device: its default context. */
    thread_saw = NULL;
    aclrtGetCurrentContext(&thread_saw);
    MUST(aclrtSetCurrentContext((aclrtContext)arg));
    int32_t d = -1;
    aclrtGetDevice(&d);
    return (void *)(intptr_t)d;
}

static void contexts(void) {
    aclrtContext def0 = NULL, cur = NULL, made = NULL;
    MUST(aclrtSetDevice(0));
    EXPECT("set device makes the default context current", aclrtGetCurrentContext(&def0) == ACL_SUCCESS && def0 != NULL);
    EXPECT("the default context cannot be destroyed", aclrtDestroyContext(def0) == ACL_ERROR_INVALID_PARAM);
    EXPECT("create a context on device 1", aclrtCreateContext(&made, 1) == ACL_SUCCESS && made != NULL);
    int32_t d = -1;
    EXPECT("the created context is current", aclrtGetCurrentContext(&cur) == ACL_SUCCESS && cur == made);
    EXPECT("get device follows the context", aclrtGetDevice(&d) == ACL_SUCCESS && d == 1);
    aclrtStream def_made = NULL, s = NULL;
    EXPECT("its default stream", aclrtCtxGetCurrentDefaultStream(&def_made) == ACL_SUCCESS && def_made != NULL);
    EXPECT("a stream in it", aclrtCreateStream(&s) == ACL_SUCCESS);
    void *p = NULL;
    MUST(aclrtMalloc(&p, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT("work on the context's default stream", aclrtMemsetAsync(p, 4096, 7, 4096, NULL) == ACL_SUCCESS &&
                                                    aclrtSynchronizeStream(NULL) == ACL_SUCCESS);
    pthread_t t;
    void *thread_device = NULL;
    pthread_create(&t, NULL, thread_context, made);
    pthread_join(t, &thread_device);
    EXPECT("another thread can make it current", (intptr_t)thread_device == 1);
    EXPECT("... and saw the process's default context before", thread_saw != NULL && thread_saw != made);
    EXPECT("back to the default context", aclrtSetCurrentContext(def0) == ACL_SUCCESS &&
                                          aclrtGetDevice(&d) == ACL_SUCCESS && d == 0);
    aclrtStream def_0 = NULL;
    EXPECT("each context has its own default stream",
           aclrtCtxGetCurrentDefaultStream(&def_0) == ACL_SUCCESS && def_0 != def_made);
    MUST(aclrtFree(p));
    EXPECT("destroy the created context", aclrtDestroyContext(made) == ACL_SUCCESS);
    EXPECT("its streams went with it", aclrtSynchronizeStream(s) == ACL_ERROR_INVALID_PARAM);
    EXPECT("a destroyed context cannot be made current", aclrtSetCurrentContext(made) == ACL_ERROR_INVALID_PARAM);
    EXPECT("destroying twice fails", aclrtDestroyContext(made) == ACL_ERROR_INVALID_PARAM);
    uint32_t cube = 0;
    EXPECT("thread resource limits", aclrtGetResInCurrentThread(ACL_RT_DEV_RES_CUBE_CORE, &cube) == ACL_SUCCESS && cube > 0);
}

static uint32_t exception_device = 99, exception_code, exception_stream;
static void on_exception(aclrtExceptionInfo *info) {
    exception_device = aclrtGetDeviceIdFromExceptionInfo(info);
    exception_code = aclrtGetErrorCodeFromExceptionInfo(info);
    exception_stream = aclrtGetStreamIdFromExceptionInfo(info);
}

static void streams_and_events(void) {
    aclrtStream s = NULL, v2 = NULL;
    EXPECT("priority out of range", aclrtCreateStreamWithConfig(&s, 8, 0) == ACL_ERROR_INVALID_PARAM);
    EXPECT("unknown stream flag", aclrtCreateStreamWithConfig(&s, 0, 0x80000000U) == ACL_ERROR_INVALID_PARAM);
    EXPECT("create with config", aclrtCreateStreamWithConfig(&s, 2, ACL_STREAM_FAST_SYNC) == ACL_SUCCESS);
    uint32_t prio = 99, flags = 99;
    EXPECT("priority and flags", aclrtStreamGetPriority(s, &prio) == ACL_SUCCESS && prio == 2 &&
                                 aclrtStreamGetFlags(s, &flags) == ACL_SUCCESS && flags == ACL_STREAM_FAST_SYNC);
    aclrtStreamConfigHandle *h = aclrtCreateStreamConfigHandle();
    uint64_t f64 = ACL_STREAM_HUGE;
    uint32_t p32 = 6, p_bad = 9;
    EXPECT("config handle", h != NULL && aclrtSetStreamConfigOpt(h, ACL_RT_STREAM_FLAG, &f64, sizeof(f64)) == ACL_SUCCESS &&
                            aclrtSetStreamConfigOpt(h, ACL_RT_STREAM_PRIORITY, &p32, sizeof(p32)) == ACL_SUCCESS &&
                            aclrtSetStreamConfigOpt(h, ACL_RT_STREAM_PRIORITY, &p_bad, sizeof(p_bad)) == ACL_ERROR_INVALID_PARAM);
    EXPECT("create from config", aclrtCreateStreamV2(&v2, h) == ACL_SUCCESS && aclrtStreamGetPriority(v2, &prio) == ACL_SUCCESS &&
                                 prio == 6 && aclrtStreamGetFlags(v2, &flags) == ACL_SUCCESS && flags == ACL_STREAM_HUGE);
    MUST(aclrtDestroyStreamConfigHandle(h));
    int32_t id1 = -1, id2 = -1, id1b = -1;
    EXPECT("stream ids differ and stay", aclrtStreamGetId(s, &id1) == ACL_SUCCESS && aclrtStreamGetId(v2, &id2) == ACL_SUCCESS &&
                                         aclrtStreamGetId(s, &id1b) == ACL_SUCCESS && id1 != id2 && id1 == id1b);
    EXPECT("failure mode: not on the default stream", aclrtSetStreamFailureMode(NULL, ACL_STOP_ON_FAILURE) == ACL_ERROR_INVALID_PARAM);
    EXPECT("failure mode: unknown mode", aclrtSetStreamFailureMode(s, 5) == ACL_ERROR_INVALID_PARAM);

    /* A device-to-host copy into unmapped host memory fails when the stream runs it. */
    void *dev = NULL;
    unsigned char host[64];
    void *nowhere = (void *)(uintptr_t)0x10000;
    MUST(aclrtMalloc(&dev, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    for (int stop = 0; stop <= 1; stop++) {
        MUST(aclrtSetStreamFailureMode(v2, stop ? ACL_STOP_ON_FAILURE : ACL_CONTINUE_ON_FAILURE));
        MUST(aclrtMemset(dev, 64, 1, 64));
        MUST(aclrtMemcpyAsync(nowhere, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST, v2));
        MUST(aclrtMemsetAsync(dev, 64, 2, 64, v2));
        aclError sync = aclrtSynchronizeStream(v2);
        MUST(aclrtMemcpy(host, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST));
        EXPECT(stop ? "stop on failure drops the work behind the failed task" : "continue on failure runs it",
               sync != ACL_SUCCESS && host[0] == (stop ? 1 : 2));
    }
    MUST(aclrtSynchronizeStream(v2));
    /* The exception callback hears of a failed task when its stream is synchronized. */
    MUST(aclrtSetExceptionInfoCallback(on_exception));
    MUST(aclrtSetStreamFailureMode(v2, ACL_CONTINUE_ON_FAILURE));
    MUST(aclrtMemcpyAsync(nowhere, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST, v2));
    aclError failed_sync = aclrtSynchronizeStream(v2);
    EXPECT("exception callback", failed_sync != ACL_SUCCESS && exception_device == 0 &&
                                 exception_code == (uint32_t)failed_sync && exception_stream == (uint32_t)id2);
    MUST(aclrtSetExceptionInfoCallback(NULL));

    aclrtEvent e = NULL, never = NULL;
    EXPECT("event flag 0 is refused", aclrtCreateEventWithFlag(&e, 0) == ACL_ERROR_INVALID_PARAM);
    EXPECT("event with flags", aclrtCreateEventExWithFlag(&e, ACL_EVENT_TIME_LINE) == ACL_SUCCESS &&
                               aclrtCreateEventWithFlag(&never, ACL_EVENT_SYNC) == ACL_SUCCESS);
    aclrtEventRecordedStatus st = ACL_EVENT_RECORDED_STATUS_NOT_READY;
    aclrtEventStatus old = ACL_EVENT_STATUS_NOT_READY;
    EXPECT("an event never recorded is complete", aclrtQueryEventStatus(never, &st) == ACL_SUCCESS &&
                                                  st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    uint64_t ts = 0;
    EXPECT("no timestamp before a record ran", aclrtEventGetTimestamp(never, &ts) == ACL_ERROR_RT_EVENT_NOT_COMPLETE);
    /* An event recorded behind a wait that has not fired is not ready. */
    MUST(aclrtStreamWaitEvent(s, never));
    MUST(aclrtRecordEvent(never, v2));
    MUST(aclrtRecordEvent(e, s));
    MUST(aclrtSynchronizeEvent(e));
    EXPECT("recorded and run: complete", aclrtQueryEventStatus(e, &st) == ACL_SUCCESS && st == ACL_EVENT_RECORDED_STATUS_COMPLETE &&
                                         aclrtQueryEvent(e, &old) == ACL_SUCCESS && old == ACL_EVENT_STATUS_COMPLETE);
    EXPECT("timestamp of the record", aclrtEventGetTimestamp(e, &ts) == ACL_SUCCESS && ts > 0);
    EXPECT("record/wait flags other than DEFAULT and EXTERNAL are refused",
           aclrtRecordEventWithFlag(e, s, 7) == ACL_ERROR_INVALID_PARAM &&
           aclrtStreamWaitEventWithFlag(s, e, 0, 7) == ACL_ERROR_INVALID_PARAM);
    EXPECT("an EXTERNAL wait takes only timeout 0", aclrtStreamWaitEventWithFlag(s, e, 5, ACL_EVENT_WAIT_EXTERNAL) == ACL_ERROR_INVALID_PARAM);
    MUST(aclrtRecordEventWithFlag(e, v2, ACL_EVENT_RECORD_EXTERNAL));
    MUST(aclrtStreamWaitEventWithFlag(s, e, 0, ACL_EVENT_WAIT_EXTERNAL));
    MUST(aclrtRecordEventWithFlag(e, s, ACL_EVENT_RECORD_DEFAULT));
    MUST(aclrtSynchronizeStream(s));
    EXPECT("a record with a flag completes", aclrtQueryEventStatus(e, &st) == ACL_SUCCESS && st == ACL_EVENT_RECORDED_STATUS_COMPLETE);
    aclrtStreamStatus ss = ACL_STREAM_STATUS_NOT_READY;
    EXPECT("an idle stream is complete", aclrtStreamQuery(s, &ss) == ACL_SUCCESS && ss == ACL_STREAM_STATUS_COMPLETE);
    MUST(aclrtFree(dev));
    MUST(aclrtDestroyEvent(e));
    MUST(aclrtDestroyEvent(never));
    MUST(aclrtDestroyStream(s));
    MUST(aclrtDestroyStream(v2));
}

static int order[16], norder;
static volatile int report_loop = 1;
static void record(void *arg) { order[norder++] = (int)(intptr_t)arg; }
static void *reporter(void *arg) {
    (void)arg;
    while (report_loop) aclrtProcessReport(10);
    return NULL;
}

static void callbacks(void) {
    aclrtStream s = NULL;
    MUST(aclrtCreateStream(&s));
    EXPECT("process report in an unsubscribed thread", aclrtProcessReport(0) == ACL_ERROR_THREAD_NOT_SUBSCRIBE);
    EXPECT("launch callback on an unsubscribed stream", aclrtLaunchCallback(record, NULL, ACL_CALLBACK_BLOCK, s) == ACL_ERROR_RT_STREAM_SUBSCRIBE);
    /* Host functions run in stream order, and the stream waits for each. */
    void *dev = NULL;
    unsigned char b = 0;
    MUST(aclrtMalloc(&dev, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    for (int i = 0; i < 4; i++) MUST(aclrtLaunchHostFunc(s, record, (void *)(intptr_t)i));
    MUST(aclrtMemsetAsync(dev, 64, 9, 64, s));
    MUST(aclrtSynchronizeStream(s));
    MUST(aclrtMemcpy(&b, 1, dev, 1, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("host functions ran in order", norder == 4 && order[0] == 0 && order[3] == 3 && b == 9);
    /* A subscribed thread runs report callbacks. */
    pthread_t t;
    pthread_create(&t, NULL, reporter, NULL);
    EXPECT("subscribe", aclrtSubscribeReport((uint64_t)t, s) == ACL_SUCCESS);
    EXPECT("subscribe twice", aclrtSubscribeReport((uint64_t)t, s) == ACL_ERROR_REPEAT_SUBSCRIBE);
    norder = 0;
    MUST(aclrtLaunchCallback(record, (void *)(intptr_t)10, ACL_CALLBACK_BLOCK, s));
    MUST(aclrtLaunchCallback(record, (void *)(intptr_t)11, ACL_CALLBACK_NO_BLOCK, s));
    MUST(aclrtLaunchCallback(record, (void *)(intptr_t)12, ACL_CALLBACK_BLOCK, s));
    MUST(aclrtSynchronizeStream(s));
    for (int i = 0; i < 200 && norder < 3; i++) usleep(5000);  /* the non-blocking one may trail */
    EXPECT("report callbacks ran in order", norder == 3 && order[0] == 10 && order[1] == 11 && order[2] == 12);
    report_loop = 0;
    pthread_join(t, NULL);
    EXPECT("unsubscribe another thread", aclrtUnSubscribeReport((uint64_t)pthread_self(), s) == ACL_ERROR_STREAM_NOT_SUBSCRIBE);
    EXPECT("unsubscribe", aclrtUnSubscribeReport((uint64_t)t, s) == ACL_SUCCESS);
    MUST(aclrtSubscribeReport((uint64_t)pthread_self(), s));
    EXPECT("process report times out", aclrtProcessReport(10) == ACL_ERROR_WAIT_CALLBACK_TIMEOUT);
    MUST(aclrtUnSubscribeReport((uint64_t)pthread_self(), s));
    MUST(aclrtFree(dev));
    MUST(aclrtDestroyStream(s));

    /* A host function behind a wait that never fires, on a stream then destroyed: the snapshot
     * cannot carry it, so Lock refuses, names it in the thread's recent error, and the process
     * runs on. */
    aclrtStream doomed = NULL;
    aclrtEvent never = NULL;
    MUST(aclrtCreateStream(&doomed));
    MUST(aclrtCreateEvent(&never));
    MUST(aclrtStreamWaitEvent(doomed, never));
    MUST(aclrtLaunchHostFunc(doomed, record, (void *)(intptr_t)99));
    MUST(aclrtDestroyStreamForce(doomed));
    while (aclGetRecentErrMsg() != NULL) {}
    EXPECT("lock refuses an unreachable callback", aclrtSnapShotProcessLock(getpid(), NULL) == ACL_ERROR_SNAPSHOT_LOCK_FAILED);
    const char *why = aclGetRecentErrMsg();
    EXPECT("... and says so", why != NULL && strstr(why, "callbacks") != NULL);
    void *still = NULL;
    EXPECT("the process runs on", aclrtMalloc(&still, 64, ACL_MEM_MALLOC_HUGE_FIRST) == ACL_SUCCESS && aclrtFree(still) == ACL_SUCCESS);
    MUST(aclrtDestroyEvent(never));
}

static void *alloc_fn(aclrtAllocator a, size_t size) { (void)a; return malloc(size); }
static void free_fn(aclrtAllocator a, aclrtAllocatorBlock b) { (void)a; free(b); }
static void *addr_fn(aclrtAllocatorBlock b) { return b; }

static void allocator(void) {
    aclrtStream s = NULL;
    MUST(aclrtCreateStream(&s));
    aclrtAllocatorDesc d = aclrtAllocatorCreateDesc();
    int obj = 0;
    EXPECT("an incomplete descriptor is refused", aclrtAllocatorRegister(s, d) == ACL_ERROR_INVALID_PARAM);
    MUST(aclrtAllocatorSetObjToDesc(d, &obj));
    MUST(aclrtAllocatorSetAllocFuncToDesc(d, alloc_fn));
    MUST(aclrtAllocatorSetFreeFuncToDesc(d, free_fn));
    MUST(aclrtAllocatorSetGetAddrFromBlockFuncToDesc(d, addr_fn));
    EXPECT("register", aclrtAllocatorRegister(s, d) == ACL_SUCCESS);
    MUST(aclrtAllocatorDestroyDesc(d));
    aclrtAllocator got = NULL;
    aclrtAllocatorAllocFunc fa = NULL;
    aclrtAllocatorGetAddrFromBlockFunc fg = NULL;
    EXPECT("get by stream", aclrtAllocatorGetByStream(s, NULL, &got, &fa, NULL, NULL, &fg) == ACL_SUCCESS &&
                            got == &obj && fa == alloc_fn && fg == addr_fn);
    EXPECT("unregister", aclrtAllocatorUnregister(s) == ACL_SUCCESS &&
                         aclrtAllocatorGetByStream(s, NULL, &got, NULL, NULL, NULL, NULL) == ACL_ERROR_INVALID_PARAM);
    MUST(aclrtDestroyStream(s));
}

static void memset_and_peers(void) {
    /* aclrtMemset decides host or device by the address. */
    unsigned char stack[32];
    void *pinned = NULL;
    MUST(aclrtMallocHost(&pinned, 64));
    memset(stack, 0, sizeof(stack));
    EXPECT("memset on host memory", aclrtMemset(stack, sizeof(stack), 0x5a, 16) == ACL_SUCCESS &&
                                    stack[15] == 0x5a && stack[16] == 0);
    EXPECT("memset on pinned host memory", aclrtMemset(pinned, 64, 3, 64) == ACL_SUCCESS && ((unsigned char *)pinned)[63] == 3);
    MUST(aclrtFreeHost(pinned));
    /* The P2P sample's order: both directions enabled, 1->0 disabled, device 1 reset by force,
     * then 0->1 disabled from device 0 (CANN keeps peer access in the driver across a reset). */
    MUST(aclrtSetDevice(0));
    MUST(aclrtDeviceEnablePeerAccess(1, 0));
    MUST(aclrtSetDevice(1));
    MUST(aclrtDeviceEnablePeerAccess(0, 0));
    EXPECT("disable 1->0", aclrtDeviceDisablePeerAccess(0) == ACL_SUCCESS);
    MUST(aclrtResetDeviceForce(1));
    MUST(aclrtSetDevice(0));
    EXPECT("disable 0->1 after device 1's forced reset", aclrtDeviceDisablePeerAccess(1) == ACL_SUCCESS);
    EXPECT("disable 0->1 twice fails", aclrtDeviceDisablePeerAccess(1) == ACL_ERROR_INVALID_PARAM);
}

static void builtin_tasks(void) {
    aclrtStream waiter = NULL, writer = NULL;
    MUST(aclrtCreateStream(&waiter));
    MUST(aclrtCreateStream(&writer));
    uint64_t *flag = NULL, got = 0;
    MUST(aclrtMalloc((void **)&flag, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    MUST(aclrtMemset(flag, 64, 0, 64));
    EXPECT("value wait: unknown mode", aclrtValueWait(flag, 1, 9, waiter) == ACL_ERROR_INVALID_PARAM);
    EXPECT("value write: flag must be 0", aclrtValueWrite(flag, 1, 1, writer) == ACL_ERROR_INVALID_PARAM);
    /* The waiter's copy of the flag runs only after the writer's value arrived. */
    float *vals = NULL;
    MUST(aclrtMalloc((void **)&vals, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    MUST(aclrtMemset(vals, 64, 0, 64));
    MUST(aclrtValueWait(flag, 7, ACL_STREAM_WAIT_VALUE_EQ, waiter));
    MUST(aclrtMemcpyAsync(vals, 8, flag, 8, ACL_MEMCPY_DEVICE_TO_DEVICE, waiter));
    MUST(aclrtValueWrite(flag, 7, 0, writer));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtSynchronizeStream(waiter));
    MUST(aclrtMemcpy(&got, 8, vals, 8, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("value wait waits for the write", got == 7);
    MUST(aclrtValueWait(flag, 4, ACL_STREAM_WAIT_VALUE_GEQ, waiter));
    MUST(aclrtValueWait(flag, 2, ACL_STREAM_WAIT_VALUE_AND, waiter));
    EXPECT("value wait: GEQ and AND met at once", aclrtSynchronizeStream(waiter) == ACL_SUCCESS);

    float a[4] = {1, 2, 3, 4}, b[4] = {4, 3, 2, 1}, out[4];
    MUST(aclrtMemcpy(vals, 16, a, 16, ACL_MEMCPY_HOST_TO_DEVICE));
    MUST(aclrtMemcpy(vals + 4, 16, b, 16, ACL_MEMCPY_HOST_TO_DEVICE));
    EXPECT("reduce: count must be whole elements", aclrtReduceAsync(vals, vals + 4, 6, ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM, ACL_FLOAT, writer, NULL) == ACL_ERROR_INVALID_PARAM);
    MUST(aclrtReduceAsync(vals, vals + 4, 16, ACL_RT_MEMCPY_SDMA_AUTOMATIC_MAX, ACL_FLOAT, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(out, 16, vals, 16, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("reduce max", out[0] == 4 && out[1] == 3 && out[2] == 3 && out[3] == 4);
    MUST(aclrtReduceAsync(vals, vals + 4, 16, ACL_RT_MEMCPY_SDMA_AUTOMATIC_SUM, ACL_FLOAT, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(out, 16, vals, 16, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("reduce sum", out[0] == 8 && out[1] == 6 && out[2] == 5 && out[3] == 5);
    aclFloat16 h[2] = {aclFloatToFloat16(1.5f), aclFloatToFloat16(-2.0f)}, h2[2] = {aclFloatToFloat16(0.25f), aclFloatToFloat16(-3.0f)};
    MUST(aclrtMemcpy(vals, 4, h, 4, ACL_MEMCPY_HOST_TO_DEVICE));
    MUST(aclrtMemcpy(vals + 4, 4, h2, 4, ACL_MEMCPY_HOST_TO_DEVICE));
    MUST(aclrtReduceAsync(vals, vals + 4, 4, ACL_RT_MEMCPY_SDMA_AUTOMATIC_MIN, ACL_FLOAT16, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(h, 4, vals, 4, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("reduce min in fp16", aclFloat16ToFloat(h[0]) == 0.25f && aclFloat16ToFloat(h[1]) == -3.0f);
    /* Random numbers: uniform floats in [min, max); the same seed and counter give the same
     * numbers; the counter advances by the numbers drawn. */
    uint64_t *counter = NULL, count_after = 0;
    MUST(aclrtMalloc((void **)&counter, 16, ACL_MEM_MALLOC_HUGE_FIRST));
    aclrtRandomNumTaskInfo ti;
    memset(&ti, 0, sizeof(ti));
    ti.dataType = ACL_FLOAT;
    ti.randomNumFuncParaInfo.funcType = ACL_RT_RANDOM_NUM_FUNC_TYPE_UNIFORM_DIS;
    float lo = 2.0f, hi = 3.0f;
    memcpy(ti.randomNumFuncParaInfo.paramInfo.uniformDisInfo.min.valueOrAddr, &lo, 4);
    memcpy(ti.randomNumFuncParaInfo.paramInfo.uniformDisInfo.max.valueOrAddr, &hi, 4);
    uint64_t seed = 42, num = 16;
    memcpy(ti.randomSeed.valueOrAddr, &seed, 8);
    memcpy(ti.randomNum.valueOrAddr, &num, 8);
    ti.randomResultAddr = vals;
    ti.randomCounterAddr = counter;
    float r1[16], r2[16];
    int in_range = 1;
    MUST(aclrtMemset(counter, 16, 0, 16));
    MUST(aclrtRandomNumAsync(&ti, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(r1, 64, vals, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    MUST(aclrtMemcpy(&count_after, 8, counter, 8, ACL_MEMCPY_DEVICE_TO_HOST));
    for (int i = 0; i < 16; i++) in_range &= r1[i] >= 2.0f && r1[i] < 3.0f;
    EXPECT("random uniform in range, counter advanced", in_range && count_after == 16 && r1[0] != r1[1]);
    MUST(aclrtMemset(counter, 16, 0, 16));
    MUST(aclrtRandomNumAsync(&ti, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(r2, 64, vals, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("random: same seed and counter, same numbers", memcmp(r1, r2, sizeof(r1)) == 0);
    ti.randomNumFuncParaInfo.funcType = ACL_RT_RANDOM_NUM_FUNC_TYPE_DROPOUT_BITMASK;
    float ratio = 0.0f;
    memcpy(ti.randomNumFuncParaInfo.paramInfo.dropoutBitmaskInfo.dropoutRation.valueOrAddr, &ratio, 4);
    unsigned char mask[2] = {0, 0};
    MUST(aclrtRandomNumAsync(&ti, writer, NULL));
    MUST(aclrtSynchronizeStream(writer));
    MUST(aclrtMemcpy(mask, 2, vals, 2, ACL_MEMCPY_DEVICE_TO_HOST));
    EXPECT("dropout ratio 0 keeps every element", mask[0] == 0xff && mask[1] == 0xff);
    ti.randomNumFuncParaInfo.paramInfo.uniformDisInfo.min.isAddr = 1;
    EXPECT("random: parameters by value only", aclrtRandomNumAsync(&ti, writer, NULL) == ACL_ERROR_FEATURE_UNSUPPORTED);
    MUST(aclrtFree(counter));
    MUST(aclrtFree(flag));
    MUST(aclrtFree(vals));
    MUST(aclrtDestroyStream(waiter));
    MUST(aclrtDestroyStream(writer));
}

static void overflow(void) {
    aclrtFloatOverflowMode mode = ACL_RT_OVERFLOW_MODE_UNDEF;
    EXPECT("saturation mode by default", aclrtGetDeviceSatMode(&mode) == ACL_SUCCESS && mode == ACL_RT_OVERFLOW_MODE_SATURATION);
    EXPECT("set inf/nan mode", aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_INFNAN) == ACL_SUCCESS &&
                               aclrtGetDeviceSatMode(&mode) == ACL_SUCCESS && mode == ACL_RT_OVERFLOW_MODE_INFNAN);
    MUST(aclrtSetDeviceSatMode(ACL_RT_OVERFLOW_MODE_SATURATION));
    aclrtStream s = NULL;
    MUST(aclrtCreateStream(&s));
    uint32_t sw = 9;
    EXPECT("overflow switch", aclrtSetStreamOverflowSwitch(s, 1) == ACL_SUCCESS &&
                              aclrtGetStreamOverflowSwitch(s, &sw) == ACL_SUCCESS && sw == 1);
    void *status = NULL;
    uint64_t host = 0xffffffffffffffffULL;
    MUST(aclrtMalloc(&status, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    MUST(aclrtMemset(status, 64, 0xff, 64));
    EXPECT("overflow status reads 0", aclrtGetOverflowStatus(status, 64, s) == ACL_SUCCESS &&
                                      aclrtSynchronizeStream(s) == ACL_SUCCESS &&
                                      aclrtMemcpy(&host, 8, status, 8, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS && host == 0 &&
                                      aclrtResetOverflowStatus(s) == ACL_SUCCESS);
    MUST(aclrtFree(status));
    MUST(aclrtDestroyStream(s));
}

static void profiling(void) {
    const char *dir = getenv("CANN_API_PROF_DIR");
    if (dir == NULL) dir = "/tmp";
    uint32_t devices[1] = {0};
    EXPECT("prof start needs init", aclprofStart((aclprofConfig *)devices) == ACL_ERROR_UNINITIALIZE);
    EXPECT("prof init", aclprofInit(dir, strlen(dir)) == ACL_SUCCESS);
    aclprofConfig *cfg = aclprofCreateConfig(devices, 1, ACL_AICORE_NONE, NULL, ACL_PROF_ACL_API | ACL_PROF_MSPROFTX);
    EXPECT("prof config", cfg != NULL && aclprofSetConfig(ACL_PROF_SYS_HARDWARE_MEM_FREQ, "50", 2) == ACL_SUCCESS);
    EXPECT("prof start", aclprofStart(cfg) == ACL_SUCCESS && aclprofStart(cfg) == ACL_ERROR_PROF_ALREADY_RUN);
    void *stamp = aclprofCreateStamp();
    uint32_t range = 0;
    EXPECT("msproftx", aclprofSetStampTraceMessage(stamp, "load", 4) == ACL_SUCCESS && aclprofMark(stamp) == ACL_SUCCESS &&
                       aclprofPush(stamp) == ACL_SUCCESS && aclprofRangeStart(stamp, &range) == ACL_SUCCESS &&
                       aclprofRangeStop(range) == ACL_SUCCESS && aclprofPop() == ACL_SUCCESS &&
                       aclprofPop() == ACL_ERROR_INVALID_PARAM && aclprofRangeStop(range) == ACL_ERROR_INVALID_PARAM);
    aclprofStepInfo *step = aclprofCreateStepInfo();
    EXPECT("step timestamps", aclprofGetStepTimestamp(step, ACL_STEP_START, NULL) == ACL_SUCCESS &&
                              aclprofGetStepTimestamp(step, ACL_STEP_END, NULL) == ACL_SUCCESS);
    aclprofDestroyStepInfo(step);
    aclprofDestroyStamp(stamp);
    EXPECT("no models to subscribe", aclprofModelSubscribe(1, (const aclprofSubscribeConfig *)cfg) == ACL_ERROR_INVALID_MODEL_ID);
    EXPECT("prof stop and finalize", aclprofStop(cfg) == ACL_SUCCESS && aclprofStop(cfg) == ACL_ERROR_PROF_NOT_RUN &&
                                     aclprofDestroyConfig(cfg) == ACL_SUCCESS && aclprofFinalize() == ACL_SUCCESS);
    char path[4200];
    struct stat st;
    snprintf(path, sizeof(path), "%s/npusim_prof_%d.jsonl", dir, getpid());
    EXPECT("the profile was written", stat(path, &st) == 0 && st.st_size > 0);
}

static void tdt(void) {
    acltdtChannelHandle *ch = acltdtCreateChannelWithCapacity(0, "cann_api", 2);
    EXPECT("create channel", ch != NULL);
    EXPECT("a second channel of the same name is refused", acltdtCreateChannel(0, "cann_api") == NULL);
    float a[3] = {1, 2, 3};
    int64_t dims[1] = {3};
    acltdtDataItem *item = acltdtCreateDataItem(ACL_TENSOR_DATA_TENSOR, dims, 1, ACL_FLOAT, a, sizeof(a));
    acltdtDataset *set = acltdtCreateDataset();
    MUST(acltdtAddDataItem(set, item));
    size_t n = 9;
    EXPECT("send twice", acltdtSendTensor(ch, set, 100) == ACL_SUCCESS && acltdtSendTensor(ch, set, 0) == ACL_SUCCESS &&
                         acltdtQueryChannelSize(ch, &n) == ACL_SUCCESS && n == 2);
    EXPECT("a full channel refuses", acltdtSendTensor(ch, set, 0) == ACL_ERROR_RT_QUEUE_FULL);
    a[0] = 42;  /* the channel holds copies */
    acltdtDataset *got = acltdtCreateDataset();
    EXPECT("receive", acltdtReceiveTensor(ch, got, 100) == ACL_SUCCESS && acltdtGetDatasetSize(got) == 1);
    acltdtDataItem *gi = acltdtGetDataItem(got, 0);
    int64_t gdims[1] = {0};
    EXPECT("the item came through", acltdtGetDataSizeFromItem(gi) == sizeof(a) && acltdtGetDataTypeFromItem(gi) == ACL_FLOAT &&
                                    acltdtGetDimNumFromItem(gi) == 1 && acltdtGetDimsFromItem(gi, gdims, 1) == ACL_SUCCESS &&
                                    gdims[0] == 3 && ((float *)acltdtGetDataAddrFromItem(gi))[0] == 1.0f);
    EXPECT("clean", acltdtCleanChannel(ch) == ACL_SUCCESS && acltdtQueryChannelSize(ch, &n) == ACL_SUCCESS && n == 0);
    EXPECT("an empty channel times out", acltdtReceiveTensor(ch, got, 10) == ACL_ERROR_RT_QUEUE_EMPTY);
    EXPECT("stop and destroy", acltdtStopChannel(ch) == ACL_SUCCESS && acltdtDestroyChannel(ch) == ACL_SUCCESS);
    MUST(acltdtDestroyDataset(got));
    MUST(acltdtDestroyDataItem(item));
    MUST(acltdtDestroyDataset(set));

    acltdtQueueAttr *attr = acltdtCreateQueueAttr();
    uint32_t depth = 2, qa = 0, qb = 0, got_depth = 0;
    size_t ret = 0;
    EXPECT("queue attr", acltdtSetQueueAttr(attr, ACL_TDT_QUEUE_DEPTH_UINT32, sizeof(depth), &depth) == ACL_SUCCESS &&
                         acltdtGetQueueAttr(attr, ACL_TDT_QUEUE_DEPTH_UINT32, sizeof(got_depth), &ret, &got_depth) == ACL_SUCCESS &&
                         got_depth == 2 && ret == sizeof(uint32_t));
    EXPECT("create queues", acltdtCreateQueue(attr, &qa) == ACL_SUCCESS && acltdtCreateQueue(attr, &qb) == ACL_SUCCESS && qa != qb);
    MUST(acltdtDestroyQueueAttr(attr));
    uint32_t word = 7, back = 0;
    char user[8] = "user", uback[8] = "";
    size_t len = 0;
    EXPECT("enqueue and dequeue", acltdtEnqueueData(qa, &word, 4, user, 5, 100, 0) == ACL_SUCCESS &&
                                  acltdtDequeueData(qa, &back, 4, &len, uback, 5, 100) == ACL_SUCCESS &&
                                  back == 7 && len == 4 && strcmp(uback, "user") == 0);
    EXPECT("an empty queue times out", acltdtDequeueData(qa, &back, 4, &len, NULL, 0, 0) == ACL_ERROR_RT_QUEUE_EMPTY);
    acltdtQueueRoute *r = acltdtCreateQueueRoute(qa, qb);
    acltdtQueueRouteList *list = acltdtCreateQueueRouteList();
    MUST(acltdtAddQueueRoute(list, r));
    EXPECT("bind a route", acltdtBindQueueRoutes(list) == ACL_SUCCESS);
    word = 8;
    EXPECT("a bound route forwards", acltdtEnqueueData(qa, &word, 4, NULL, 0, 100, 0) == ACL_SUCCESS &&
                                     acltdtDequeueData(qb, &back, 4, &len, NULL, 0, 100) == ACL_SUCCESS && back == 8);
    acltdtQueueRouteQueryInfo *q = acltdtCreateQueueRouteQueryInfo();
    acltdtQueueRouteQueryMode mode = ACL_TDT_QUEUE_ROUTE_QUERY_SRC;
    acltdtQueueRouteList *found = acltdtCreateQueueRouteList();
    acltdtQueueRoute *view = acltdtCreateQueueRoute(0, 0);
    int32_t status = -1;
    uint32_t dst = 0;
    EXPECT("query routes", acltdtSetQueueRouteQueryInfo(q, ACL_TDT_QUEUE_ROUTE_QUERY_MODE_ENUM, sizeof(mode), &mode) == ACL_SUCCESS &&
                           acltdtSetQueueRouteQueryInfo(q, ACL_TDT_QUEUE_ROUTE_QUERY_SRC_ID_UINT32, sizeof(qa), &qa) == ACL_SUCCESS &&
                           acltdtQueryQueueRoutes(q, found) == ACL_SUCCESS && acltdtGetQueueRouteNum(found) == 1 &&
                           acltdtGetQueueRoute(found, 0, view) == ACL_SUCCESS &&
                           acltdtGetQueueRouteParam(view, ACL_TDT_QUEUE_ROUTE_DST_UINT32, sizeof(dst), &ret, &dst) == ACL_SUCCESS &&
                           dst == qb &&
                           acltdtGetQueueRouteParam(view, ACL_TDT_QUEUE_ROUTE_STATUS_INT32, sizeof(status), &ret, &status) == ACL_SUCCESS &&
                           status == ACL_TDT_QUEUE_ROUTE_BIND);
    EXPECT("a queue with a bound route is not destroyed", acltdtDestroyQueue(qa) != ACL_SUCCESS);
    EXPECT("unbind and destroy", acltdtUnbindQueueRoutes(list) == ACL_SUCCESS && acltdtDestroyQueue(qa) == ACL_SUCCESS &&
                                 acltdtDestroyQueue(qb) == ACL_SUCCESS && acltdtDestroyQueue(qb) == ACL_ERROR_INVALID_QUEUE_ID);
    acltdtBuf buf = NULL;
    void *data = NULL;
    size_t cap = 0;
    uint32_t chain = 0;
    EXPECT("buffers", acltdtAllocBuf(16, ACL_TDT_NORMAL_MEM, &buf) == ACL_SUCCESS &&
                      acltdtGetBufData(buf, &data, &cap) == ACL_SUCCESS && cap == 16 &&
                      acltdtSetBufDataLen(buf, 8) == ACL_SUCCESS && acltdtGetBufDataLen(buf, &len) == ACL_SUCCESS && len == 8 &&
                      acltdtGetBufChainNum(buf, &chain) == ACL_SUCCESS && chain == 1 && acltdtFreeBuf(buf) == ACL_SUCCESS);
    MUST(acltdtDestroyQueueRoute(r));
    MUST(acltdtDestroyQueueRoute(view));
    MUST(acltdtDestroyQueueRouteList(list));
    MUST(acltdtDestroyQueueRouteList(found));
    MUST(acltdtDestroyQueueRouteQueryInfo(q));
}

static void bounds_checked(void) {
    char buf[8];
    EXPECT("memset_s", memset_s(buf, sizeof(buf), 'x', 4) == EOK && buf[3] == 'x');
    EXPECT("memcpy_s refuses a short destination", memcpy_s(buf, 4, "abcdefgh", 8) != EOK && buf[0] == 0);
    EXPECT("strcpy_s", strcpy_s(buf, sizeof(buf), "abc") == EOK && strcmp(buf, "abc") == 0);
    EXPECT("strcpy_s refuses a long source", strcpy_s(buf, sizeof(buf), "abcdefgh") != EOK && buf[0] == 0);
    EXPECT("snprintf_s", snprintf_s(buf, sizeof(buf), sizeof(buf) - 1, "%d-%d", 1, 2) == 3 && strcmp(buf, "1-2") == 0);
}

int main(void) {
    MUST(aclInit(NULL));
    errors_and_system();
    contexts();
    streams_and_events();
    callbacks();
    allocator();
    builtin_tasks();
    overflow();
    profiling();
    tdt();
    bounds_checked();
    memset_and_peers();
    MUST(aclrtResetDeviceForce(0));
    MUST(aclFinalize());
    printf("checks %d failed %d\n", checks, failed);
    return failed == 0 ? 0 : 1;
}

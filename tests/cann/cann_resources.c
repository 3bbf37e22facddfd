/*
 * A CANN-style program that keeps every resource kind of the CANN runtime surface live while it
 * runs, for the checkpoint test (tests/cann/test_cann_checkpoint.py):
 *
 *     cann_resources STEPS SLEEP_MS
 *
 * contexts: the device's default context (main thread) and a created one (current in the report
 *   thread, owning stream sB);
 * streams: sA with priority 3, ACL_STREAM_FAST_LAUNCH and ACL_STOP_ON_FAILURE; sB made from a
 *   stream config handle with priority 5;
 * events: made with flags (ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC, ACL_EVENT_SYNC), recorded each step;
 * callbacks: a host function on sA and a blocking report callback on sB, run by the thread
 *   subscribed to sB; an external allocator registered on sA;
 * tdt: a channel and a routed pair of queues, each holding the previous step's item while a step
 *   sleeps.
 *
 * Each step queues work and callbacks on both streams, sleeps SLEEP_MS with them queued (where a
 * checkpoint lands), then synchronizes and prints one line of what it saw: handles, settings and
 * digests that depend only on the step, so the output of a restored run equals an uninterrupted
 * one. A failing call prints the call and its aclError and exits 3.
 */
#include <acl/acl.h>
#include <acl/acl_tdt.h>
#include <acl/acl_tdt_queue.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../workloads/step_gate.h"

#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { const char *m_ = aclGetRecentErrMsg(); \
    printf("cann_resources: line %d: %s = %d (%s)\n", __LINE__, #x, rc_, m_ ? m_ : ""); \
    fflush(stdout); exit(3); } } while (0)

enum { N = 4096 };

static aclrtContext ctx_default, ctx_made;
static volatile int report_loop = 1;
static uint64_t host_digest = 1469598103934665603ULL;  /* host functions, in stream order */
static uint64_t report_digest = 1469598103934665603ULL;  /* report callbacks, in stream order */
static int report_in_made_ctx = 1;  /* every report callback saw the created context current */
static int step_arg[1 << 16];

static void mix(uint64_t *h, uint64_t v) { *h = (*h ^ v) * 1099511628211ULL; }

static void host_func(void *arg) { mix(&host_digest, (uint64_t)*(int *)arg); }

static void report_cb(void *arg) {
    aclrtContext c = NULL;
    if (aclrtGetCurrentContext(&c) != ACL_SUCCESS || c != ctx_made) report_in_made_ctx = 0;
    mix(&report_digest, (uint64_t)*(int *)arg * 7 + 1);
}

static void *report_thread(void *arg) {
    (void)arg;
    CHECK(aclrtSetCurrentContext(ctx_made));
    while (report_loop) aclrtProcessReport(20);  /* times out between callbacks: that is fine */
    return NULL;
}

static void *alloc_fn(aclrtAllocator a, size_t size) { (void)a; (void)size; return NULL; }
static void free_fn(aclrtAllocator a, aclrtAllocatorBlock b) { (void)a; (void)b; }
static void *addr_fn(aclrtAllocatorBlock b) { return b; }

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: cann_resources STEPS SLEEP_MS\n"); return 2; }
    int steps = atoi(argv[1]), sleep_ms = atoi(argv[2]);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtGetCurrentContext(&ctx_default));
    CHECK(aclrtCreateContext(&ctx_made, 0));  /* current now; sB is made in it */

    aclrtStreamConfigHandle *cfg = aclrtCreateStreamConfigHandle();
    uint32_t prio_b = 5;
    CHECK(aclrtSetStreamConfigOpt(cfg, ACL_RT_STREAM_PRIORITY, &prio_b, sizeof(prio_b)));
    aclrtStream sB;
    CHECK(aclrtCreateStreamV2(&sB, cfg));
    CHECK(aclrtDestroyStreamConfigHandle(cfg));
    CHECK(aclrtSetCurrentContext(ctx_default));

    aclrtStream sA;
    CHECK(aclrtCreateStreamWithConfig(&sA, 3, ACL_STREAM_FAST_LAUNCH));
    CHECK(aclrtSetStreamFailureMode(sA, ACL_STOP_ON_FAILURE));
    int32_t id_a, id_b;
    CHECK(aclrtStreamGetId(sA, &id_a));
    CHECK(aclrtStreamGetId(sB, &id_b));

    aclrtEvent evA, evB;
    CHECK(aclrtCreateEventExWithFlag(&evA, ACL_EVENT_TIME_LINE | ACL_EVENT_SYNC));
    CHECK(aclrtCreateEventWithFlag(&evB, ACL_EVENT_SYNC));

    aclrtAllocatorDesc desc = aclrtAllocatorCreateDesc();
    static int allocator_obj;
    CHECK(aclrtAllocatorSetObjToDesc(desc, &allocator_obj));
    CHECK(aclrtAllocatorSetAllocFuncToDesc(desc, alloc_fn));
    CHECK(aclrtAllocatorSetFreeFuncToDesc(desc, free_fn));
    CHECK(aclrtAllocatorSetGetAddrFromBlockFuncToDesc(desc, addr_fn));
    CHECK(aclrtAllocatorRegister(sA, desc));
    CHECK(aclrtAllocatorDestroyDesc(desc));

    pthread_t reporter;
    pthread_create(&reporter, NULL, report_thread, NULL);
    CHECK(aclrtSubscribeReport((uint64_t)reporter, sB));

    void *dev;
    CHECK(aclrtMalloc(&dev, N, ACL_MEM_MALLOC_HUGE_FIRST));
    unsigned char *host;
    CHECK(aclrtMallocHost((void **)&host, N));

    acltdtChannelHandle *chan = acltdtCreateChannelWithCapacity(0, "cann_resources", 4);
    if (chan == NULL) CHECK(aclrtGetLastError(ACL_RT_THREAD_LEVEL));
    acltdtQueueAttr *qattr = acltdtCreateQueueAttr();
    uint32_t depth = 4, q_src, q_dst;
    CHECK(acltdtSetQueueAttr(qattr, ACL_TDT_QUEUE_DEPTH_UINT32, sizeof(depth), &depth));
    CHECK(acltdtCreateQueue(qattr, &q_src));
    CHECK(acltdtCreateQueue(qattr, &q_dst));
    CHECK(acltdtDestroyQueueAttr(qattr));
    acltdtQueueRoute *route = acltdtCreateQueueRoute(q_src, q_dst);
    acltdtQueueRouteList *routes = acltdtCreateQueueRouteList();
    CHECK(acltdtAddQueueRoute(routes, route));
    CHECK(acltdtBindQueueRoutes(routes));
    uint64_t tdt_digest = 1469598103934665603ULL;

    printf("ready pid %d\n", getpid());
    fflush(stdout);
    for (int i = 0; i < steps; i++) {
        step_arg[i] = i;
        /* Odd steps: a copy that fails when sA runs it; ACL_STOP_ON_FAILURE drops the memset behind
         * it, so the data shows whether the restored stream kept its failure mode. */
        if (i % 2 == 1) CHECK(aclrtMemcpyAsync((void *)(uintptr_t)0x10000, 64, dev, 64, ACL_MEMCPY_DEVICE_TO_HOST, sA));
        CHECK(aclrtMemsetAsync(dev, N, i & 0xff, N, sA));
        CHECK(aclrtLaunchHostFunc(sA, host_func, &step_arg[i]));
        CHECK(aclrtRecordEvent(evA, sA));
        CHECK(aclrtStreamWaitEvent(sB, evA));
        CHECK(aclrtLaunchCallback(report_cb, &step_arg[i], ACL_CALLBACK_BLOCK, sB));
        CHECK(aclrtMemcpyAsync(host, N, dev, N, ACL_MEMCPY_DEVICE_TO_HOST, sB));
        CHECK(aclrtRecordEvent(evB, sB));
        float sent[2] = {(float)i, (float)(i * 2)};
        int64_t dims[1] = {2};
        acltdtDataItem *item = acltdtCreateDataItem(ACL_TENSOR_DATA_TENSOR, dims, 1, ACL_FLOAT, sent, sizeof(sent));
        acltdtDataset *out_set = acltdtCreateDataset();
        CHECK(acltdtAddDataItem(out_set, item));
        CHECK(acltdtSendTensor(chan, out_set, 1000));  /* copied into the channel */
        CHECK(acltdtDestroyDataItem(item));
        CHECK(acltdtDestroyDataset(out_set));
        uint64_t word = 0x5151000000000000ULL + (uint64_t)i;
        CHECK(acltdtEnqueueData(q_src, &word, sizeof(word), NULL, 0, 1000, 0));  /* routed to q_dst */
        usleep((useconds_t)sleep_ms * 1000);  /* work and callbacks queued: a checkpoint lands here */
        step_gate(i);
        const int failed = aclrtSynchronizeStream(sA) != ACL_SUCCESS;
        CHECK(aclrtSynchronizeEvent(evB));

        aclrtContext cur = NULL;
        CHECK(aclrtGetCurrentContext(&cur));
        aclrtStream def = NULL;
        CHECK(aclrtCtxGetCurrentDefaultStream(&def));
        uint32_t pa, pb, fa, fb;
        int32_t ia, ib;
        CHECK(aclrtStreamGetPriority(sA, &pa));
        CHECK(aclrtStreamGetPriority(sB, &pb));
        CHECK(aclrtStreamGetFlags(sA, &fa));
        CHECK(aclrtStreamGetFlags(sB, &fb));
        CHECK(aclrtStreamGetId(sA, &ia));
        CHECK(aclrtStreamGetId(sB, &ib));
        aclrtEventRecordedStatus st_a, st_b;
        CHECK(aclrtQueryEventStatus(evA, &st_a));
        CHECK(aclrtQueryEventStatus(evB, &st_b));
        aclrtAllocatorDesc got = NULL;
        aclrtAllocator obj = NULL;
        CHECK(aclrtAllocatorGetByStream(sA, &got, &obj, NULL, NULL, NULL, NULL));
        /* The default stream refuses a failure mode: the error shows up as the thread's last error. */
        int refused = aclrtSetStreamFailureMode(NULL, ACL_STOP_ON_FAILURE) == ACL_ERROR_INVALID_PARAM &&
                      aclrtGetLastError(ACL_RT_THREAD_LEVEL) == ACL_ERROR_INVALID_PARAM &&
                      aclGetRecentErrMsg() != NULL;
        int device = -1;
        CHECK(aclrtGetDevice(&device));
        if (i > 0) {  /* the previous step's item waited in the channel and the queue */
            acltdtDataset *in_set = acltdtCreateDataset();
            CHECK(acltdtReceiveTensor(chan, in_set, 1000));
            float *got = (float *)acltdtGetDataAddrFromItem(acltdtGetDataItem(in_set, 0));
            mix(&tdt_digest, (uint64_t)got[0] * 3 + (uint64_t)got[1]);
            CHECK(acltdtDestroyDataset(in_set));
            uint64_t back = 0;
            size_t got_size = 0;
            CHECK(acltdtDequeueData(q_dst, &back, sizeof(back), &got_size, NULL, 0, 1000));
            mix(&tdt_digest, back ^ got_size);
        }
        size_t in_channel = 0;
        CHECK(acltdtQueryChannelSize(chan, &in_channel));
        printf("step %d ctx=%d default_stream=%d prio=%u/%u flags=%u/%u ids=%d events=%d/%d allocator=%d "
               "errors=%d device=%d failed=%d data=%02x host=%016llx report=%016llx in_ctx=%d tdt=%zu/%016llx\n",
               i, cur == ctx_default, def != NULL, pa, pb, fa, fb, ia == id_a && ib == id_b,
               st_a, st_b, obj == &allocator_obj, refused, device, failed, host[N - 1],
               (unsigned long long)host_digest, (unsigned long long)report_digest, report_in_made_ctx,
               in_channel, (unsigned long long)tdt_digest);
        fflush(stdout);
    }
    CHECK(acltdtUnbindQueueRoutes(routes));
    CHECK(acltdtDestroyQueueRouteList(routes));
    CHECK(acltdtDestroyQueueRoute(route));
    CHECK(acltdtDestroyQueue(q_src));
    CHECK(acltdtDestroyQueue(q_dst));
    CHECK(acltdtStopChannel(chan));
    CHECK(acltdtDestroyChannel(chan));
    report_loop = 0;
    pthread_join(reporter, NULL);
    CHECK(aclrtUnSubscribeReport((uint64_t)reporter, sB));
    CHECK(aclrtAllocatorUnregister(sA));
    CHECK(aclrtDestroyEvent(evA));
    CHECK(aclrtDestroyEvent(evB));
    CHECK(aclrtDestroyStream(sA));
    CHECK(aclrtFree(dev));
    CHECK(aclrtFreeHost(host));
    CHECK(aclrtDestroyContext(ctx_made));  /* frees sB with it */
    CHECK(aclrtResetDeviceForce(0));
    CHECK(aclFinalize());
    printf("done host=%016llx report=%016llx\n", (unsigned long long)host_digest, (unsigned long long)report_digest);
    return 0;
}

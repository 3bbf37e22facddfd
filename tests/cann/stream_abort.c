/* Stream stop/abort, stream state callbacks, task ids and the exception info of a failed launch
 * (tests/cann/test_stream_abort.py). Usage: stream_abort KERNELS.so; prints one line per check,
 * then "done". A stream is held by a value wait that is never met, so the work behind it has not
 * started when it is stopped or aborted. */
#include <acl/acl.h>
#include <stdint.h>
#include <string.h>

#include "cann_check.h"

/* aclrtSetExceptionInfoCallback is deprecated in CANN, and what its samples call. */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

static aclrtStream g_seen[8];
static int g_states[8], g_nseen;

static void on_state(aclrtStream stream, aclrtStreamState state, void *args) {
    if (g_nseen < 8 && args == (void *)&g_nseen) {
        g_seen[g_nseen] = stream;
        g_states[g_nseen++] = (int)state;
    }
}

static uint32_t g_task, g_args_len;
static aclError g_args_rc, g_func_rc;
static aclrtFuncHandle g_func;
static char g_args[16];

static void on_exception(aclrtExceptionInfo *info) {
    g_task = aclrtGetTaskIdFromExceptionInfo(info);
    void *args = NULL;
    g_args_rc = aclrtGetArgsFromExceptionInfo(info, &args, &g_args_len);
    if (g_args_rc == ACL_SUCCESS && g_args_len <= sizeof g_args) memcpy(g_args, args, g_args_len);
    g_func_rc = aclrtGetFuncHandleFromExceptionInfo(info, &g_func);
}

/* Queues: a wait on *flag >= 1 (never met), a memset of buf to `value`, a record of `event`. */
static void hold(aclrtStream s, uint64_t *flag, uint8_t *buf, int value, aclrtEvent event) {
    CHECK(aclrtValueWait(flag, 1, ACL_STREAM_WAIT_VALUE_GEQ, s));
    CHECK(aclrtMemsetAsync(buf, 64, value, 64, s));
    CHECK(aclrtRecordEvent(event, s));
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    CHECK(aclInit(NULL));
    CHECK(aclrtRegStreamStateCallback("test", on_state, &g_nseen));
    CHECK(aclrtSetDevice(0));
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    uint64_t *flag;
    uint8_t *buf, host[64];
    CHECK(aclrtMalloc((void **)&flag, 8, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&buf, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(flag, 8, 0, 8));
    CHECK(aclrtMemset(buf, 64, 0, 64));
    aclrtEvent ev;
    CHECK(aclrtCreateEvent(&ev));

    /* Stop: the queued work is dropped, the synchronize reports nothing, the event completes. */
    hold(s, flag, buf, 0x11, ev);
    CHECK(aclrtStreamStop(s));
    aclError stop_sync = aclrtSynchronizeStream(s);
    CHECK(aclrtMemcpy(host, 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("stop sync %d memset %02x event %d\n", stop_sync, host[0], aclrtSynchronizeEventWithTimeout(ev, 10000));

    /* Abort: the same, and the next synchronize reports ACL_ERROR_RT_STREAM_ABORT; the stream runs on. */
    hold(s, flag, buf, 0x22, ev);
    CHECK(aclrtStreamAbort(s));
    aclError abort_sync = aclrtSynchronizeStream(s);
    CHECK(aclrtMemsetAsync(buf, 64, 0x33, 64, s));
    aclError after_sync = aclrtSynchronizeStream(s);
    CHECK(aclrtMemcpy(host, 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("abort sync %d then %d memset %02x\n", abort_sync, after_sync, host[0]);
    printf("null stream %d %d\n", aclrtStreamStop(NULL), aclrtStreamAbort(NULL));

    /* Task ids: each task's place on its stream; this thread's last. */
    uint32_t t1 = 0, t2 = 0;
    CHECK(aclrtMemsetAsync(buf, 64, 1, 64, s));
    CHECK(aclrtGetThreadLastTaskId(&t1));
    CHECK(aclrtMemsetAsync(buf, 64, 2, 64, s));
    CHECK(aclrtGetThreadLastTaskId(&t2));
    CHECK(aclrtSynchronizeStream(s));
    printf("task ids next %d null %d\n", t2 == t1 + 1, aclrtGetThreadLastTaskId(NULL));

    /* A failed launch: the exception info names its task id, function handle and arguments. */
    aclrtBinHandle bin;
    aclrtFuncHandle crash;
    CHECK(aclrtBinaryLoadFromFile(argv[1], NULL, &bin));
    CHECK(aclrtBinaryGetFunction(bin, "crash", &crash));
    CHECK(aclrtSetExceptionInfoCallback(on_exception));
    char args[8] = {'n', 'p', 'u', 's', 'i', 'm', '!', 0};
    uint32_t crash_task = 0;
    CHECK(aclrtLaunchKernel(crash, 1, args, sizeof args, s));
    CHECK(aclrtGetThreadLastTaskId(&crash_task));
    aclError crash_sync = aclrtSynchronizeStream(s);
    printf("crash sync %d task %d func %d %d args %d %u %s\n", crash_sync, g_task == crash_task, g_func_rc,
           g_func == crash, g_args_rc, g_args_len, g_args);
    void *p = NULL;
    uint32_t n = 0;
    printf("null info %d %d\n", aclrtGetArgsFromExceptionInfo(NULL, &p, &n), aclrtGetFuncHandleFromExceptionInfo(NULL, &crash));
    CHECK(aclrtSetExceptionInfoCallback(NULL));

    /* State callbacks: after each creation, before each destruction; none once unregistered. */
    aclrtStream t;
    CHECK(aclrtCreateStream(&t));
    CHECK(aclrtDestroyStream(t));
    CHECK(aclrtRegStreamStateCallback("test", NULL, NULL));
    CHECK(aclrtCreateStream(&t));
    CHECK(aclrtDestroyStream(t));
    printf("states %d: %d %d %d %d %d\n", g_nseen, g_seen[0] == s && g_states[0] == ACL_RT_STREAM_STATE_CREATE_POST,
           g_states[1] == ACL_RT_STREAM_STATE_CREATE_POST, g_states[2] == ACL_RT_STREAM_STATE_DESTROY_PRE,
           g_seen[1] == g_seen[2], aclrtRegStreamStateCallback(NULL, on_state, NULL));

    CHECK(aclrtDestroyEvent(ev));
    (void)aclrtBinaryUnLoad(bin); /* the crash ended the session's kernel runner: later kernel calls fail */
    CHECK(aclrtFree(flag));
    CHECK(aclrtFree(buf));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

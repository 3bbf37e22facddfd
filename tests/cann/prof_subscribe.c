/* Model subscriptions (tests/cann/test_prof_subscribe.py): a model run instance captured from a
 * memset and a copy is subscribed to through a pipe, run RUNS times, unsubscribed; a reader thread
 * parses the op records with the aclprofGetOp* calls and prints what it read. Error codes of the
 * subscription calls are printed first.
 *
 * Usage: prof_subscribe RUNS. Prints "errors ...", "op MODEL TYPE NAME ORDERED" per op, "ops N", "done". */
#include <acl/acl.h>
#include <acl/acl_prof.h>
#include <profiling/aprof_pub.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cann_check.h"

static int ops;

static void *reader(void *arg) {
    int fd = *(int *)arg;
    size_t size = 0;
    aclprofGetOpDescSize(&size);
    char *buf = malloc(size * 4);
    ssize_t n;
    while ((n = read(fd, buf, size * 4)) > 0) {
        uint32_t count = 0;
        CHECK(aclprofGetOpNum(buf, (size_t)n, &count));
        for (uint32_t i = 0; i < count; i++) {
            size_t tl = 0, nl = 0;
            CHECK(aclprofGetOpTypeLen(buf, (size_t)n, i, &tl));
            CHECK(aclprofGetOpNameLen(buf, (size_t)n, i, &nl));
            char type[64], name[192];
            CHECK(aclprofGetOpType(buf, (size_t)n, i, type, tl));
            CHECK(aclprofGetOpName(buf, (size_t)n, i, name, nl));
            uint64_t start = aclprofGetOpStart(buf, (size_t)n, i), end = aclprofGetOpEnd(buf, (size_t)n, i);
            int ordered = start > 0 && start <= end && aclprofGetOpDuration(buf, (size_t)n, i) == end - start;
            printf("op %zu %s %s %d flag %d\n", aclprofGetModelId(buf, (size_t)n, i), type, name, ordered,
                   (int)aclprofGetOpFlag(buf, (size_t)n, i));
            ops++;
        }
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 2;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    char *a, *b;
    CHECK(aclrtMalloc((void **)&a, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&b, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    aclmdlRI model;
    CHECK(aclmdlRICaptureBegin(s, ACL_MODEL_RI_CAPTURE_MODE_GLOBAL));
    CHECK(aclrtMemsetAsync(a, 4096, 7, 4096, s));
    CHECK(aclrtMemcpyAsync(b, 4096, a, 4096, ACL_MEMCPY_DEVICE_TO_DEVICE, s));
    CHECK(aclmdlRICaptureEnd(s, &model));
    uint32_t id = 0;
    CHECK(aclmdlRIGetId(model, &id));

    int fds[2];
    if (pipe(fds) != 0) return 1;
    aclprofSubscribeConfig *config = aclprofCreateSubscribeConfig(1, ACL_AICORE_NONE, &fds[1]);
    if (config == NULL) return 1;
    aclError unknown = aclprofModelSubscribe(id + 1000, config), unsub = aclprofModelUnSubscribe(id);
    int32_t registered = MsprofSetDeviceIdByGeModelIdx(id + 1000, 0);
    printf("errors unknown %d unsub %d register %d\n", unknown, unsub, registered);
    CHECK(aclprofModelSubscribe(id, config));
    printf("errors repeat %d\n", aclprofModelSubscribe(id, config));
    int other[2];  /* unsubscribing closes the write end: a pipe of its own */
    if (pipe(other) != 0) return 1;
    aclprofSubscribeConfig *config2 = aclprofCreateSubscribeConfig(0, ACL_AICORE_NONE, &other[1]);
    CHECK(aclprofModelSubscribe(id + 1000, config2));
    CHECK(aclprofModelUnSubscribe(id + 1000));  /* registered id: subscribed and unsubscribed */
    char byte;
    printf("closed %d\n", (int)read(other[0], &byte, 1));  /* 0: the end of the data */
    close(other[0]);
    CHECK(aclprofDestroySubscribeConfig(config2));
    pthread_t t;
    pthread_create(&t, NULL, reader, &fds[0]);
    for (int i = 0; i < runs; i++) CHECK(aclmdlRIExecuteAsync(model, s));
    CHECK(aclrtSynchronizeStream(s));
    CHECK(aclprofModelUnSubscribe(id));  /* closes the write end: the reader sees the end */
    pthread_join(t, NULL);
    close(fds[0]);
    CHECK(aclprofDestroySubscribeConfig(config));
    char host[8];
    CHECK(aclrtMemcpy(host, 8, b, 8, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("ops %d data %d\n", ops, host[7]);
    CHECK(aclmdlRIDestroy(model));
    CHECK(aclrtFree(a));
    CHECK(aclrtFree(b));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

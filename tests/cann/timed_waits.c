/* Timed waits (tests/cann/test_timed_waits.py): a stream held by a value wait that is not met
 * makes every timed synchronize give up with CANN's timeout code, and succeed once the value is
 * written; a stream's timed wait for an event that is never recorded fails the stream, reported
 * by its next synchronize, and the stream runs on. Prints one "name code..." line per check, "done". */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cann_check.h"

int main(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream held, other;
    CHECK(aclrtCreateStream(&held));
    CHECK(aclrtCreateStream(&other));
    uint64_t *flag;
    uint8_t *buf;
    CHECK(aclrtMalloc((void **)&flag, 8, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&buf, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(flag, 8, 0, 8));
    aclrtEvent after, never;
    CHECK(aclrtCreateEvent(&after));
    CHECK(aclrtCreateEvent(&never));

    /* held: wait for *flag >= 1, then memset, then record "after". */
    CHECK(aclrtValueWait(flag, 1, ACL_STREAM_WAIT_VALUE_GEQ, held));
    CHECK(aclrtMemsetAsync(buf, 64, 0x5A, 64, held));
    CHECK(aclrtRecordEvent(after, held));
    printf("busy stream %d %d event %d device %d\n", aclrtSynchronizeStreamWithTimeout(held, 20),
           aclrtSynchronizeStreamWithTimeout(held, 0), aclrtSynchronizeEventWithTimeout(after, 20),
           aclrtSynchronizeDeviceWithTimeout(20));
    printf("bad timeout %d %d %d %d\n", aclrtSynchronizeStreamWithTimeout(held, -2),
           aclrtSynchronizeEventWithTimeout(after, -2), aclrtSynchronizeDeviceWithTimeout(-2),
           aclrtStreamWaitEventWithTimeout(other, after, -1));
    CHECK(aclrtValueWrite(flag, 1, 0, other));  /* lets held go on */
    printf("released stream %d event %d device %d\n", aclrtSynchronizeStreamWithTimeout(held, 10000),
           aclrtSynchronizeEventWithTimeout(after, 10000), aclrtSynchronizeDeviceWithTimeout(10000));
    uint8_t host[64];
    CHECK(aclrtMemcpy(host, 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("memset ran %02x\n", host[63]);

    /* other: a timed wait for an event recorded never fails the stream; the memset after it runs. */
    CHECK(aclrtStreamWaitEventWithTimeout(other, never, 20));
    CHECK(aclrtMemsetAsync(buf, 64, 0x77, 64, other));
    aclError first = aclrtSynchronizeStream(other), second = aclrtSynchronizeStream(other);
    CHECK(aclrtMemcpy(host, 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST));
    printf("timed wait %d then %d memset %02x\n", first, second, host[0]);
    /* A recorded event: the timed wait is met. */
    CHECK(aclrtStreamWaitEventWithTimeout(other, after, 10000));
    CHECK(aclrtStreamWaitEventWithFlag(other, after, 10000, ACL_EVENT_WAIT_DEFAULT));
    printf("met wait %d\n", aclrtSynchronizeStream(other));

    CHECK(aclrtDestroyEvent(after));
    CHECK(aclrtDestroyEvent(never));
    CHECK(aclrtFree(flag));
    CHECK(aclrtFree(buf));
    CHECK(aclrtDestroyStream(held));
    CHECK(aclrtDestroyStream(other));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

/* Labels in a model run instance, and across a checkpoint (tests/cann/test_labels.py).
 *
 * A model is built on a persistent stream bound to it:
 *   switch(index -> L0, L1, L2); L0: memset(out, 0xA0); switch(zero -> END);
 *   L1: memset(out, 0xB1); switch(zero -> END); L2: memset(out, 0xC2); END: memset(out + 64, step)
 * Each step writes its index (step % 4: 3 is past the end and picks L2), runs the model on another
 * stream, and prints what the model wrote. The labels and lists are destroyed halfway (the model
 * keeps running, as CANN's does). Before the model, the error paths print their codes.
 *
 * Usage: label_steps STEPS SLEEP_MS. Prints "errors ...", "ready pid N", "step I ..." lines, "done". */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cann_check.h"

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 8, pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream build, exec;
    CHECK(aclrtCreateStreamWithConfig(&build, 0, ACL_STREAM_PERSISTENT));
    CHECK(aclrtCreateStream(&exec));
    uint32_t *index, *zero;
    uint8_t *out;
    CHECK(aclrtMalloc((void **)&index, 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&zero, 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&out, 128, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(zero, 4, 0, 4));

    aclrtLabel l[4];  /* L0, L1, L2, END */
    for (int i = 0; i < 4; i++) CHECK(aclrtCreateLabel(&l[i]));
    aclrtLabelList branches, to_end;
    CHECK(aclrtCreateLabelList(l, 3, &branches));
    CHECK(aclrtCreateLabelList(&l[3], 1, &to_end));

    /* Outside a model, a label or a switch is refused; so are bad arguments. */
    printf("errors set %d switch %d null %d max %d\n", aclrtSetLabel(l[0], exec),
           aclrtSwitchLabelByIndex(index, 3, branches, exec), aclrtCreateLabel(NULL),
           aclrtSwitchLabelByIndex(index, 4, branches, build));

    aclmdlRI model;
    CHECK(aclmdlRIBuildBegin(&model, 0));
    CHECK(aclmdlRIBindStream(model, build, ACL_MODEL_STREAM_FLAG_HEAD));
    CHECK(aclrtSwitchLabelByIndex(index, 3, branches, build));
    const uint8_t value[3] = {0xA0, 0xB1, 0xC2};
    for (int b = 0; b < 3; b++) {
        CHECK(aclrtSetLabel(l[b], build));
        CHECK(aclrtMemsetAsync(out, 64, value[b], 64, build));
        if (b < 2) CHECK(aclrtSwitchLabelByIndex(zero, 1, to_end, build));
    }
    CHECK(aclrtSetLabel(l[3], build));
    printf("errors again %d\n", aclrtSetLabel(l[3], build));  /* a label marks one position */
    CHECK(aclrtMemcpyAsync(out + 64, 64, out, 64, ACL_MEMCPY_DEVICE_TO_DEVICE, build));
    CHECK(aclmdlRIEndTask(model, build));
    CHECK(aclmdlRIBuildEnd(model, NULL));
    CHECK(aclmdlRIUnbindStream(model, build));

    printf("ready pid %d\n", (int)getpid());
    fflush(stdout);
    uint8_t host[128];
    for (int step = 0; step < steps; step++) {
        uint32_t i = (uint32_t)(step % 4);
        CHECK(aclrtMemset(out, 128, step, 128));
        CHECK(aclrtMemcpy(index, 4, &i, 4, ACL_MEMCPY_HOST_TO_DEVICE));
        CHECK(aclmdlRIExecuteAsync(model, exec));
        CHECK(aclrtSynchronizeStream(exec));
        CHECK(aclrtMemcpy(host, 128, out, 128, ACL_MEMCPY_DEVICE_TO_HOST));
        printf("step %d index %u out %02x %02x %02x\n", step, i, host[0], host[63], host[127]);
        fflush(stdout);
        if (step == steps / 2) {  /* the model keeps what it needs of them */
            for (int k = 0; k < 4; k++) CHECK(aclrtDestroyLabel(l[k]));
            CHECK(aclrtDestroyLabelList(branches));
            CHECK(aclrtDestroyLabelList(to_end));
        }
        sleep_ms(pause_ms);
        step_gate(step);
    }
    CHECK(aclmdlRIDestroy(model));
    CHECK(aclrtFree(index));
    CHECK(aclrtFree(zero));
    CHECK(aclrtFree(out));
    CHECK(aclrtDestroyStream(build));
    CHECK(aclrtDestroyStream(exec));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

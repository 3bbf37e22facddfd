/* Stream activation in a model run instance (tests/cann/test_stream_switch.py): the head stream
 * runs; aclrtSwitchStream activates a stream when its condition on device values holds, and an
 * activated stream may activate another. Prints "errors ...", one "run ..." line per value, "done". */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cann_check.h"

int main(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtStream s1, s2, s3, s4, exec;
    aclrtStream *all[] = {&s1, &s2, &s3, &s4};
    for (int i = 0; i < 4; i++) CHECK(aclrtCreateStreamWithConfig(all[i], 0, ACL_STREAM_PERSISTENT));
    CHECK(aclrtCreateStream(&exec));
    int32_t *num, *right, five = 5;
    uint8_t *out;
    CHECK(aclrtMalloc((void **)&num, 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&right, 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc((void **)&out, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(right, 4, &five, 4, ACL_MEMCPY_HOST_TO_DEVICE));
    printf("errors unbound %d cond %d\n", aclrtActiveStream(s2, s1),
           aclrtSwitchStream(num, (aclrtCondition)9, right, ACL_RT_SWITCH_INT32, s3, NULL, s1));

    aclmdlRI model;
    CHECK(aclmdlRIBuildBegin(&model, 0));
    CHECK(aclmdlRIBindStream(model, s1, ACL_MODEL_STREAM_FLAG_HEAD));
    for (int i = 1; i < 4; i++) CHECK(aclmdlRIBindStream(model, *all[i], ACL_MODEL_STREAM_FLAG_DEFAULT));
    CHECK(aclrtMemsetAsync(out, 16, 0x11, 16, s1));
    CHECK(aclrtSwitchStream(num, ACL_RT_GREATER, right, ACL_RT_SWITCH_INT32, s3, NULL, s1));
    CHECK(aclrtSwitchStream(num, ACL_RT_LESS_OR_EQUAL, right, ACL_RT_SWITCH_INT32, s4, NULL, s1));
    CHECK(aclrtMemsetAsync(out + 16, 16, 0x33, 16, s3));
    CHECK(aclrtMemsetAsync(out + 32, 16, 0x44, 16, s4));
    CHECK(aclrtActiveStream(s2, s4));
    CHECK(aclrtMemsetAsync(out + 48, 16, 0x22, 16, s2));
    CHECK(aclmdlRIEndTask(model, s1));
    CHECK(aclmdlRIBuildEnd(model, NULL));

    const int32_t values[] = {7, 3, 5, 6};
    for (int k = 0; k < 4; k++) {
        uint8_t host[64];
        CHECK(aclrtMemset(out, 64, 0, 64));
        CHECK(aclrtMemcpy(num, 4, &values[k], 4, ACL_MEMCPY_HOST_TO_DEVICE));
        CHECK(aclmdlRIExecuteAsync(model, exec));
        CHECK(aclrtSynchronizeStream(exec));
        CHECK(aclrtMemcpy(host, 64, out, 64, ACL_MEMCPY_DEVICE_TO_HOST));
        printf("run %d: %02x %02x %02x %02x\n", values[k], host[0], host[16], host[32], host[48]);
    }
    for (int i = 0; i < 4; i++) CHECK(aclmdlRIUnbindStream(model, *all[i]));
    CHECK(aclmdlRIDestroy(model));
    CHECK(aclrtFree(num));
    CHECK(aclrtFree(right));
    CHECK(aclrtFree(out));
    for (int i = 0; i < 4; i++) CHECK(aclrtDestroyStream(*all[i]));
    CHECK(aclrtDestroyStream(exec));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("done\n");
    return 0;
}

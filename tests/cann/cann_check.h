/* What the sample-style programs of tests/cann share: CHECK(call) prints the failing call and its
 * code on stdout and exits 1; sleep_ms paces the programs a test checkpoints mid-run, step_gate
 * holds them at a step until the test has checkpointed. */
#ifndef TESTS_CANN_CHECK_H_
#define TESTS_CANN_CHECK_H_

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../workloads/step_gate.h"

#define CHECK(x)                                                                   \
    do {                                                                           \
        aclError rc_ = (x);                                                        \
        if (rc_ != ACL_SUCCESS) {                                                  \
            printf("ERR %s:%d %s = %d\n", __FILE__, __LINE__, #x, rc_);            \
            fflush(stdout);                                                        \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#endif /* TESTS_CANN_CHECK_H_ */

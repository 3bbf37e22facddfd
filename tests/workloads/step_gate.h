/* STEP_GATE=N:PATH holds a steps program after it printed step N until PATH exists (at most 120 s;
 * tests/helpers.py StepGate): a test that checkpoints it mid-run finds it still running however
 * slow the machine, and the output is the same as without the gate. */
#ifndef TESTS_WORKLOADS_STEP_GATE_H_
#define TESTS_WORKLOADS_STEP_GATE_H_

#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static inline void step_gate(int step) {
    const char *gate = getenv("STEP_GATE");
    char *path = NULL;
    if (!gate || strtol(gate, &path, 10) != step || *path != ':') return;
    const struct timespec tick = {0, 20 * 1000000L};
    for (int i = 0; i < 6000 && access(path + 1, F_OK) != 0; i++) nanosleep(&tick, NULL);
}

#endif /* TESTS_WORKLOADS_STEP_GATE_H_ */

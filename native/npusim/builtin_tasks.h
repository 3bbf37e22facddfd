// The runtime's built-in device tasks (builtin_tasks.cpp): writing and waiting for a 64-bit value
// in device memory (aclrtValueWrite / aclrtValueWait), elementwise reductions (aclrtReduceAsync)
// and random numbers (aclrtRandomNumAsync). Daemon side.
#pragma once

#include "device_state.h"

namespace npusim::builtin {

// Whether a Reduce task names a kind and an element type npusim reduces, with a whole number of
// elements.
bool reduce_ok(const proto::Task &t);
// The bytes a RandomNum task writes (0: a type or function npusim does not generate), and the
// size of its counter (a 64-bit count of numbers drawn so far, then reserved bytes).
uint64_t random_bytes(const proto::Task &t);
constexpr uint64_t kRandomCounterBytes = 16;
// Runs a ValueWrite, Reduce or RandomNum task.
int32_t run(Work &w);
// Whether a ValueWait task's condition holds now.
bool value_met(const Work &w);
// fp16 and bf16 <-> float, round to nearest even.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);

}  // namespace npusim::builtin

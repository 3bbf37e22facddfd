// The runtime's built-in device tasks (builtin_tasks.cpp): writing and waiting for a 64-bit value
// in device memory (aclrtValueWrite / aclrtValueWait) and elementwise reductions
// (aclrtReduceAsync). Daemon side.
#pragma once

#include "device_state.h"

namespace npusim::builtin {

// Whether a Reduce task names a kind and an element type npusim reduces, with a whole number of
// elements.
bool reduce_ok(const proto::Task &t);
// Runs a ValueWrite or Reduce task.
int32_t run(Work &w);
// Whether a ValueWait task's condition holds now.
bool value_met(const Work &w);

}  // namespace npusim::builtin

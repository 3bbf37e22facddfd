// Model run instances (model_ri.cpp): while a stream captures, the work queued on it is recorded
// into the model instead of being sent to the device.
#pragma once

#include <string>

#include "runtime.h"

namespace npusim::rt {

// If stream is capturing: records task (with its trailing bytes, for a kernel), sets *rc and
// returns true. Otherwise returns false and the caller sends the task.
bool capture_task(const proto::Task &task, const std::string &body, StreamObj *stream, int32_t *rc);
// Whether work queued on stream is being recorded into a model now.
bool capturing(StreamObj *stream);

}  // namespace npusim::rt

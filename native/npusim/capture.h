// Model run instances (model_ri.cpp): while a stream captures, the work queued on it is recorded
// into the model instead of being sent to the device.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime.h"

namespace npusim::rt {

// If stream is capturing: records task (with its trailing bytes, for a kernel), sets *rc and
// returns true. Otherwise returns false and the caller sends the task.
bool capture_task(const proto::Task &task, const std::string &body, StreamObj *stream, int32_t *rc);
// Whether work queued on stream is being recorded into a model now.
bool capturing(StreamObj *stream);

// A control-flow task of a model (labels.cpp): replay asks it where to go on.
struct ControlTask {
  virtual ~ControlTask() = default;
  // The label this task places in the model (0: none): replay can jump to its position.
  virtual uint64_t label() const { return 0; }
  // Runs when replay reaches it on s; sets *jump to the label to go on at (0: the next task) and
  // *activate to a stream of the model whose tasks run now (null: none).
  virtual int32_t run(StreamObj *s, uint64_t *jump, StreamObj **activate) const = 0;
  // Whether it activates streams: a model with such tasks runs only its head stream's tasks and
  // the streams they activate (stream_switch.cpp); without, every bound stream's, in record order.
  virtual bool activates() const { return false; }
};
// Records control into the model stream captures for: ACL_ERROR_RT_STREAM_MODEL when stream is
// not capturing, ACL_ERROR_RT_FEATURE_NOT_SUPPORT in a conditional branch (CANN's sub-graphs).
int32_t capture_control(std::shared_ptr<const ControlTask> control, StreamObj *stream);
// Whether a model run instance has this id (aclmdlRIGetId).
bool model_ri_exists(uint32_t id);
// prof_subscribe.cpp: whether aclprofModelSubscribe watches model_id, and queues, around what
// queue() queues on s, the stream's stamps of one op record of that model (type, name).
bool model_subscribed(uint32_t model_id);
int32_t profile_op(uint32_t model_id, StreamObj *s, const char *type, const std::string &name,
                   const std::function<int32_t()> &queue);
// Reads n bytes of device memory once the work queued on s before now has run (s synchronized).
int32_t read_at_stream(const void *dev, void *host, size_t n, StreamObj *s);

}  // namespace npusim::rt

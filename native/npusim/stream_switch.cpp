// Stream activation in a model run instance (aclrtActiveStream, aclrtSwitchStream). In a model
// with such tasks, as in CANN, only the head stream (bound with ACL_MODEL_STREAM_FLAG_HEAD, else
// the first recorded on) runs when the model executes; a stream of the model runs its recorded
// tasks when an activation task reaches it. npusim runs an activated stream's tasks in line, in
// its own order, on the stream the model executes on. aclrtSwitchStream compares two values in
// device memory when the stream reaches it (the client reads them, as for a model's conditions)
// and activates trueStream if the condition holds. Like labels, these tasks are part of the model
// (kind "model run instances").
#include <cstring>
#include <memory>
#include <string>

#include "capture.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct Activate : ControlTask {
  StreamObj *target;
  explicit Activate(StreamObj *t) : target(t) {}
  bool activates() const override { return true; }
  int32_t run(StreamObj *, uint64_t *jump, StreamObj **activate) const override {
    *jump = 0;
    *activate = target;
    return ACL_SUCCESS;
  }
};

struct Switch : ControlTask {
  const void *left, *right;
  aclrtCondition cond;
  aclrtCompareDataType type;
  StreamObj *target;
  bool activates() const override { return true; }
  int32_t run(StreamObj *s, uint64_t *jump, StreamObj **activate) const override {
    *jump = 0;
    const size_t n = type == ACL_RT_SWITCH_INT32 ? sizeof(int32_t) : sizeof(int64_t);
    int64_t a = 0, b = 0;
    char raw[2][sizeof(int64_t)] = {};
    if (int32_t rc = read_at_stream(left, raw[0], n, s); rc != ACL_SUCCESS) return rc;
    if (int32_t rc = read_at_stream(right, raw[1], n, s); rc != ACL_SUCCESS) return rc;
    if (type == ACL_RT_SWITCH_INT32) {
      int32_t x, y;
      std::memcpy(&x, raw[0], sizeof(x));
      std::memcpy(&y, raw[1], sizeof(y));
      a = x, b = y;
    } else {
      std::memcpy(&a, raw[0], sizeof(a));
      std::memcpy(&b, raw[1], sizeof(b));
    }
    bool holds = false;
    switch (cond) {
      case ACL_RT_EQUAL: holds = a == b; break;
      case ACL_RT_NOT_EQUAL: holds = a != b; break;
      case ACL_RT_GREATER: holds = a > b; break;
      case ACL_RT_GREATER_OR_EQUAL: holds = a >= b; break;
      case ACL_RT_LESS: holds = a < b; break;
      case ACL_RT_LESS_OR_EQUAL: holds = a <= b; break;
    }
    *activate = holds ? target : nullptr;
    return ACL_SUCCESS;
  }
};

// Both streams bound to a model being built (the target to the same model: it records too).
int32_t model_streams(aclrtStream target, aclrtStream stream, StreamObj **t, StreamObj **s, const char *api) {
  if (target == nullptr || stream == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": a stream is NULL");
  if (int32_t rc = resolve_stream(target, t); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, s); rc != ACL_SUCCESS) return rc;
  if (!capturing(*t)) return note_error(ACL_ERROR_RT_STREAM_MODEL, std::string(api) + ": the stream to activate is not bound to a model being built");
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclrtActiveStream(aclrtStream activeStream, aclrtStream stream) {
  StreamObj *t = nullptr, *s = nullptr;
  if (int32_t rc = model_streams(activeStream, stream, &t, &s, "aclrtActiveStream"); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = capture_control(std::make_shared<Activate>(t), s); rc != ACL_SUCCESS)
    return note_error(rc, "aclrtActiveStream: the stream is not bound to a model being built");
  return ACL_SUCCESS;
}

aclError aclrtSwitchStream(void *leftValue, aclrtCondition cond, void *rightValue, aclrtCompareDataType dataType,
                           aclrtStream trueStream, aclrtStream falseStream, aclrtStream stream) {
  (void)falseStream;  // reserved (CANN)
  if (leftValue == nullptr || rightValue == nullptr || cond < ACL_RT_EQUAL || cond > ACL_RT_LESS_OR_EQUAL ||
      (dataType != ACL_RT_SWITCH_INT32 && dataType != ACL_RT_SWITCH_INT64))
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSwitchStream: a value is NULL, or cond / dataType is unknown");
  StreamObj *t = nullptr, *s = nullptr;
  if (int32_t rc = model_streams(trueStream, stream, &t, &s, "aclrtSwitchStream"); rc != ACL_SUCCESS) return rc;
  auto sw = std::make_shared<Switch>();
  sw->left = leftValue;
  sw->right = rightValue;
  sw->cond = cond;
  sw->type = dataType;
  sw->target = t;
  if (int32_t rc = capture_control(std::move(sw), s); rc != ACL_SUCCESS)
    return note_error(rc, "aclrtSwitchStream: the stream is not bound to a model being built");
  return ACL_SUCCESS;
}

}  // extern "C"

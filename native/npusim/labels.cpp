// Labels (aclrtCreateLabel / SetLabel / CreateLabelList / SwitchLabelByIndex): jumps inside a
// model run instance. aclrtSetLabel places a label at the current position of a stream bound to
// (or capturing into) a model; aclrtSwitchLabelByIndex queues a task that, when the model runs,
// reads a uint32 index from device memory and goes on at labels[index] (an index past the end
// picks the last label, as CANN documents), leaving the tasks between. Like a model's conditions,
// the index is read by the client when the stream reaches the switch.
//
// Labels and lists are client objects the application holds; a model refers to its labels by
// number, so destroying a label after the build leaves the model runnable (as CANN's does). Kind
// "labels": nothing of them is on the daemon, so they come through a checkpoint with the process
// memory; the switch's index lives in device memory, carried by the kind "memory".
#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "capture.h"
#include "resources.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

constexpr size_t kMaxLabels = 65535;  // per process (CANN's documented limit)

struct LabelObj {
  uint64_t number;   // what models refer to (never reused)
  bool set = false;  // placed in a model (a label marks one position)
};

struct LabelListObj {
  std::vector<uint64_t> labels;
};

std::mutex g_mu;  // guards everything below
std::set<LabelObj *> g_labels;
std::set<LabelListObj *> g_lists;
uint64_t g_next = 1;

// The position a label marks: a no-op when replay passes it.
struct LabelMark : ControlTask {
  uint64_t number;
  explicit LabelMark(uint64_t n) : number(n) {}
  uint64_t label() const override { return number; }
  int32_t run(StreamObj *, uint64_t *jump, StreamObj **) const override {
    *jump = 0;
    return ACL_SUCCESS;
  }
};

struct SwitchByIndex : ControlTask {
  const void *index;  // device address of a uint32
  std::vector<uint64_t> targets;
  int32_t run(StreamObj *s, uint64_t *jump, StreamObj **) const override {
    uint32_t i = 0;
    if (int32_t rc = read_at_stream(index, &i, sizeof(i), s); rc != ACL_SUCCESS) return rc;
    *jump = targets[std::min<size_t>(i, targets.size() - 1)];
    return ACL_SUCCESS;
  }
};

int32_t model_stream(aclrtStream stream, StreamObj **s, const char *api) {
  if (stream == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, std::string(api) + ": stream is NULL");
  return resolve_stream(stream, s);
}

size_t count_labels() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_labels.size();
}

const ResourceKind kLabels{"labels", 31, nullptr, nullptr, nullptr, nullptr, count_labels};
NPUSIM_RESOURCE_KIND(kLabels);

}  // namespace

extern "C" {

aclError aclrtCreateLabel(aclrtLabel *label) {
  if (label == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateLabel: label is NULL");
  std::lock_guard<std::mutex> g(g_mu);
  if (g_labels.size() >= kMaxLabels)
    return note_error(ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, "aclrtCreateLabel: a process holds at most 65535 labels");
  auto *l = new LabelObj{g_next++};
  g_labels.insert(l);
  *label = l;
  return ACL_SUCCESS;
}

aclError aclrtSetLabel(aclrtLabel label, aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = model_stream(stream, &s, "aclrtSetLabel"); rc != ACL_SUCCESS) return rc;
  uint64_t number;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto *l = static_cast<LabelObj *>(label);
    if (l == nullptr || !g_labels.count(l)) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetLabel: not a label");
    if (l->set) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSetLabel: the label is set already");
    number = l->number;
  }
  if (int32_t rc = capture_control(std::make_shared<LabelMark>(number), s); rc != ACL_SUCCESS)
    return note_error(rc, "aclrtSetLabel: the stream is not bound to a model being built");
  std::lock_guard<std::mutex> g(g_mu);
  auto *l = static_cast<LabelObj *>(label);
  if (g_labels.count(l)) l->set = true;
  return ACL_SUCCESS;
}

aclError aclrtDestroyLabel(aclrtLabel label) {
  std::lock_guard<std::mutex> g(g_mu);
  auto *l = static_cast<LabelObj *>(label);
  if (l == nullptr || !g_labels.erase(l)) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyLabel: not a label");
  delete l;
  return ACL_SUCCESS;
}

aclError aclrtCreateLabelList(aclrtLabel *labels, size_t num, aclrtLabelList *labelList) {
  if (labels == nullptr || labelList == nullptr || num == 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateLabelList: labels or labelList is NULL, or num is 0");
  std::lock_guard<std::mutex> g(g_mu);
  auto list = std::make_unique<LabelListObj>();
  for (size_t i = 0; i < num; ++i) {
    auto *l = static_cast<LabelObj *>(labels[i]);
    if (l == nullptr || !g_labels.count(l))
      return note_error(ACL_ERROR_INVALID_PARAM, "aclrtCreateLabelList: labels[" + std::to_string(i) + "] is not a label");
    list->labels.push_back(l->number);
  }
  g_lists.insert(list.get());
  *labelList = list.release();
  return ACL_SUCCESS;
}

aclError aclrtDestroyLabelList(aclrtLabelList labelList) {
  std::lock_guard<std::mutex> g(g_mu);
  auto *list = static_cast<LabelListObj *>(labelList);
  if (list == nullptr || !g_lists.erase(list))
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtDestroyLabelList: not a label list");
  delete list;
  return ACL_SUCCESS;
}

aclError aclrtSwitchLabelByIndex(void *ptr, uint32_t maxValue, aclrtLabelList labelList, aclrtStream stream) {
  if (ptr == nullptr || labelList == nullptr)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSwitchLabelByIndex: ptr or labelList is NULL");
  StreamObj *s = nullptr;
  if (int32_t rc = model_stream(stream, &s, "aclrtSwitchLabelByIndex"); rc != ACL_SUCCESS) return rc;
  auto sw = std::make_shared<SwitchByIndex>();
  sw->index = ptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto *list = static_cast<LabelListObj *>(labelList);
    if (!g_lists.count(list)) return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSwitchLabelByIndex: not a label list");
    if (maxValue == 0 || maxValue > list->labels.size())
      return note_error(ACL_ERROR_INVALID_PARAM, "aclrtSwitchLabelByIndex: maxValue must be 1.." +
                                                     std::to_string(list->labels.size()) + " (the list's labels)");
    sw->targets.assign(list->labels.begin(), list->labels.begin() + maxValue);
  }
  if (int32_t rc = capture_control(std::move(sw), s); rc != ACL_SUCCESS)
    return note_error(rc, "aclrtSwitchLabelByIndex: the stream is not bound to a model being built");
  return ACL_SUCCESS;
}

}  // extern "C"

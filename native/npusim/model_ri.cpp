// Model run instances (aclmdlRI*). Work queued on a capturing stream (aclmdlRICaptureBegin, or a
// stream bound to a model being built) is recorded into the model instead of running;
// aclmdlRIExecuteAsync queues the recorded work on a stream, in the order it was recorded.
// Models live in this process; Restore renews the daemon ids their tasks name (functions, events).
#include <fstream>
#include <algorithm>
#include <climits>
#include <cstdint>
#include <atomic>
#include <map>
#include <memory>
#include <thread>

#include "capture.h"
#include "kernel_objects.h"
#include "resources.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

struct ModelObj;

uint32_t next_model_id() {
  static std::atomic<uint32_t> next{1};
  return next++;
}

// A condition variable of a model: 8 bytes of device memory (an ordinary allocation).
struct CondHandle {
  void *dev;
};

// IF / WHILE / SWITCH on a condition variable, over sub-models captured separately.
struct CondTask {
  aclmdlRICondTaskType type;
  CondHandle *handle;
  std::vector<ModelObj *> branches;
};

struct Recorded {
  proto::Task task;
  std::string body;                // a kernel's argument bytes
  FunctionObj *function = nullptr;  // set by Backup: the daemon ids in task are renewed by Restore
  EventObj *event = nullptr;
  std::shared_ptr<CondTask> cond;  // a conditional task (task unused)
  std::shared_ptr<const ControlTask> control;  // a label, a jump or a stream activation (task unused)
  StreamObj *origin = nullptr;                 // the stream it was recorded on
};

struct TaskGroup {
  size_t begin, end;  // the model's tasks [begin, end)
};

struct ModelObj {
  std::vector<Recorded> tasks;
  std::vector<std::unique_ptr<TaskGroup>> groups;
  std::vector<std::unique_ptr<CondHandle>> conds;
  std::vector<ModelObj *> children;  // the branches of its conditional tasks, destroyed with it
  std::set<StreamObj *> streams;  // capturing into this model
  bool built = false;             // capture ended / build ended: executable
  StreamObj *head = nullptr;      // bound with ACL_MODEL_STREAM_FLAG_HEAD (stream activation)
  uint32_t id = next_model_id();  // aclmdlRIGetId, what aclprofModelSubscribe names
};

struct Capture {
  ModelObj *model;
  aclmdlRICaptureMode mode;
  std::thread::id thread;
  bool bound;  // aclmdlRIBindStream rather than aclmdlRICaptureBegin
  size_t group_begin = SIZE_MAX;  // in a task group since this task (aclmdlRICaptureTaskGrpBegin)
  TaskGroup *update = nullptr;    // recording a replacement for this group (aclmdlRICaptureTaskUpdateBegin)
  std::vector<Recorded> replacement;
};

// Guards everything below; never held while calling the daemon, and taken inside runtime().mu
// (aclrtRecordEvent submits with it held), never the other way round.
std::mutex g_mu;
std::set<ModelObj *> g_models;
std::map<StreamObj *, Capture> g_capturing;
thread_local aclmdlRICaptureMode t_mode = ACL_MODEL_RI_CAPTURE_MODE_GLOBAL;

ModelObj *model_of(aclmdlRI modelRI) {
  auto *m = static_cast<ModelObj *>(modelRI);
  return m != nullptr && g_models.count(m) ? m : nullptr;
}

bool is_kernel(const proto::Task &t) { return t.kind == proto::TaskKind::Kernel; }

}  // namespace

namespace npusim::rt {

bool capture_task(const proto::Task &task, const std::string &body, StreamObj *stream, int32_t *rc) {
  if (stream == nullptr) return false;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(stream);
  if (it == g_capturing.end()) return false;
  Capture &c = it->second;
  (c.update != nullptr ? c.replacement : c.model->tasks).push_back(Recorded{task, body, nullptr, nullptr, nullptr, nullptr, stream});
  *rc = ACL_SUCCESS;
  return true;
}

bool capturing(StreamObj *stream) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_capturing.count(stream) > 0;
}

bool model_ri_exists(uint32_t id) {
  std::lock_guard<std::mutex> g(g_mu);
  for (ModelObj *m : g_models)
    if (m->id == id) return true;
  return false;
}

int32_t capture_control(std::shared_ptr<const ControlTask> control, StreamObj *stream) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(stream);
  if (it == g_capturing.end() || it->second.update != nullptr) return ACL_ERROR_RT_STREAM_MODEL;
  ModelObj *m = it->second.model;
  for (ModelObj *parent : g_models)
    if (std::find(parent->children.begin(), parent->children.end(), m) != parent->children.end())
      return ACL_ERROR_RT_FEATURE_NOT_SUPPORT;
  Recorded r{};
  r.control = std::move(control);
  r.origin = stream;
  m->tasks.push_back(std::move(r));
  return ACL_SUCCESS;
}

int32_t read_at_stream(const void *dev, void *host, size_t n, StreamObj *s) {
  proto::Request rq = wire::request(proto::Op::StreamSync);
  rq.stream = s->id;
  if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  proto::Task t{};
  t.kind = proto::TaskKind::DeviceToHost;
  t.dst = reinterpret_cast<uint64_t>(host);
  t.src = reinterpret_cast<uint64_t>(dev);
  t.size = n;
  return submit(t, nullptr);
}

}  // namespace npusim::rt

namespace {

// Queues one recorded task on s (recorded into another model if s captures itself).
int32_t replay(const Recorded &r, StreamObj *s) {
  proto::Task t = r.task;
  if (is_kernel(t)) {
    int32_t rc = ACL_SUCCESS;
    return capture_task(t, r.body, s, &rc) ? rc : send_kernel(t, r.body, s);
  }
  if (t.kind != proto::TaskKind::RecordEvent && t.kind != proto::TaskKind::WaitEvent) return submit(t, s);
  // Events: a record counts as one more record of the event, a wait waits for the latest.
  std::lock_guard<std::mutex> g(runtime().mu);
  EventObj *e = nullptr;
  for (EventObj *x : runtime().events)
    if (x->id == t.event) e = x;
  if (e == nullptr) return ACL_ERROR_INVALID_PARAM;  // destroyed since the capture
  if (t.kind == proto::TaskKind::WaitEvent) t.target = wait_target(e);
  int32_t rc = submit(t, s);
  if (rc == ACL_SUCCESS && t.kind == proto::TaskKind::RecordEvent) {
    ++e->records;
    e->reset = false;
  }
  return rc;
}

int32_t replay_model(ModelObj *m, StreamObj *s);

// A condition is read when the stream reaches it: the stream is synchronized, the 8 bytes read.
// (So ExecuteAsync of a model with conditions returns once its last condition was decided.)
int32_t read_condition(const CondHandle &h, StreamObj *s, uint64_t *value) {
  return read_at_stream(h.dev, value, sizeof(*value), s);
}

int32_t run_condition(const CondTask &c, StreamObj *s) {
  uint64_t v = 0;
  if (int32_t rc = read_condition(*c.handle, s, &v); rc != ACL_SUCCESS) return rc;
  switch (c.type) {
    case ACL_MODEL_RI_COND_TYPE_IF:
      if (v != 0) return replay_model(c.branches[0], s);
      return c.branches.size() > 1 ? replay_model(c.branches[1], s) : ACL_SUCCESS;
    case ACL_MODEL_RI_COND_TYPE_WHILE:
      for (; v != 0; ) {
        if (int32_t rc = replay_model(c.branches[0], s); rc != ACL_SUCCESS) return rc;
        if (int32_t rc = read_condition(*c.handle, s, &v); rc != ACL_SUCCESS) return rc;
      }
      return ACL_SUCCESS;
    default:  // SWITCH: the branch of that index, none if out of range
      return v < c.branches.size() ? replay_model(c.branches[v], s) : ACL_SUCCESS;
  }
}

// A task's type and name in a subscription's op records.
std::pair<const char *, std::string> op_of(const Recorded &r) {
  switch (r.task.kind) {
    case proto::TaskKind::Kernel: {
      std::lock_guard<std::mutex> g(runtime().mu);
      for (FunctionObj *f : kernel_objects().functions)
        if (f->id == r.task.src2) return {"KERNEL", f->name};
      return {"KERNEL", "kernel"};
    }
    case proto::TaskKind::Memset: return {"MEMSET", "memset"};
    case proto::TaskKind::RecordEvent: return {"EVENT_RECORD", "event record"};
    case proto::TaskKind::WaitEvent: return {"EVENT_WAIT", "event wait"};
    default: return {"MEMCPY", "memcpy"};
  }
}

struct Run {
  const std::vector<Recorded> &tasks;
  uint32_t id;
  bool profiled;
  StreamObj *s;  // where the model runs
};

// Runs the tasks recorded on origin (every task if null) from start on: a jump goes on at its
// label (on the label's stream, this one stops), an activation runs that stream's tasks first.
int32_t run_tasks(const Run &run, StreamObj *origin, size_t start, int depth) {
  if (depth > 64) return note_error(ACL_ERROR_RT_STREAM_MODEL, "aclmdlRIExecuteAsync: streams activate each other without end");
  const auto &tasks = run.tasks;
  for (size_t i = start; i < tasks.size(); ++i) {
    const Recorded &r = tasks[i];
    if (origin != nullptr && r.origin != origin) continue;
    uint64_t jump = 0;
    StreamObj *activate = nullptr;
    int32_t rc;
    if (r.control) rc = r.control->run(run.s, &jump, &activate);
    else if (r.cond) rc = run_condition(*r.cond, run.s);
    else if (run.profiled) {
      auto [type, name] = op_of(r);
      rc = profile_op(run.id, run.s, type, name, [&] { return replay(r, run.s); });
    } else rc = replay(r, run.s);
    if (rc != ACL_SUCCESS) return rc;
    if (activate != nullptr && (rc = run_tasks(run, activate, 0, depth + 1)) != ACL_SUCCESS) return rc;
    if (jump == 0) continue;
    // A jump goes on after the task that placed the label (the label's own task is a no-op).
    size_t at = tasks.size();
    for (size_t j = 0; j < tasks.size() && at == tasks.size(); ++j)
      if (tasks[j].control && tasks[j].control->label() == jump) at = j;
    if (at == tasks.size()) return note_error(ACL_ERROR_INVALID_PARAM, "aclmdlRIExecuteAsync: a switch jumps to a label not set in this model");
    if (origin != nullptr) origin = tasks[at].origin;
    i = at;  // the loop's ++i steps past the label
  }
  return ACL_SUCCESS;
}

int32_t replay_model(ModelObj *m, StreamObj *s) {
  std::vector<Recorded> tasks;
  uint32_t id;
  StreamObj *head = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (!g_models.count(m)) return ACL_ERROR_INVALID_PARAM;
    tasks = m->tasks;
    id = m->id;
    // With stream activations only the head stream starts (CANN's model streams).
    for (const Recorded &r : tasks)
      if (r.control && r.control->activates()) head = m->head != nullptr ? m->head : tasks.front().origin;
  }
  return run_tasks(Run{tasks, id, model_subscribed(id), s}, head, 0, 0);
}

// m and every model under it (conditional branches).
void subtree(ModelObj *m, std::vector<ModelObj *> *out) {
  out->push_back(m);
  for (ModelObj *c : m->children) subtree(c, out);
}

aclError begin(StreamObj *s, ModelObj *m, aclmdlRICaptureMode mode, bool bound) {
  std::lock_guard<std::mutex> g(g_mu);
  if (g_capturing.count(s)) return ACL_ERROR_RT_STREAM_CAPTURED;
  g_capturing[s] = Capture{m, mode, std::this_thread::get_id(), bound, SIZE_MAX, nullptr, {}};
  m->streams.insert(s);
  return ACL_SUCCESS;
}

int32_t user_stream(aclrtStream stream, StreamObj **s) {
  if (int32_t rc = resolve_stream(stream, s); rc != ACL_SUCCESS) return rc;
  return ACL_SUCCESS;
}

}  // namespace

extern "C" {

aclError aclmdlRICaptureBegin(aclrtStream stream, aclmdlRICaptureMode mode) {
  if (mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  auto *m = new ModelObj;
  if (aclError rc = begin(s, m, mode, false); rc != ACL_SUCCESS) {
    delete m;
    return rc;
  }
  std::lock_guard<std::mutex> g(g_mu);
  g_models.insert(m);
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureGetInfo(aclrtStream stream, aclmdlRICaptureStatus *status, aclmdlRI *modelRI) {
  if (status == nullptr || modelRI == nullptr) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  *status = it == g_capturing.end() ? ACL_MODEL_RI_CAPTURE_STATUS_NONE : ACL_MODEL_RI_CAPTURE_STATUS_ACTIVE;
  *modelRI = it == g_capturing.end() ? nullptr : it->second.model;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureEnd(aclrtStream stream, aclmdlRI *modelRI) {
  if (modelRI == nullptr) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  if (it == g_capturing.end() || it->second.bound || it->second.update != nullptr) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  if (it->second.mode != ACL_MODEL_RI_CAPTURE_MODE_RELAXED && it->second.thread != std::this_thread::get_id())
    return ACL_ERROR_RT_STREAM_CAPTURE_WRONG_THREAD;
  ModelObj *m = it->second.model;
  g_capturing.erase(it);
  m->streams.erase(s);
  m->built = true;
  *modelRI = m;
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureThreadExchangeMode(aclmdlRICaptureMode *mode) {
  if (mode == nullptr || *mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || *mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED)
    return ACL_ERROR_INVALID_PARAM;
  std::swap(*mode, t_mode);
  return ACL_SUCCESS;
}

aclError aclmdlRIBuildBegin(aclmdlRI *modelRI, uint32_t flag) {
  if (modelRI == nullptr || flag != 0) return ACL_ERROR_INVALID_PARAM;
  auto *m = new ModelObj;
  std::lock_guard<std::mutex> g(g_mu);
  g_models.insert(m);
  *modelRI = m;
  return ACL_SUCCESS;
}

aclError aclmdlRIBindStream(aclmdlRI modelRI, aclrtStream stream, uint32_t flag) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  ModelObj *m;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if ((m = model_of(modelRI)) == nullptr || m->built) return ACL_ERROR_INVALID_PARAM;
    // The head starts a model with stream activations; without, every bound stream runs.
    if (flag == ACL_MODEL_STREAM_FLAG_HEAD && m->head == nullptr) m->head = s;
  }
  return begin(s, m, ACL_MODEL_RI_CAPTURE_MODE_RELAXED, true);
}

aclError aclmdlRIUnbindStream(aclmdlRI modelRI, aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
  auto it = g_capturing.find(s);
  if (it != g_capturing.end() && it->second.model == m) g_capturing.erase(it);
  return m->streams.erase(s) ? ACL_SUCCESS : ACL_ERROR_RT_STREAM_MODEL;
}

aclError aclmdlRIEndTask(aclmdlRI modelRI, aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  return m != nullptr && m->streams.count(s) ? ACL_SUCCESS : ACL_ERROR_RT_STREAM_MODEL;
}

aclError aclmdlRIBuildEnd(aclmdlRI modelRI, void *reserve) {
  if (reserve != nullptr) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
  // Bound streams stop recording; they stay bound until aclmdlRIUnbindStream.
  for (auto it = g_capturing.begin(); it != g_capturing.end();)
    it = it->second.model == m ? g_capturing.erase(it) : std::next(it);
  m->built = true;
  return ACL_SUCCESS;
}

aclError aclmdlRIExecuteAsync(aclmdlRI modelRI, aclrtStream stream) {
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  ModelObj *m;
  {
    std::lock_guard<std::mutex> g(g_mu);
    m = model_of(modelRI);
    if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
    if (!m->built) return ACL_ERROR_RT_MODEL_CAPTURED;
  }
  return replay_model(m, s);
}

aclError aclmdlRICaptureToModelRIBegin(aclrtStream stream, aclmdlRI modelRI, aclmdlRICaptureMode mode) {
  if (mode < ACL_MODEL_RI_CAPTURE_MODE_GLOBAL || mode > ACL_MODEL_RI_CAPTURE_MODE_RELAXED) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  ModelObj *m;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if ((m = model_of(modelRI)) == nullptr) return ACL_ERROR_INVALID_PARAM;
  }
  return begin(s, m, mode, false);  // appends to what the model holds
}

aclError aclmdlRICondHandleCreate(aclmdlRI modelRI, uint32_t defaultLaunchValue, aclmdlRICondHandleFlag flag,
                                  aclmdlRICondHandle *handle) {
  if (handle == nullptr || (flag != 0 && flag != ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT)) return ACL_ERROR_INVALID_PARAM;
  {
    std::lock_guard<std::mutex> g(g_mu);
    if (model_of(modelRI) == nullptr) return ACL_ERROR_INVALID_PARAM;
  }
  // The condition starts at the default value (CANN's samples set it before each execution).
  void *dev = nullptr;
  if (aclError rc = aclrtMalloc(&dev, sizeof(uint64_t), ACL_MEM_MALLOC_HUGE_FIRST); rc != ACL_SUCCESS) return rc;
  const uint64_t init = flag == ACL_MODEL_RI_COND_HANDLE_ASSIGN_DEFAULT ? defaultLaunchValue : 0;
  if (aclError rc = aclrtMemcpy(dev, sizeof(init), &init, sizeof(init), ACL_MEMCPY_HOST_TO_DEVICE); rc != ACL_SUCCESS) {
    aclrtFree(dev);
    return rc;
  }
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;  // destroyed meanwhile (dev goes with the process)
  m->conds.push_back(std::make_unique<CondHandle>(CondHandle{dev}));
  *handle = m->conds.back().get();
  return ACL_SUCCESS;
}

aclError aclmdlRICondHandleGetCondPtr(aclmdlRICondHandle handle, uint64_t **ptr) {
  if (handle == nullptr || ptr == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(g_mu);
  for (ModelObj *m : g_models)
    for (auto &c : m->conds)
      if (c.get() == handle) {
        *ptr = static_cast<uint64_t *>(c->dev);
        return ACL_SUCCESS;
      }
  return ACL_ERROR_INVALID_PARAM;
}

aclError aclmdlRIAddCondTask(aclmdlRICondTaskParams params, aclrtStream stream, uint32_t flags) {
  if (flags != 0 || params.modelRIArray == nullptr || params.size == 0) return ACL_ERROR_INVALID_PARAM;
  if ((params.type == ACL_MODEL_RI_COND_TYPE_IF && params.size > 2) ||
      (params.type == ACL_MODEL_RI_COND_TYPE_WHILE && params.size != 1) || params.type > ACL_MODEL_RI_COND_TYPE_SWITCH)
    return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  if (it == g_capturing.end() || it->second.update != nullptr) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  ModelObj *m = it->second.model;
  CondHandle *h = nullptr;
  for (auto &c : m->conds)
    if (c.get() == params.handle) h = c.get();
  if (h == nullptr) return ACL_ERROR_INVALID_PARAM;
  auto cond = std::make_shared<CondTask>(CondTask{params.type, h, {}});
  for (uint32_t i = 0; i < params.size; ++i) {
    auto *branch = new ModelObj;  // captured with aclmdlRICaptureToModelRIBegin
    g_models.insert(branch);
    m->children.push_back(branch);
    cond->branches.push_back(branch);
    params.modelRIArray[i] = branch;
  }
  Recorded r{};
  r.cond = cond;
  m->tasks.push_back(std::move(r));
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskGrpBegin(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  if (it == g_capturing.end() || it->second.update != nullptr) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  if (it->second.group_begin != SIZE_MAX) return ACL_ERROR_INVALID_PARAM;  // groups do not nest
  it->second.group_begin = it->second.model->tasks.size();
  return ACL_SUCCESS;
}

aclError aclmdlRICaptureTaskGrpEnd(aclrtStream stream, aclrtTaskGrp *handle) {
  if (handle == nullptr) return ACL_ERROR_INVALID_PARAM;
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  if (it == g_capturing.end() || it->second.group_begin == SIZE_MAX) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  ModelObj *m = it->second.model;
  m->groups.push_back(std::make_unique<TaskGroup>(TaskGroup{it->second.group_begin, m->tasks.size()}));
  it->second.group_begin = SIZE_MAX;
  *handle = m->groups.back().get();
  return ACL_SUCCESS;
}

// Work queued on stream until aclmdlRICaptureTaskUpdateEnd replaces the group's tasks.
aclError aclmdlRICaptureTaskUpdateBegin(aclrtStream stream, aclrtTaskGrp handle) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  for (ModelObj *m : g_models)
    for (auto &grp : m->groups)
      if (grp.get() == handle) {
        if (!m->built) return ACL_ERROR_RT_MODEL_CAPTURED;
        if (g_capturing.count(s)) return ACL_ERROR_RT_STREAM_CAPTURED;
        Capture c{m, ACL_MODEL_RI_CAPTURE_MODE_RELAXED, std::this_thread::get_id(), false, SIZE_MAX, grp.get(), {}};
        g_capturing[s] = std::move(c);
        return ACL_SUCCESS;
      }
  return ACL_ERROR_INVALID_PARAM;
}

// The replacement must be as many tasks of the same kinds (CANN updates parameters, not shape).
aclError aclmdlRICaptureTaskUpdateEnd(aclrtStream stream) {
  StreamObj *s = nullptr;
  if (int32_t rc = user_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_capturing.find(s);
  if (it == g_capturing.end() || it->second.update == nullptr) return ACL_ERROR_RT_STREAM_NOT_CAPTURED;
  Capture c = std::move(it->second);
  g_capturing.erase(it);
  const TaskGroup &grp = *c.update;
  if (c.replacement.size() != grp.end - grp.begin) return ACL_ERROR_RT_MODEL_UPDATE_FAILED;
  for (size_t i = 0; i < c.replacement.size(); ++i)
    if (c.replacement[i].task.kind != c.model->tasks[grp.begin + i].task.kind) return ACL_ERROR_RT_MODEL_UPDATE_FAILED;
  std::move(c.replacement.begin(), c.replacement.end(), c.model->tasks.begin() + static_cast<long>(grp.begin));
  return ACL_SUCCESS;
}

aclError aclmdlRIExecute(aclmdlRI modelRI, int32_t timeout) {
  (void)timeout;  // -1: wait for ever; npusim's work always finishes
  if (aclError rc = aclmdlRIExecuteAsync(modelRI, nullptr); rc != ACL_SUCCESS) return rc;
  return aclrtSynchronizeStream(nullptr);
}

aclError aclmdlRIDestroy(aclmdlRI modelRI) {
  std::vector<void *> conditions;  // freed once g_mu is released (aclrtFree takes runtime().mu)
  {
    std::lock_guard<std::mutex> g(g_mu);
    ModelObj *root = model_of(modelRI);
    if (root == nullptr) return ACL_ERROR_INVALID_PARAM;
    std::vector<ModelObj *> all;
    subtree(root, &all);
    for (ModelObj *m : all) {
      for (auto it = g_capturing.begin(); it != g_capturing.end();)
        it = it->second.model == m ? g_capturing.erase(it) : std::next(it);
      for (auto &c : m->conds) conditions.push_back(c->dev);
      g_models.erase(m);
    }
    for (ModelObj *parent : g_models)  // a branch destroyed on its own leaves its parent
      parent->children.erase(std::remove(parent->children.begin(), parent->children.end(), root), parent->children.end());
    for (ModelObj *m : all) delete m;
  }
  for (void *dev : conditions) aclrtFree(dev);
  return ACL_SUCCESS;
}

aclError aclmdlRIGetId(aclmdlRI modelRI, uint32_t *modelRIId) {
  if (modelRIId == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
  *modelRIId = m->id;
  return ACL_SUCCESS;
}

aclError aclmdlRIDebugPrint(aclmdlRI modelRI) {
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::fprintf(stderr, "npusim: model %p: %zu tasks\n", static_cast<void *>(m), m->tasks.size());
  return ACL_SUCCESS;
}

aclError aclmdlRIDebugJsonPrint(aclmdlRI modelRI, const char *path, uint32_t flags) {
  if (path == nullptr) return ACL_ERROR_INVALID_PARAM;
  (void)flags;
  std::lock_guard<std::mutex> g(g_mu);
  ModelObj *m = model_of(modelRI);
  if (m == nullptr) return ACL_ERROR_INVALID_PARAM;
  std::ofstream out(path);
  if (!out) return ACL_ERROR_INVALID_FILE;
  out << "{\"tasks\": [";
  for (size_t i = 0; i < m->tasks.size(); ++i)
    out << (i ? ", " : "") << "{\"kind\": " << static_cast<uint32_t>(m->tasks[i].task.kind) << "}";
  out << "]}\n";
  return out ? ACL_SUCCESS : ACL_ERROR_INVALID_FILE;
}

}  // extern "C"

// Snapshot: a model's tasks name functions and events by daemon id; Backup ties each to its
// handle, Restore (after functions and events are re-created) writes the new ids back.
namespace {

int32_t backup_models(const SnapshotPass &) {
  std::lock_guard<std::mutex> rg(runtime().mu);
  std::lock_guard<std::mutex> g(g_mu);
  for (ModelObj *m : g_models)
    for (Recorded &r : m->tasks) {
      if (is_kernel(r.task))
        for (FunctionObj *f : kernel_objects().functions)
          if (f->id == r.task.src2) r.function = f;
      if (r.task.kind == proto::TaskKind::RecordEvent || r.task.kind == proto::TaskKind::WaitEvent)
        for (EventObj *e : runtime().events)
          if (e->id == r.task.event) r.event = e;
    }
  return ACL_SUCCESS;
}

int32_t restore_models(const SnapshotPass &) {
  std::lock_guard<std::mutex> rg(runtime().mu);
  std::lock_guard<std::mutex> g(g_mu);
  for (ModelObj *m : g_models)
    for (Recorded &r : m->tasks) {
      if (r.function != nullptr && kernel_objects().functions.count(r.function)) r.task.src2 = r.function->id;
      if (r.event != nullptr && runtime().events.count(r.event)) r.task.event = r.event->id;
    }
  return ACL_SUCCESS;
}

size_t count_models() {
  std::lock_guard<std::mutex> g(g_mu);
  return g_models.size();
}

const ResourceKind kModels{"model run instances", 60, nullptr, backup_models, restore_models, nullptr, count_models};
NPUSIM_RESOURCE_KIND(kModels);

}  // namespace

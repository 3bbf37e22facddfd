// Model subscriptions (aclprofModelSubscribe and the aclprofGetOp* readers of acl_prof.h) and the
// model-id registry of profiling/aprof_pub.h (MsprofSetDeviceIdByGeModelIdx).
//
// A model id is one registered with MsprofSetDeviceIdByGeModelIdx or a model run instance's
// (aclmdlRIGetId). While a model is subscribed, each task of its runs is stamped by the stream
// itself (host functions queued before and after it), and one fixed-size op record per task goes
// to the subscription's pipe: the task's type, its name (a kernel's function name), the model id
// and, with timeInfoSwitch, when the stream started and finished it. Unsubscribing closes the
// pipe's write end, so a reader thread sees the end of the data. Subscriptions are plain process
// state (the pipe is the process's own descriptor): a checkpoint carries them with the process.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "acl/acl_prof.h"
#include "capture.h"
#include "profiling/aprof_pub.h"

using namespace npusim::rt;

struct aclprofSubscribeConfig {
  int8_t time_info;
  aclprofAicoreMetrics metrics;
  int fd;
};

namespace {

constexpr uint32_t kRecordMagic = 0x4e505052;  // "NPPR"

// One op as the pipe carries it; aclprofGetOpDescSize is its size.
struct OpRecord {
  uint32_t magic;
  uint32_t model_id;
  uint32_t flag;  // aclprofSubscribeOpFlag
  uint32_t reserved;
  uint64_t start_ns, end_ns;
  char type[48];
  char name[176];
};
static_assert(sizeof(OpRecord) == 256, "a record is 256 bytes");

struct Subscription {
  int fd;
  bool time_info;
};

std::mutex g_mu;  // guards everything below
std::map<uint32_t, uint32_t> g_ge_models;  // MsprofSetDeviceIdByGeModelIdx: model id -> device
std::map<uint32_t, Subscription> g_subs;

uint64_t clock_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

// A record being stamped by the stream: begin() fills start, end() the rest and sends it.
struct Pending {
  OpRecord rec;
};

void stamp_begin(void *arg) { static_cast<Pending *>(arg)->rec.start_ns = clock_ns(); }

void stamp_end(void *arg) {
  auto *p = static_cast<Pending *>(arg);
  p->rec.end_ns = clock_ns();
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_subs.find(p->rec.model_id);
    if (it != g_subs.end()) {  // unsubscribed meanwhile: the record is dropped
      if (!it->second.time_info) p->rec.start_ns = p->rec.end_ns = 0;
      // One write of less than PIPE_BUF bytes: records never interleave.
      ssize_t n;
      do n = write(it->second.fd, &p->rec, sizeof(p->rec));
      while (n < 0 && errno == EINTR);
    }
  }
  delete p;
}

const OpRecord *record_at(const void *opInfo, size_t opInfoLen, uint32_t index) {
  if (opInfo == nullptr || opInfoLen % sizeof(OpRecord) != 0 || index >= opInfoLen / sizeof(OpRecord)) return nullptr;
  const auto *r = static_cast<const OpRecord *>(opInfo) + index;
  return r->magic == kRecordMagic ? r : nullptr;
}

aclError copy_out(const char *field, char *out, size_t len) {
  const size_t need = strlen(field) + 1;
  if (out == nullptr || len < need) return ACL_ERROR_INVALID_PARAM;
  memcpy(out, field, need);
  return ACL_SUCCESS;
}

}  // namespace

namespace npusim::rt {

bool model_subscribed(uint32_t model_id) {
  std::lock_guard<std::mutex> g(g_mu);
  return g_subs.count(model_id) > 0;
}

int32_t profile_op(uint32_t model_id, StreamObj *s, const char *type, const std::string &name,
                   const std::function<int32_t()> &queue) {
  aclrtStream handle = s->is_default ? nullptr : s;
  auto *p = new Pending{};
  p->rec.magic = kRecordMagic;
  p->rec.model_id = model_id;
  p->rec.flag = ACL_SUBSCRIBE_OP;
  snprintf(p->rec.type, sizeof(p->rec.type), "%s", type);
  snprintf(p->rec.name, sizeof(p->rec.name), "%s", name.c_str());
  if (int32_t rc = aclrtLaunchHostFunc(handle, stamp_begin, p); rc != ACL_SUCCESS) {
    delete p;
    return rc;
  }
  int32_t rc = queue();
  // Sent also after a failed task, so the record is freed; it then shows when the stream gave up.
  if (int32_t end = aclrtLaunchHostFunc(handle, stamp_end, p); end != ACL_SUCCESS) return rc != ACL_SUCCESS ? rc : end;
  return rc;
}

}  // namespace npusim::rt

extern "C" {

int32_t MsprofSetDeviceIdByGeModelIdx(const uint32_t geModelIdx, const uint32_t deviceId) {
  std::lock_guard<std::mutex> g(g_mu);
  g_ge_models[geModelIdx] = deviceId;
  return 0;
}

int32_t MsprofUnsetDeviceIdByGeModelIdx(const uint32_t geModelIdx, const uint32_t deviceId) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_ge_models.find(geModelIdx);
  if (it == g_ge_models.end() || it->second != deviceId) return -1;
  g_ge_models.erase(it);
  return 0;
}

aclError aclprofModelSubscribe(uint32_t modelId, const aclprofSubscribeConfig *profSubscribeConfig) {
  if (profSubscribeConfig == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofModelSubscribe: config is NULL");
  const bool known = model_ri_exists(modelId) || [&] {
    std::lock_guard<std::mutex> g(g_mu);
    return g_ge_models.count(modelId) > 0;
  }();
  if (!known)
    return note_error(ACL_ERROR_INVALID_MODEL_ID, "aclprofModelSubscribe: no model " + std::to_string(modelId) +
                                                      " (a model run instance's id, or one MsprofSetDeviceIdByGeModelIdx registered)");
  std::lock_guard<std::mutex> g(g_mu);
  if (g_subs.count(modelId))
    return note_error(ACL_ERROR_PROF_REPEAT_SUBSCRIBE, "aclprofModelSubscribe: model " + std::to_string(modelId) + " is subscribed already");
  g_subs[modelId] = Subscription{profSubscribeConfig->fd, profSubscribeConfig->time_info != 0};
  return ACL_SUCCESS;
}

aclError aclprofModelUnSubscribe(uint32_t modelId) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_subs.find(modelId);
  if (it == g_subs.end())
    return note_error(ACL_ERROR_INVALID_MODEL_ID, "aclprofModelUnSubscribe: model " + std::to_string(modelId) + " is not subscribed");
  close(it->second.fd);  // the reader sees the end of the data
  g_subs.erase(it);
  return ACL_SUCCESS;
}

aclprofSubscribeConfig *aclprofCreateSubscribeConfig(int8_t timeInfoSwitch, aclprofAicoreMetrics aicoreMetrics, void *fd) {
  if (fd == nullptr || (timeInfoSwitch != 0 && timeInfoSwitch != 1)) {
    note_error(ACL_ERROR_INVALID_PARAM, "aclprofCreateSubscribeConfig: fd is NULL or timeInfoSwitch is not 0/1");
    return nullptr;
  }
  const int pipe_fd = *static_cast<const int *>(fd);
  if (fcntl(pipe_fd, F_GETFD) < 0) {
    note_error(ACL_ERROR_INVALID_PARAM, "aclprofCreateSubscribeConfig: *fd is not an open descriptor");
    return nullptr;
  }
  return new aclprofSubscribeConfig{timeInfoSwitch, aicoreMetrics, pipe_fd};
}

aclError aclprofDestroySubscribeConfig(const aclprofSubscribeConfig *profSubscribeConfig) {
  if (profSubscribeConfig == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofDestroySubscribeConfig: config is NULL");
  delete profSubscribeConfig;
  return ACL_SUCCESS;
}

aclError aclprofGetOpDescSize(size_t *opDescSize) {
  if (opDescSize == nullptr) return ACL_ERROR_INVALID_PARAM;
  *opDescSize = sizeof(OpRecord);
  return ACL_SUCCESS;
}

aclError aclprofGetOpNum(const void *opInfo, size_t opInfoLen, uint32_t *opNumber) {
  if (opInfo == nullptr || opNumber == nullptr || opInfoLen % sizeof(OpRecord) != 0) return ACL_ERROR_INVALID_PARAM;
  *opNumber = static_cast<uint32_t>(opInfoLen / sizeof(OpRecord));
  return ACL_SUCCESS;
}

aclError aclprofGetOpTypeLen(const void *opInfo, size_t opInfoLen, uint32_t index, size_t *opTypeLen) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  if (r == nullptr || opTypeLen == nullptr) return ACL_ERROR_INVALID_PARAM;
  *opTypeLen = strlen(r->type) + 1;
  return ACL_SUCCESS;
}

aclError aclprofGetOpType(const void *opInfo, size_t opInfoLen, uint32_t index, char *opType, size_t opTypeLen) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? ACL_ERROR_INVALID_PARAM : copy_out(r->type, opType, opTypeLen);
}

aclError aclprofGetOpNameLen(const void *opInfo, size_t opInfoLen, uint32_t index, size_t *opNameLen) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  if (r == nullptr || opNameLen == nullptr) return ACL_ERROR_INVALID_PARAM;
  *opNameLen = strlen(r->name) + 1;
  return ACL_SUCCESS;
}

aclError aclprofGetOpName(const void *opInfo, size_t opInfoLen, uint32_t index, char *opName, size_t opNameLen) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? ACL_ERROR_INVALID_PARAM : copy_out(r->name, opName, opNameLen);
}

uint64_t aclprofGetOpStart(const void *opInfo, size_t opInfoLen, uint32_t index) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? 0 : r->start_ns;
}

uint64_t aclprofGetOpEnd(const void *opInfo, size_t opInfoLen, uint32_t index) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? 0 : r->end_ns;
}

uint64_t aclprofGetOpDuration(const void *opInfo, size_t opInfoLen, uint32_t index) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? 0 : r->end_ns - r->start_ns;
}

size_t aclprofGetModelId(const void *opInfo, size_t opInfoLen, uint32_t index) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? 0 : r->model_id;
}

aclprofSubscribeOpFlag aclprofGetOpFlag(const void *opInfo, size_t opInfoLen, uint32_t index) {
  const OpRecord *r = record_at(opInfo, opInfoLen, index);
  return r == nullptr ? ACL_SUBSCRIBE_NONE : static_cast<aclprofSubscribeOpFlag>(r->flag);
}

// npusim records no operator attributes (shapes, ...).
const char *aclprofGetOpAttriValue(const void *, size_t, uint32_t, aclprofSubscribeOpAttri) { return nullptr; }

}  // extern "C"

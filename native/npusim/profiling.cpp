// The profiling API (acl_prof.h): sessions (aclprofInit / Start / Stop / Finalize), configs, and
// msproftx marks, ranges and step timestamps. npusim has no hardware counters; the profiler
// records what the program marks, with host timestamps, and aclprofFinalize writes it as JSON
// lines to <result path>/npusim_prof_<pid>.jsonl. Model subscriptions are in prof_subscribe.cpp.
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "acl/acl_prof.h"
#include "runtime.h"

using namespace npusim::rt;

struct aclprofConfig {
  std::vector<uint32_t> devices;
  aclprofAicoreMetrics metrics;
  uint64_t modules;
};
struct aclprofStepInfo {
  uint64_t start_ns = 0, end_ns = 0;
};

namespace {

struct Stamp {
  std::string message;
};

struct Profiler {
  std::mutex mu;  // guards everything below
  bool initialized = false;
  std::string path;
  const aclprofConfig *running = nullptr;
  std::map<int, std::string> settings;  // aclprofSetConfig, by aclprofConfigType
  std::vector<std::string> records;     // one JSON object per line
  std::map<uint32_t, std::pair<std::string, uint64_t>> ranges;  // open ranges: message, start
  uint32_t next_range = 1;
};

// Never destroyed: a thread may still mark while the process exits.
Profiler &prof() {
  static auto *p = new Profiler;
  return *p;
}

thread_local std::vector<std::pair<std::string, uint64_t>> t_pushed;  // aclprofPush stack

uint64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ULL + static_cast<uint64_t>(ts.tv_nsec);
}

std::string quoted(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void record(const std::string &kind, const std::string &message, uint64_t start, uint64_t end) {
  Profiler &p = prof();
  std::lock_guard<std::mutex> g(p.mu);
  p.records.push_back("{\"kind\": " + quoted(kind) + ", \"message\": " + quoted(message) +
                      ", \"start_ns\": " + std::to_string(start) + ", \"end_ns\": " + std::to_string(end) + "}");
}

int mkdirs(const std::string &path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/')
      if (::mkdir(path.substr(0, i).c_str(), 0750) != 0 && errno != EEXIST) return -1;
  return 0;
}

}  // namespace

extern "C" {

aclError aclprofInit(const char *profilerResultPath, size_t length) {
  if (profilerResultPath == nullptr || length == 0 || length > 4096 || std::strlen(profilerResultPath) != length)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofInit: the result path and its length disagree");
  Profiler &p = prof();
  std::lock_guard<std::mutex> g(p.mu);
  if (p.initialized) return note_error(ACL_ERROR_REPEAT_INITIALIZE, "aclprofInit: already initialized");
  if (mkdirs(profilerResultPath) != 0)
    return note_error(ACL_ERROR_INVALID_FILE, std::string("aclprofInit: cannot create ") + profilerResultPath);
  p.path = profilerResultPath;
  p.initialized = true;
  return ACL_SUCCESS;
}

aclError aclprofFinalize() {
  Profiler &p = prof();
  std::lock_guard<std::mutex> g(p.mu);
  if (!p.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclprofFinalize: aclprofInit was not called");
  if (p.running != nullptr) return note_error(ACL_ERROR_PROF_ALREADY_RUN, "aclprofFinalize: call aclprofStop first");
  const std::string file = p.path + "/npusim_prof_" + std::to_string(::getpid()) + ".jsonl";
  FILE *f = std::fopen(file.c_str(), "a");
  if (f == nullptr) return note_error(ACL_ERROR_WRITE_FILE, "aclprofFinalize: cannot write " + file);
  for (const std::string &line : p.records) std::fprintf(f, "%s\n", line.c_str());
  std::fclose(f);
  p.records.clear();
  p.settings.clear();
  p.initialized = false;
  return ACL_SUCCESS;
}

aclprofConfig *aclprofCreateConfig(uint32_t *deviceIdList, uint32_t deviceNums, aclprofAicoreMetrics aicoreMetrics,
                                   const aclprofAicoreEvents *aicoreEvents, uint64_t dataTypeConfig) {
  if ((deviceNums > 0 && deviceIdList == nullptr) || aicoreEvents != nullptr) {
    note_error(ACL_ERROR_INVALID_PARAM, "aclprofCreateConfig: bad device list (aicoreEvents must be NULL)");
    return nullptr;
  }
  uint32_t count = 0;
  if (aclrtGetDeviceCount(&count) == ACL_SUCCESS)
    for (uint32_t i = 0; i < deviceNums; ++i)
      if (deviceIdList[i] >= count) {
        note_error(ACL_ERROR_INVALID_PARAM, "aclprofCreateConfig: no device " + std::to_string(deviceIdList[i]));
        return nullptr;
      }
  auto *c = new aclprofConfig;
  c->devices.assign(deviceIdList, deviceIdList + deviceNums);
  c->metrics = aicoreMetrics;
  c->modules = dataTypeConfig;
  return c;
}

aclError aclprofDestroyConfig(const aclprofConfig *profilerConfig) {
  if (profilerConfig == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofDestroyConfig: config is NULL");
  {
    std::lock_guard<std::mutex> g(prof().mu);
    if (prof().running == profilerConfig)
      return note_error(ACL_ERROR_PROF_ALREADY_RUN, "aclprofDestroyConfig: the config is running");
  }
  delete profilerConfig;
  return ACL_SUCCESS;
}

aclError aclprofSetConfig(aclprofConfigType configType, const char *config, size_t configLength) {
  if (configType <= ACL_PROF_ARGS_MIN || configType >= ACL_PROF_ARGS_MAX || config == nullptr ||
      std::strlen(config) != configLength)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofSetConfig: bad type or value");
  std::lock_guard<std::mutex> g(prof().mu);
  prof().settings[configType] = config;
  return ACL_SUCCESS;
}

aclError aclprofStart(const aclprofConfig *profilerConfig) {
  if (profilerConfig == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofStart: config is NULL");
  Profiler &p = prof();
  {
    std::lock_guard<std::mutex> g(p.mu);
    if (!p.initialized) return note_error(ACL_ERROR_UNINITIALIZE, "aclprofStart: aclprofInit was not called");
    if (p.running != nullptr) return note_error(ACL_ERROR_PROF_ALREADY_RUN, "aclprofStart: profiling runs already");
    p.running = profilerConfig;
  }
  char modules[32];
  std::snprintf(modules, sizeof(modules), "0x%llx", static_cast<unsigned long long>(profilerConfig->modules));
  record("start", modules, now_ns(), 0);
  return ACL_SUCCESS;
}

aclError aclprofStop(const aclprofConfig *profilerConfig) {
  Profiler &p = prof();
  {
    std::lock_guard<std::mutex> g(p.mu);
    if (profilerConfig == nullptr || p.running != profilerConfig)
      return note_error(ACL_ERROR_PROF_NOT_RUN, "aclprofStop: this config is not running");
    p.running = nullptr;
  }
  record("stop", "", now_ns(), 0);
  return ACL_SUCCESS;
}

aclprofStepInfo *aclprofCreateStepInfo() { return new aclprofStepInfo; }
void aclprofDestroyStepInfo(aclprofStepInfo *stepinfo) { delete stepinfo; }

aclError aclprofGetStepTimestamp(aclprofStepInfo *stepInfo, aclprofStepTag tag, aclrtStream stream) {
  if (stepInfo == nullptr || (tag != ACL_STEP_START && tag != ACL_STEP_END))
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofGetStepTimestamp: bad step info or tag");
  // The step's edge is when the stream gets there: wait for the work queued before it.
  if (aclError rc = aclrtSynchronizeStream(stream); rc != ACL_SUCCESS) return rc;
  (tag == ACL_STEP_START ? stepInfo->start_ns : stepInfo->end_ns) = now_ns();
  if (tag == ACL_STEP_END) record("step", "", stepInfo->start_ns, stepInfo->end_ns);
  return ACL_SUCCESS;
}

void *aclprofCreateStamp() { return new Stamp; }
void aclprofDestroyStamp(void *stamp) { delete static_cast<Stamp *>(stamp); }

aclError aclprofSetStampTraceMessage(void *stamp, const char *msg, uint32_t msgLen) {
  if (stamp == nullptr || msg == nullptr || msgLen == 0 || msgLen > 128)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofSetStampTraceMessage: bad stamp or message (1..128 bytes)");
  static_cast<Stamp *>(stamp)->message.assign(msg, strnlen(msg, msgLen));
  return ACL_SUCCESS;
}

aclError aclprofMark(void *stamp) {
  if (stamp == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofMark: stamp is NULL");
  const uint64_t t = now_ns();
  record("mark", static_cast<Stamp *>(stamp)->message, t, t);
  return ACL_SUCCESS;
}

aclError aclprofMarkEx(const char *msg, size_t msgLen, aclrtStream stream) {
  if (msg == nullptr || msgLen == 0 || msgLen > 128)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofMarkEx: bad message (1..128 bytes)");
  (void)stream;
  const uint64_t t = now_ns();
  record("mark", std::string(msg, strnlen(msg, msgLen)), t, t);
  return ACL_SUCCESS;
}

aclError aclprofPush(void *stamp) {
  if (stamp == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofPush: stamp is NULL");
  t_pushed.emplace_back(static_cast<Stamp *>(stamp)->message, now_ns());
  return ACL_SUCCESS;
}

aclError aclprofPop() {
  if (t_pushed.empty()) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofPop: nothing pushed on this thread");
  auto [message, start] = t_pushed.back();
  t_pushed.pop_back();
  record("range", message, start, now_ns());
  return ACL_SUCCESS;
}

aclError aclprofRangeStart(void *stamp, uint32_t *rangeId) {
  if (stamp == nullptr || rangeId == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofRangeStart: NULL argument");
  Profiler &p = prof();
  std::lock_guard<std::mutex> g(p.mu);
  *rangeId = p.next_range++;
  p.ranges[*rangeId] = {static_cast<Stamp *>(stamp)->message, now_ns()};
  return ACL_SUCCESS;
}

aclError aclprofRangeStop(uint32_t rangeId) {
  std::pair<std::string, uint64_t> range;
  {
    Profiler &p = prof();
    std::lock_guard<std::mutex> g(p.mu);
    auto it = p.ranges.find(rangeId);
    if (it == p.ranges.end()) return note_error(ACL_ERROR_INVALID_PARAM, "aclprofRangeStop: no open range with that id");
    range = it->second;
    p.ranges.erase(it);
  }
  record("range", range.first, range.second, now_ns());
  return ACL_SUCCESS;
}

uint64_t aclprofStr2Id(const char *message) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a: the same message always gets the same id
  for (const char *c = message ? message : ""; *c; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ULL;
  return h;
}

aclError aclprofRangePushEx(aclprofEventAttributes *attr) {
  if (attr == nullptr || attr->messageType != ACL_PROF_MESSAGE_TYPE_TENSOR_INFO)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclprofRangePushEx: bad attributes");
  t_pushed.emplace_back("tensor-info", now_ns());
  return ACL_SUCCESS;
}

aclError aclprofRangePop() { return aclprofPop(); }

}  // extern "C"

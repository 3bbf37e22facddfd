// The dump API (acl_dump.h, aclmdl*Dump): dump settings read from aclInit's JSON configuration or
// aclmdlSetDump, the kernel-argument dump of aclopStartDumpArgs (one line per launch, written as
// the launch is queued) and acldumpSaveExceptionInfo (the tensors a program hands over, copied
// from the device and written to the exception dump path). npusim's operators write no tensor
// data dump: a registered dump callback is kept but receives no chunks.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "acl/acl.h"
#include "acl/acl_dump.h"
#include "runtime.h"

using namespace npusim::rt;

namespace {

struct DumpState {
  std::mutex mu;
  std::string data_path;       // DATA_DUMP: dump_path with the op switch on or a dump list
  std::string exception_path;  // AIC_ERR_*: dump_path with an aic_err_* dump scene
  std::string args_path;       // aclopStartDumpArgs
  bool model_dump = false;     // between aclmdlInitDump and aclmdlFinalizeDump
  int32_t (*callback)(const acldumpChunk *, int32_t) = nullptr;
};

DumpState &dump() {
  static auto *d = new DumpState;  // never destroyed: a launch may dump while the process exits
  return *d;
}

std::string json_string(const std::string &text, const std::string &key) {
  std::smatch m;
  if (std::regex_search(text, m, std::regex("\"" + key + "\"\\s*:\\s*\"([^\"]*)\""))) return m[1];
  return {};
}

struct DumpConfig {
  bool has_dump = false;
  std::string path, scene, op_switch;
  bool has_list = false;
};

bool read_config(const char *file, DumpConfig *out) {
  std::ifstream in(file);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const size_t at = text.find("\"dump\"");
  if (at == std::string::npos) return true;
  const std::string body = text.substr(at);
  out->has_dump = true;
  out->path = json_string(body, "dump_path");
  out->scene = json_string(body, "dump_scene");
  out->op_switch = json_string(body, "dump_op_switch");
  out->has_list = body.find("\"dump_list\"") != std::string::npos;
  return true;
}

void apply(const DumpConfig &c, bool model) {
  DumpState &d = dump();
  std::lock_guard<std::mutex> g(d.mu);
  if (c.path.empty()) return;
  if (c.scene.rfind("aic_err", 0) == 0) d.exception_path = c.path;
  if (c.op_switch == "on" || c.has_list || model) d.data_path = c.path;
}

std::string hex(const std::string &bytes) {
  static const char *digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

const char *tensor_kind(acldumpTensorType t) {
  return t == ACL_DUMP_TENSOR_INPUT ? "input" : t == ACL_DUMP_TENSOR_OUTPUT ? "output" : "workspace";
}

// The data of one tensor: its address resolved as addrType says, then copied from where it lives.
aclError tensor_bytes(const acldumpTensorInfo &t, std::string *out) {
  if (t.tensorAddr == nullptr || t.placement >= ACL_DUMP_PLACEMENT_END) return ACL_ERROR_INVALID_PARAM;
  const void *addr = t.tensorAddr;
  if (t.addrType == ACL_DUMP_ADDR_PTR) addr = reinterpret_cast<const void *>(*t.tensorAddr);
  if (t.addrType == ACL_DUMP_ADDR_PTR_PTR) addr = *reinterpret_cast<void *const *>(*t.tensorAddr);
  out->assign(t.tensorSize, '\0');
  if (t.tensorSize == 0) return ACL_SUCCESS;
  if (t.placement == ACL_DUMP_PLACEMENT_HOST) {
    std::memcpy(out->data(), addr, t.tensorSize);
    return ACL_SUCCESS;
  }
  return aclrtMemcpy(out->data(), out->size(), addr, t.tensorSize, ACL_MEMCPY_DEVICE_TO_HOST);
}

}  // namespace

namespace npusim::rt {

void load_dump_config(const char *configPath) {
  DumpConfig c;
  if (configPath != nullptr && configPath[0] != '\0' && read_config(configPath, &c) && c.has_dump) apply(c, false);
}

void dump_kernel_args(const std::string &kernel, uint32_t blocks, const std::string &args) {
  DumpState &d = dump();
  std::lock_guard<std::mutex> g(d.mu);
  if (d.args_path.empty()) return;
  const std::string file = d.args_path + "/npusim_aicore_args_" + std::to_string(::getpid()) + ".txt";
  if (FILE *f = std::fopen(file.c_str(), "a")) {
    std::fprintf(f, "kernel=%s blocks=%u args=%s\n", kernel.c_str(), blocks, hex(args).c_str());
    std::fclose(f);
  }
}

}  // namespace npusim::rt

extern "C" {

aclError acldumpRegCallback(int32_t (*const messageCallback)(const acldumpChunk *, int32_t), int32_t flag) {
  if (messageCallback == nullptr || flag != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, "acldumpRegCallback: the callback is NULL or flag is not 0");
  std::lock_guard<std::mutex> g(dump().mu);
  dump().callback = messageCallback;
  return ACL_SUCCESS;
}

void acldumpUnregCallback() {
  std::lock_guard<std::mutex> g(dump().mu);
  dump().callback = nullptr;
}

aclError aclopStartDumpArgs(uint32_t dumpType, const char *path) {
  if (dumpType != ACL_OP_DUMP_OP_AICORE_ARGS || path == nullptr || path[0] == '\0')
    return note_error(ACL_ERROR_INVALID_PARAM, "aclopStartDumpArgs: dumpType must be ACL_OP_DUMP_OP_AICORE_ARGS, path set");
  if (::access(path, W_OK) != 0)
    return note_error(ACL_ERROR_INVALID_PARAM, std::string("aclopStartDumpArgs: cannot write into ") + path);
  std::lock_guard<std::mutex> g(dump().mu);
  dump().args_path = path;
  return ACL_SUCCESS;
}

aclError aclopStopDumpArgs(uint32_t dumpType) {
  if (dumpType != ACL_OP_DUMP_OP_AICORE_ARGS)
    return note_error(ACL_ERROR_INVALID_PARAM, "aclopStopDumpArgs: dumpType must be ACL_OP_DUMP_OP_AICORE_ARGS");
  std::lock_guard<std::mutex> g(dump().mu);
  dump().args_path.clear();
  return ACL_SUCCESS;
}

const char *acldumpGetPath(acldumpType dumpType) {
  DumpState &d = dump();
  std::lock_guard<std::mutex> g(d.mu);
  const std::string *p = nullptr;
  if (dumpType == DATA_DUMP) p = &d.data_path;
  if (dumpType >= AIC_ERR_BRIEF_DUMP && dumpType <= AIC_ERR_DETAIL_DUMP) p = &d.exception_path;
  if (p == nullptr || p->empty()) return nullptr;  // OVERFLOW_DUMP: npusim kernels flag no overflow
  return p->c_str();  // stays valid until the setting changes
}

aclError acldumpGetExceptionInfoPath(char *path, size_t maxLen) {
  if (path == nullptr || maxLen == 0) return note_error(ACL_ERROR_INVALID_PARAM, "acldumpGetExceptionInfoPath: NULL path");
  std::lock_guard<std::mutex> g(dump().mu);
  const std::string &p = dump().exception_path;
  if (p.empty())
    return note_error(ACL_ERROR_INVALID_DUMP_CONFIG,
                      "acldumpGetExceptionInfoPath: exception dump is off (aclInit's config sets no aic_err_* dump_scene)");
  if (p.size() + 1 > maxLen) return note_error(ACL_ERROR_INVALID_PARAM, "acldumpGetExceptionInfoPath: maxLen too small");
  std::memcpy(path, p.c_str(), p.size() + 1);
  return ACL_SUCCESS;
}

// <exception path>/<fileName>_<pid>.dump: a text header (the tag, then one line per tensor), a line
// "data", then each tensor's bytes in order.
aclError acldumpSaveExceptionInfo(const char *fileName, const char *userTag, const acldumpTensorInfo *tensors,
                                  size_t tensorCount) {
  if (fileName == nullptr || fileName[0] == '\0' || std::strchr(fileName, '/') != nullptr ||
      (tensors == nullptr && tensorCount > 0))
    return note_error(ACL_ERROR_INVALID_PARAM, "acldumpSaveExceptionInfo: bad file name or tensors");
  std::string dir;
  {
    std::lock_guard<std::mutex> g(dump().mu);
    dir = dump().exception_path;
  }
  if (dir.empty())
    return note_error(ACL_ERROR_INVALID_DUMP_CONFIG, "acldumpSaveExceptionInfo: exception dump is off");
  std::string header = std::string("npusim exception dump\ntag: ") + (userTag ? userTag : "") + "\n";
  std::string data;
  for (size_t i = 0; i < tensorCount; ++i) {
    const acldumpTensorInfo &t = tensors[i];
    if (t.shapeNum > ACL_DUMP_MAX_SHAPE_NUM) return note_error(ACL_ERROR_INVALID_PARAM, "acldumpSaveExceptionInfo: shapeNum > 25");
    std::string bytes;
    if (aclError rc = tensor_bytes(t, &bytes); rc != ACL_SUCCESS)
      return note_error(rc, "acldumpSaveExceptionInfo: cannot read tensor " + std::to_string(i));
    header += "tensor " + std::to_string(i) + ": " + tensor_kind(t.type) + " dtype=" + std::to_string(t.dataType) +
              " format=" + std::to_string(t.format) + " size=" + std::to_string(t.tensorSize) + " shape=[";
    for (uint32_t k = 0; k < t.shapeNum; ++k) header += (k ? "," : "") + std::to_string(t.shape[k]);
    header += "]\n";
    data += bytes;
  }
  const std::string file = dir + "/" + fileName + "_" + std::to_string(::getpid()) + ".dump";
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return note_error(ACL_ERROR_WRITE_FILE, "acldumpSaveExceptionInfo: cannot write " + file);
  const std::string all = header + "data\n" + data;
  bool ok = ::write(fd, all.data(), all.size()) == static_cast<ssize_t>(all.size());
  ok = ::close(fd) == 0 && ok;
  return ok ? ACL_SUCCESS : note_error(ACL_ERROR_WRITE_FILE, "acldumpSaveExceptionInfo: cannot write " + file);
}

aclError aclmdlInitDump() {
  std::lock_guard<std::mutex> g(dump().mu);
  if (dump().model_dump) return note_error(ACL_ERROR_DUMP_ALREADY_RUN, "aclmdlInitDump: already initialized");
  dump().model_dump = true;
  return ACL_SUCCESS;
}

aclError aclmdlSetDump(const char *dumpCfgPath) {
  if (dumpCfgPath == nullptr) return note_error(ACL_ERROR_INVALID_PARAM, "aclmdlSetDump: dumpCfgPath is NULL");
  {
    std::lock_guard<std::mutex> g(dump().mu);
    if (!dump().model_dump) return note_error(ACL_ERROR_DUMP_NOT_RUN, "aclmdlSetDump: call aclmdlInitDump first");
  }
  DumpConfig c;
  if (!read_config(dumpCfgPath, &c)) return note_error(ACL_ERROR_INVALID_FILE, std::string("aclmdlSetDump: cannot read ") + dumpCfgPath);
  if (!c.has_dump || c.path.empty())
    return note_error(ACL_ERROR_INVALID_DUMP_CONFIG, "aclmdlSetDump: no \"dump\" object with a dump_path");
  apply(c, true);
  return ACL_SUCCESS;
}

aclError aclmdlFinalizeDump() {
  std::lock_guard<std::mutex> g(dump().mu);
  if (!dump().model_dump) return note_error(ACL_ERROR_DUMP_NOT_RUN, "aclmdlFinalizeDump: aclmdlInitDump was not called");
  dump().model_dump = false;
  dump().data_path.clear();
  return ACL_SUCCESS;
}

}  // extern "C"

// Device binaries (aclrtBinary*), functions and kernel launches (aclrtLaunchKernel*). A binary is
// an ELF shared object for the host (npusim/kernel.h); the client reads it with its own rights and
// sends its bytes; the daemon's kernel runner for this process, running with our credentials,
// loads and runs it.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "capture.h"
#include "kernel_objects.h"
#include "resources.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace npusim::rt {

KernelObjects &kernel_objects() {
  static KernelObjects *k = new KernelObjects;  // never destroyed, like runtime()
  return *k;
}

void forget_kernel_objects() {
  std::lock_guard<std::mutex> g(runtime().mu);
  KernelObjects &k = kernel_objects();
  for (BinaryObj *b : k.binaries) delete b;
  for (FunctionObj *f : k.functions) delete f;
  for (ArgsObj *a : k.args)
    if (a->user_memory)
      a->~ArgsObj();  // the caller owns the memory
    else
      delete a;
  k = KernelObjects{};
}

int32_t send_kernel(const proto::Task &task, const std::string &args, StreamObj *stream) {
  proto::Request rq = wire::request(proto::Op::LaunchKernel);
  rq.stream = stream->id;
  rq.task = task;
  rq.size = args.size();
  return runtime().pool.call(rq, nullptr, &args);
}

int32_t launch_kernel(FunctionObj *function, uint32_t blocks, const std::string &args, StreamObj *stream) {
  proto::Task t{};
  t.kind = proto::TaskKind::Kernel;
  t.m = blocks;
  t.n = effective_cores(stream);  // blocks run at once, at most
  t.size = args.size();
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    t.src2 = function->id;
  }
  dump_kernel_args(function->name, blocks, args);  // dump.cpp, while aclopStartDumpArgs is on
  int32_t rc = ACL_SUCCESS;
  if (capture_task(t, args, stream, &rc)) return rc;
  return send_kernel(t, args, stream);
}

}  // namespace npusim::rt

namespace {

constexpr size_t kMaxArgs = 64 << 10;  // the daemon's limit on one launch's argument bytes

int32_t load_bytes(BinaryObj *b) {
  proto::Request rq = wire::request(proto::Op::BinaryLoad);
  rq.size = b->bytes.size();
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp, &b->bytes); rc != ACL_SUCCESS) return rc;
  b->id = rp.value[0];
  return ACL_SUCCESS;
}

int32_t lookup(FunctionObj *f) {
  proto::Request rq = wire::request(proto::Op::FunctionLookup);
  rq.value[0] = f->binary->id;
  rq.size = f->name.size();
  proto::Reply rp{};
  if (int32_t rc = runtime().pool.call(rq, &rp, &f->name); rc != ACL_SUCCESS) return rc;
  f->id = rp.value[0];
  return ACL_SUCCESS;
}

bool initialized() {
  std::lock_guard<std::mutex> g(runtime().mu);
  return runtime().initialized;
}

// Options: NULL, or known types only (none changes how npusim loads a binary).
bool options_ok(const aclrtBinaryLoadOptions *options) {
  if (options == nullptr) return true;
  if (options->numOpt > 0 && options->options == nullptr) return false;
  for (size_t i = 0; i < options->numOpt; ++i) {
    const auto type = options->options[i].type;
    if (type != ACL_RT_BINARY_LOAD_OPT_LAZY_LOAD && type != ACL_RT_BINARY_LOAD_OPT_MAGIC &&
        type != ACL_RT_BINARY_LOAD_OPT_CPU_KERNEL_MODE)
      return false;
  }
  return true;
}

aclError load(std::string bytes, aclrtBinHandle *binHandle) {
  if (binHandle == nullptr || bytes.empty()) return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  if (!initialized()) return ACL_ERROR_UNINITIALIZE;
  auto *b = new BinaryObj{std::move(bytes), 0};
  if (int32_t rc = load_bytes(b); rc != ACL_SUCCESS) {
    delete b;
    if (rc == ACL_ERROR_INVALID_FILE) note_error("aclrtBinaryLoad: not an npusim device binary (an ELF shared object for the host)");
    return rc;
  }
  std::lock_guard<std::mutex> g(runtime().mu);
  kernel_objects().binaries.insert(b);
  *binHandle = b;
  return ACL_SUCCESS;
}

// b is a loaded binary of this process (runtime().mu held).
int32_t check_binary(const BinaryObj *b) {
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  return b != nullptr && kernel_objects().binaries.count(const_cast<BinaryObj *>(b)) ? ACL_SUCCESS : ACL_ERROR_INVALID_PARAM;
}

struct HostBinary {
  std::string bytes;
};

int32_t check_function(aclrtFuncHandle funcHandle, FunctionObj **out) {
  std::lock_guard<std::mutex> g(runtime().mu);
  if (!runtime().initialized) return ACL_ERROR_UNINITIALIZE;
  auto *f = static_cast<FunctionObj *>(funcHandle);
  if (f == nullptr || kernel_objects().functions.count(f) == 0) return ACL_ERROR_INVALID_PARAM;
  *out = f;
  return ACL_SUCCESS;
}

bool config_ok(const aclrtLaunchKernelCfg *cfg) {
  return cfg == nullptr || cfg->numAttrs == 0 || cfg->attrs != nullptr;
}

aclError launch(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                aclrtLaunchKernelCfg *cfg, aclrtStream stream) {
  if (numBlocks == 0 || (argsData == nullptr && argsSize > 0) || argsSize > kMaxArgs || !config_ok(cfg))
    return ACL_ERROR_INVALID_PARAM;
  CallScope scope;
  FunctionObj *f = nullptr;
  StreamObj *s = nullptr;
  if (int32_t rc = check_function(funcHandle, &f); rc != ACL_SUCCESS) return rc;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  return launch_kernel(f, numBlocks, std::string(static_cast<const char *>(argsData), argsSize), s);
}

}  // namespace

extern "C" {

aclrtBinary aclrtCreateBinary(const void *data, size_t dataLen) {
  if (data == nullptr || dataLen == 0) return nullptr;
  return new HostBinary{std::string(static_cast<const char *>(data), dataLen)};
}

aclError aclrtDestroyBinary(aclrtBinary binary) {
  if (binary == nullptr) return ACL_ERROR_INVALID_PARAM;
  delete static_cast<HostBinary *>(binary);
  return ACL_SUCCESS;
}

aclError aclrtBinaryLoad(const aclrtBinary binary, aclrtBinHandle *binHandle) {
  if (binary == nullptr) return ACL_ERROR_INVALID_PARAM;
  return load(static_cast<const HostBinary *>(binary)->bytes, binHandle);
}

aclError aclrtBinaryLoadFromData(const void *data, size_t length, const aclrtBinaryLoadOptions *options,
                                 aclrtBinHandle *binHandle) {
  if (data == nullptr || length == 0 || !options_ok(options)) return ACL_ERROR_INVALID_PARAM;
  return load(std::string(static_cast<const char *>(data), length), binHandle);
}

aclError aclrtBinaryLoadFromFile(const char *binPath, aclrtBinaryLoadOptions *options, aclrtBinHandle *binHandle) {
  if (binPath == nullptr || binHandle == nullptr || !options_ok(options)) return ACL_ERROR_INVALID_PARAM;
  // Read with our own rights, as the application would.
  int fd = ::open(binPath, O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0) ::close(fd);
    note_error(std::string("aclrtBinaryLoadFromFile: cannot read ") + binPath + ": " + std::strerror(errno ? errno : EINVAL));
    return ACL_ERROR_INVALID_FILE;
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != bytes.size()) return ACL_ERROR_INVALID_FILE;
  return load(std::move(bytes), binHandle);
}

aclError aclrtBinaryUnLoad(aclrtBinHandle binHandle) {
  Runtime &r = runtime();
  CallScope scope;
  auto *b = static_cast<BinaryObj *>(binHandle);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (int32_t rc = check_binary(b); rc != ACL_SUCCESS) return rc;
  }
  proto::Request rq = wire::request(proto::Op::BinaryUnload);
  rq.value[0] = b->id;
  int32_t rc = r.pool.call(rq);
  std::lock_guard<std::mutex> g(r.mu);
  KernelObjects &k = kernel_objects();
  for (auto it = k.functions.begin(); it != k.functions.end();) {
    if ((*it)->binary != b) {
      ++it;
      continue;
    }
    delete *it;
    it = k.functions.erase(it);
  }
  k.binaries.erase(b);
  delete b;
  return rc;
}

aclError aclrtBinaryGetFunction(const aclrtBinHandle binHandle, const char *kernelName, aclrtFuncHandle *funcHandle) {
  if (kernelName == nullptr || kernelName[0] == '\0' || funcHandle == nullptr) return ACL_ERROR_INVALID_PARAM;
  Runtime &r = runtime();
  CallScope scope;
  auto *b = static_cast<BinaryObj *>(binHandle);
  {
    std::lock_guard<std::mutex> g(r.mu);
    if (int32_t rc = check_binary(b); rc != ACL_SUCCESS) return rc;
    for (FunctionObj *f : kernel_objects().functions)
      if (f->binary == b && f->name == kernelName) {
        *funcHandle = f;  // one handle per kernel of a binary
        return ACL_SUCCESS;
      }
  }
  auto *f = new FunctionObj{b, kernelName, 0};
  if (int32_t rc = lookup(f); rc != ACL_SUCCESS) {
    delete f;
    note_error(std::string("aclrtBinaryGetFunction: no kernel ") + kernelName + " in the binary");
    return rc;
  }
  std::lock_guard<std::mutex> g(r.mu);
  kernel_objects().functions.insert(f);
  *funcHandle = f;
  return ACL_SUCCESS;
}

aclError aclrtGetFunctionName(aclrtFuncHandle funcHandle, uint32_t maxLen, char *name) {
  if (name == nullptr || maxLen == 0) return ACL_ERROR_INVALID_PARAM;
  FunctionObj *f = nullptr;
  if (int32_t rc = check_function(funcHandle, &f); rc != ACL_SUCCESS) return rc;
  if (f->name.size() + 1 > maxLen) return ACL_ERROR_INVALID_PARAM;
  std::memcpy(name, f->name.c_str(), f->name.size() + 1);
  return ACL_SUCCESS;
}

aclError aclrtLaunchKernel(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                           aclrtStream stream) {
  return launch(funcHandle, numBlocks, argsData, argsSize, nullptr, stream);
}

aclError aclrtLaunchKernelV2(aclrtFuncHandle funcHandle, uint32_t numBlocks, const void *argsData, size_t argsSize,
                             aclrtLaunchKernelCfg *cfg, aclrtStream stream) {
  return launch(funcHandle, numBlocks, argsData, argsSize, cfg, stream);
}

}  // extern "C"

// Snapshot: binaries are loaded again from the bytes this process keeps (the file may be gone),
// functions looked up again by name; both get new daemon ids behind the same handles.
namespace {

template <typename T>
std::vector<T *> listed(const std::set<T *> &live) {
  std::lock_guard<std::mutex> g(runtime().mu);
  return std::vector<T *>(live.begin(), live.end());
}

int32_t restore_binaries(const SnapshotPass &) {
  for (BinaryObj *b : listed(kernel_objects().binaries))
    if (load_bytes(b) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  return ACL_SUCCESS;
}

int32_t restore_functions(const SnapshotPass &) {
  for (FunctionObj *f : listed(kernel_objects().functions))
    if (lookup(f) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  return ACL_SUCCESS;
}

const ResourceKind kBinaries{"binaries", 50, nullptr, nullptr, restore_binaries, nullptr,
                             [] { return kernel_objects().binaries.size(); }};
const ResourceKind kFunctions{"functions", 51, nullptr, nullptr, restore_functions, nullptr,
                              [] { return kernel_objects().functions.size(); }};
NPUSIM_RESOURCE_KIND(kBinaries);
NPUSIM_RESOURCE_KIND(kFunctions);

}  // namespace

// npusimAscendcLaunch: what the aclrtlaunch_<kernel> functions of an AscendC kernel library built by
// npusim's ascendc.cmake call. The library embeds its npusim device binary; the first launch loads
// it (an ordinary binary of the process: kind "binaries" carries it across a checkpoint) and every
// launch queues the kernel by name, like aclrtBinaryGetFunction + aclrtLaunchKernel.
#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "acl/npusim.h"
#include "kernel_objects.h"

using namespace npusim::rt;

namespace {

// The process's handle of an embedded binary, loading it the first time. Handles go with
// aclFinalize (forget_kernel_objects clears the map), so a later aclInit loads it again.
aclError embedded_binary(const void *binary, size_t size, aclrtBinHandle *out) {
  {
    std::lock_guard<std::mutex> g(runtime().mu);
    auto &known = kernel_objects().embedded;
    if (auto it = known.find(binary); it != known.end() && kernel_objects().binaries.count(it->second)) {
      *out = it->second;
      return ACL_SUCCESS;
    }
  }
  aclrtBinHandle h = nullptr;
  if (aclError rc = aclrtBinaryLoadFromData(binary, size, nullptr, &h); rc != ACL_SUCCESS) return rc;
  std::lock_guard<std::mutex> g(runtime().mu);
  auto &known = kernel_objects().embedded;
  if (auto it = known.find(binary); it != known.end() && kernel_objects().binaries.count(it->second)) {
    *out = it->second;  // another thread loaded it meanwhile: ours stays loaded but unused
    return ACL_SUCCESS;
  }
  known[binary] = static_cast<BinaryObj *>(h);
  *out = h;
  return ACL_SUCCESS;
}

// A printing kernel's output: a device buffer of its own per launch, headed by {used, capacity},
// written out by a host function queued right after the kernel, which then frees it. A job whose
// host function never runs (aclrtDestroyStreamForce drops it) is written when its stream goes, as
// CANN prints a kernel's output however the stream ends.
constexpr size_t kPrintHeader = 2 * sizeof(uint64_t);

struct PrintJob {
  void *buffer;
  size_t size;
  aclrtStream stream;
};

std::mutex g_jobs_mu;
std::set<PrintJob *> g_jobs;  // written out by whoever takes a job out first

void write_out(PrintJob *job) {
  uint64_t header[2] = {0, 0};
  if (aclrtMemcpy(header, sizeof header, job->buffer, sizeof header, ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS) {
    const size_t used = std::min<uint64_t>(header[0], job->size - kPrintHeader);
    std::string text(used, '\0');
    if (used > 0 && aclrtMemcpy(text.data(), used, static_cast<char *>(job->buffer) + kPrintHeader, used,
                                ACL_MEMCPY_DEVICE_TO_HOST) == ACL_SUCCESS) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    }
  }
  aclrtFree(job->buffer);
  delete job;
}

void flush_prints(void *arg) {
  auto *job = static_cast<PrintJob *>(arg);
  {
    std::lock_guard<std::mutex> g(g_jobs_mu);
    if (g_jobs.erase(job) == 0) return;  // already written out
  }
  write_out(job);
}

aclError launch_printing(aclrtFuncHandle fn, uint32_t blockDim, aclrtStream stream, const void *args,
                         size_t argsSize, size_t printBytes) {
  void *buffer = nullptr;
  if (aclError rc = aclrtMalloc(&buffer, printBytes, ACL_MEM_MALLOC_HUGE_FIRST); rc != ACL_SUCCESS) return rc;
  const uint64_t header[2] = {0, printBytes - kPrintHeader};
  std::string all(static_cast<const char *>(args), argsSize);
  const uint64_t addr = reinterpret_cast<uintptr_t>(buffer);
  all.append(reinterpret_cast<const char *>(&addr), sizeof addr);
  aclError rc = aclrtMemcpy(buffer, printBytes, header, sizeof header, ACL_MEMCPY_HOST_TO_DEVICE);
  if (rc == ACL_SUCCESS) rc = aclrtLaunchKernel(fn, blockDim, all.data(), all.size(), stream);
  if (rc != ACL_SUCCESS) {
    aclrtFree(buffer);
    return rc;
  }
  auto *job = new PrintJob{buffer, printBytes, stream};
  {
    std::lock_guard<std::mutex> g(g_jobs_mu);
    g_jobs.insert(job);
  }
  if (rc = aclrtLaunchHostFunc(stream, flush_prints, job); rc != ACL_SUCCESS) {
    aclrtSynchronizeStream(stream);  // the kernel may still write into the buffer
    flush_prints(job);
  }
  return rc;
}

}  // namespace

namespace npusim::rt {

void flush_stream_prints(aclrtStream stream) {
  std::vector<PrintJob *> left;
  {
    std::lock_guard<std::mutex> g(g_jobs_mu);
    for (auto it = g_jobs.begin(); it != g_jobs.end();) {
      if ((*it)->stream != stream) {
        ++it;
        continue;
      }
      left.push_back(*it);
      it = g_jobs.erase(it);
    }
  }
  for (PrintJob *job : left) write_out(job);
}

}  // namespace npusim::rt

extern "C" {

aclError npusimAscendcLaunch(const char *library, const char *kernel, const void *binary, size_t binarySize,
                             uint32_t blockDim, aclrtStream stream, const void *args, size_t argsSize,
                             size_t printBytes) {
  const std::string lib = library != nullptr ? library : "?";
  const std::string name = kernel != nullptr ? kernel : "?";
  if (binary == nullptr || binarySize == 0)
    return note_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                      "aclrtlaunch_" + name + ": the AscendC kernel " + name + " of library " + lib +
                          " has no npusim implementation (npusim cannot run AscendC device code it cannot "
                          "compile for the host); write it as an npusim kernel (npusim/kernel.h) in "
                          "<kernel source>.npusim.cpp or list its source in the CMake variable NPUSIM_KERNEL_SOURCES_" + lib +
                          ", then rebuild");
  aclrtBinHandle bin = nullptr;
  if (aclError rc = embedded_binary(binary, binarySize, &bin); rc != ACL_SUCCESS) {
    note_error(rc, "aclrtlaunch_" + name + ": cannot load the npusim binary of library " + lib);
    return rc;
  }
  aclrtFuncHandle fn = nullptr;
  if (aclError rc = aclrtBinaryGetFunction(bin, name.c_str(), &fn); rc != ACL_SUCCESS) {
    note_error(rc, "aclrtlaunch_" + name + ": library " + lib + "'s npusim binary has no kernel " + name);
    return rc;
  }
  if (printBytes <= kPrintHeader) return aclrtLaunchKernel(fn, blockDim, args, argsSize, stream);
  return launch_printing(fn, blockDim, stream, args, argsSize, printBytes);
}

}  // extern "C"

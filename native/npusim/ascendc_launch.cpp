// npusimAscendcLaunch: what the aclrtlaunch_<kernel> functions of an AscendC kernel library built by
// npusim's ascendc.cmake call. The library embeds its npusim device binary; the first launch loads
// it (an ordinary binary of the process: kind "binaries" carries it across a checkpoint) and every
// launch queues the kernel by name, like aclrtBinaryGetFunction + aclrtLaunchKernel.
#include <string>

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

}  // namespace

extern "C" {

aclError npusimAscendcLaunch(const char *library, const char *kernel, const void *binary, size_t binarySize,
                             uint32_t blockDim, aclrtStream stream, const void *args, size_t argsSize) {
  const std::string lib = library != nullptr ? library : "?";
  const std::string name = kernel != nullptr ? kernel : "?";
  if (binary == nullptr || binarySize == 0)
    return note_error(ACL_ERROR_RT_FEATURE_NOT_SUPPORT,
                      "aclrtlaunch_" + name + ": the AscendC kernel " + name + " of library " + lib +
                          " has no npusim implementation (npusim cannot run AscendC device code it cannot "
                          "compile for the host); write it as an npusim kernel (npusim/kernel.h) in "
                          "<kernel source>.npusim.cpp or list a file in NPUSIM_KERNEL_SOURCES, then rebuild");
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
  return aclrtLaunchKernel(fn, blockDim, args, argsSize, stream);
}

}  // extern "C"

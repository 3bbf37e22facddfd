// The client's device binaries, functions and kernel-argument handles (binary.cpp,
// kernel_args.cpp). Handles are objects of this process, guarded by runtime().mu; the daemon knows
// binaries and functions by ids that Restore renews, so the application's handles stay valid.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "runtime.h"

namespace npusim::rt {

struct BinaryObj {
  std::string bytes;  // kept: Restore loads them again, also after the file is gone
  uint64_t id = 0;    // the daemon's
};

struct FunctionObj {
  BinaryObj *binary;
  std::string name;
  uint64_t id = 0;  // the daemon's
};

struct ParamObj {
  size_t offset;             // of its slot in the argument bytes
  size_t size;
  bool placeholder;
  std::vector<char> data;    // a placeholder's host buffer (aclrtKernelArgsGetPlaceHolderBuffer)
  size_t device_offset = 0;  // where its data lands in the handle's device buffer
};

struct ArgsObj {
  FunctionObj *function;
  std::string bytes;
  std::vector<std::unique_ptr<ParamObj>> params;
  bool finalized = false;
  bool user_memory = false;        // aclrtKernelArgsInitByUserMem: the handle lives in the caller's memory
  void *placeholder_dev = nullptr;  // device copy of every placeholder's data (an aclrtMalloc)
  size_t placeholder_size = 0;
};

struct KernelObjects {
  std::set<BinaryObj *> binaries;
  std::set<FunctionObj *> functions;
  std::set<ArgsObj *> args;
  std::map<const void *, BinaryObj *> embedded;  // ascendc_launch.cpp: a library's embedded binary, loaded
};

// The process's kernel objects (runtime().mu guards them).
KernelObjects &kernel_objects();
// aclFinalize: every binary, function and argument handle is gone with the device session.
void forget_kernel_objects();
// Queues function on stream with these argument bytes (captured instead while stream captures).
int32_t launch_kernel(FunctionObj *function, uint32_t blocks, const std::string &args, StreamObj *stream);
// The most blocks of one launch on stream that run at once (res_limit.cpp: the vector-core limit).
uint32_t effective_cores(StreamObj *stream);
// Sends a Kernel task to the daemon now (the replay of a captured launch uses it too).
int32_t send_kernel(const proto::Task &task, const std::string &args, StreamObj *stream);

}  // namespace npusim::rt

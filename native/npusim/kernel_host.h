// The daemon's side of device binaries and kernel launches: each session that loads a binary gets
// a kernel runner process (kernel_runner.cpp) running with the client's credentials; the daemon
// only forwards binaries, device memory (memfds) and launches to it and never runs kernel code.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "protocol.h"

namespace npusim {

struct Session;
struct Work;
class DeviceState;

namespace kernels {

struct Function {
  uint64_t binary;
  std::string name;
};

// One session's binaries and functions, and its runner. mu serializes the runner channel.
struct SessionKernels {
  std::mutex mu;
  pid_t runner = 0;
  int channel = -1;
  bool dead = false;                        // the runner died (a kernel crashed): launches fail
  std::map<uint64_t, uint64_t> mapped;      // device address -> Buffer serial the runner has mapped
  std::map<uint64_t, bool> binaries;        // binary ids loaded in the runner
  std::map<uint64_t, Function> functions;   // function id -> binary and name
  uint64_t next_id = 1;
  ~SessionKernels();
};

// BinaryLoad, BinaryUnload, FunctionLookup and LaunchKernel: read their own trailing bytes from fd.
// peer_uid: the requesting connection's uid (SO_PEERCRED). False: the connection must close.
bool serve(DeviceState &state, Session &s, int fd, uid_t peer_uid, const proto::Request &rq, proto::Reply &rp);
// Runs a Kernel task on the session's runner (a stream worker calls it).
int32_t run(Work &w);
// Ends the session's runner and forgets its binaries (Release, last connection gone).
void release(Session &s);

}  // namespace kernels
}  // namespace npusim

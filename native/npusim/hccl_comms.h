// The communicators this process holds, as the runtime keeps them: hccl_bridge.cpp fills the
// table for libhccl.so, hccl_snapshot.cpp carries it across a snapshot (free pass at Lock,
// re-formed at Restore).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace npusim::rt {

struct CommEntry {
  uint64_t id = 0;
  uint32_t rank = 0, nranks = 0;
  uint64_t member = 0;  // the daemon's member: a restore re-forms the communicator under a new one
  uint64_t seq = 0;     // collectives this rank issued (Send/Recv are counted per peer below)
  uint64_t pass = 0;    // while locking: collectives up to this sequence number still pass the gate
  bool pass_fixed = false;  // a lock alone keeps its first pass (the peers running on would raise it forever)
  std::vector<uint64_t> recvd;      // per peer: Recvs this rank issued since the communicator formed
  std::vector<uint64_t> recv_pass;  // while locking, per peer: its Sends to this rank (Recvs up to it pass)
  std::vector<uint64_t> sent;       // per peer: Sends this rank issued since the communicator formed
  std::vector<uint64_t> send_pass;  // while locking, per peer: its Recvs from this rank (Sends up to it pass)
  bool left_alone = false;  // locked without its peers (--force): a restore that cannot re-form it goes on
  int32_t device = 0;
  int64_t connect_ms = 0, exec_ms = 0;  // HCCL_CONNECT_TIMEOUT / HCCL_EXEC_TIMEOUT at init
  uint32_t origin = 0;                  // NPUSIM_HCCL_ORIGIN_* (how the application formed it)
  std::shared_ptr<std::mutex> order;    // held across an enqueue: sequence numbers in queue order
};

// Keyed by the application's HcclComm handle; guarded by runtime().mu.
std::map<const void *, CommEntry> &hccl_comms();
// runtime().hccl_behind from the table (runtime().mu held).
void hccl_update_behind();

}  // namespace npusim::rt

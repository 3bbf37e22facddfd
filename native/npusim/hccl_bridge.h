// What libhccl.so needs from the runtime (libascendcl.so), exported by hccl_bridge.cpp under
// npusim-private names: the daemon connection, stream handles, the current device, and the
// communicators as a resource kind of the snapshot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "acl/acl_base.h"
#include "protocol.h"

// How the application formed a communicator (kept for the snapshot and `npusnap inspect`).
#define NPUSIM_HCCL_ORIGIN_ROOT_INFO 0  /* HcclGetRootInfo + HcclCommInitRootInfo */
#define NPUSIM_HCCL_ORIGIN_RANK_TABLE 1 /* HcclCommInitClusterInfo */

// A communicator as libhccl.so formed it.
struct NpusimHcclCommDesc {
  uint64_t comm_id, member;
  uint32_t rank, nranks;
  int32_t device;
  uint32_t origin;
  int64_t connect_ms, exec_ms;
};

extern "C" {
// One request to the daemon (behind the snapshot's call gate); body: rq->size trailing bytes.
ACL_FUNC_VISIBILITY int32_t npusimHcclCall(const npusim::proto::Request *rq, npusim::proto::Reply *rp,
                                           const void *body);
// Queues rq (an HcclEnqueue of comm) on stream (NULL: the current context's default stream); fills
// in the member and the sequence number. While the process is being locked, a collective waits at
// the gate unless it is within the communicator's free pass.
ACL_FUNC_VISIBILITY int32_t npusimHcclSubmit(void *stream, const void *comm, npusim::proto::Request *rq);
// The calling thread's device, or an aclError.
ACL_FUNC_VISIBILITY int32_t npusimHcclDevice(int32_t *device);
// A communicator handle becomes live (desc) or is destroyed (NULL).
ACL_FUNC_VISIBILITY void npusimHcclTrack(const void *comm, const NpusimHcclCommDesc *desc);
// A live communicator's member and issued count; -1 if comm is not tracked.
ACL_FUNC_VISIBILITY int npusimHcclMember(const void *comm, uint64_t *member, uint64_t *seq);
}

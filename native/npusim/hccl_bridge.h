// What libhccl.so needs from the runtime (libascendcl.so), exported by hccl_bridge.cpp under
// npusim-private names: the daemon connection, stream handles, the current device, and the
// communicators as a resource kind of the snapshot.
#pragma once

#include <cstddef>
#include <cstdint>

#include "acl/acl_base.h"
#include "protocol.h"

extern "C" {
// One request to the daemon (behind the snapshot's call gate); body: rq->size trailing bytes.
ACL_FUNC_VISIBILITY int32_t npusimHcclCall(const npusim::proto::Request *rq, npusim::proto::Reply *rp,
                                           const void *body);
// Queues rq (an HcclEnqueue) on stream (NULL: the current context's default stream).
ACL_FUNC_VISIBILITY int32_t npusimHcclSubmit(void *stream, npusim::proto::Request *rq);
// The calling thread's device, or an aclError.
ACL_FUNC_VISIBILITY int32_t npusimHcclDevice(int32_t *device);
// A communicator handle becomes live (live != 0) or is destroyed.
ACL_FUNC_VISIBILITY void npusimHcclTrack(const void *comm, uint64_t comm_id, uint32_t rank, uint32_t nranks,
                                         int live);
}

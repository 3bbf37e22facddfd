// HCCL's private contracts: what HcclRootInfo holds, how a collective travels as a Task, and the
// TCP protocol between npusim daemons (hccl_daemon.cpp).
//
// Transport: ranks never talk to each other. Each rank's daemon holds one TCP connection per
// communicator member to the communicator's root daemon (the one HcclGetRootInfo asked, or rank
// 0's for a rank table), which gathers every rank's contribution to collective k, computes each
// rank's result in rank order and sends it back. A checkpointed rank therefore holds no
// inter-rank socket: only its Unix connection to its own daemon.
#pragma once

#include <cstdint>

namespace npusim::hccl {

// HcclRootInfo.internal starts with this (the rest is zero).
struct RootBlob {
  char magic[8];          // kRootMagic
  uint32_t ipv4;          // the root daemon's address, network byte order
  uint16_t port;          // its HCCL listener, host byte order
  uint16_t reserved;
  uint64_t comm_id;       // unique per communicator (random)
  uint8_t secret[32];     // every joining daemon must present it (random, from the root's process)
};
constexpr char kRootMagic[8] = {'N', 'P', 'S', 'H', 'C', 'C', 'L', '1'};

// Collective kinds (Task.m of TaskKind::HcclCollective).
enum Kind : uint64_t { kAllReduce = 1, kBroadcast, kAllGather, kReduceScatter, kReduce, kSend, kRecv, kBarrier };

// How a collective travels to the daemon (Op::HcclEnqueue, TaskKind::HcclCollective):
//   event = member id, m = Kind, n = HcclDataType, k = HcclReduceOp, value = root / peer rank,
//   size = count (elements; for ReduceScatter the receive count, for AllGather the send count),
//   src = send buffer, dst = receive buffer, target = the communicator's sequence number.
// Requests (all carry HcclResult values in Reply.code, or an aclError >= 100000 from the pool):
//   HcclRootInfo:   value[0] = HCCL_IF_IP as IPv4 (0: the listener's), value[1] = the communicator's
//                   id (0: a new random one; a restore re-forms it under its old id), body = the
//                   32-byte secret -> value[0] = comm id, value[1] = port, value[2] = IPv4 address
//   HcclCommInit:   device, value[0] = ranks, value[1] = rank, timeout_ms = connect timeout,
//                   addr = exec timeout ms (0: never), flags = 1: register the communicator here
//                   first (rank 0 of a rank table), task.target = the sequence number the member
//                   starts at (a restore), body = RootBlob -> value[0] = member id
//   HcclCommDestroy: value[0] = member id
//   HcclCommInfo:   value[0] = member id -> value[0] = issued, [1] = completed, [2] = 1 if broken
//   HcclLockQuery:  value[0] = member id, value[1] = collectives the rank's process issued, flags =
//                   kLockReport or kLockWithdraw -> value[0] = the free pass (the highest sequence
//                   number any rank issued), value[1] = 1 once every rank reported (all are locking);
//                   code HCCL_E_REMOTE: the communicator is broken (this member failed, or a rank
//                   left without being locked: value[2] = that rank + 1, 0 if unknown)
constexpr uint32_t kLockReport = 0;    // this rank is locking: count it, tell me the free pass
constexpr uint32_t kLockWithdraw = 1;  // this rank's lock ended without a checkpoint (timeout, unlock)
// This rank drained: how many HcclSends to or from it the root holds that no HcclRecv took yet
// (LockReply.pass; .settled = a peer rank of one of them). Leaves the rank's report as it was.
// With value[1] = P + 1 instead of the issued count: how many Sends rank P made to this rank
// reached the root (LockReply.pass), for the Recv's free pass.
constexpr uint32_t kLockMail = 2;
// With value[1] = P + 1: how many Recvs rank P posted for this rank's data reached the root
// (LockReply.pass), for the Send's free pass.
constexpr uint32_t kLockRecvs = 3;

// TCP messages, host byte order (both ends are npusim on hosts of one job).
constexpr uint32_t kJoinMagic = 0x4e50484a;   // "NPHJ"
constexpr uint32_t kFrameMagic = 0x4e504846;  // "NPHF"
constexpr uint32_t kLockMagic = 0x4e50484c;   // "NPHL": a one-shot lock report instead of a join

struct JoinMsg {
  uint32_t magic;
  uint32_t rank;
  uint32_t nranks;
  uint32_t reserved;
  uint64_t comm_id;
  int64_t timeout_ms;  // how long the root waits for the other ranks
  uint8_t secret[32];
};

// A JoinMsg with magic kLockMagic: `timeout_ms` carries the rank's issued count, `reserved` the
// kLock* flag. Answered with a LockReply, then the root closes the connection.
struct LockReply {
  int32_t code;      // HcclResult; HCCL_E_NOT_FOUND: no such communicator
  uint32_t settled;  // 1: every rank has reported
  uint64_t pass;     // the highest sequence number any rank issued (reported or seen in a frame);
                     // with HCCL_E_REMOTE: the rank that left without being locked
};

struct JoinReply {
  int32_t code;  // HcclResult; HCCL_E_NOT_FOUND: no such communicator (yet): retry until the deadline
  uint32_t reserved;
};

// One collective step of one rank; `bytes` of data follow.
struct Frame {
  uint32_t magic;
  uint32_t kind;  // Kind
  uint64_t seq;
  uint64_t count;
  uint32_t dtype, op, peer, reserved;
  uint64_t bytes;
};

// The root's answer to a Frame; `bytes` of result follow.
struct Result {
  int32_t code;  // HcclResult
  uint32_t reserved;
  uint64_t bytes;
};

}  // namespace npusim::hccl

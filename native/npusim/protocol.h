// Private wire protocol between libascendcl.so (the "driver") and npusimd.
//
// One Unix stream connection carries strictly alternating Request -> Reply pairs; a blocking
// request (a synchronize) blocks only its own connection, so the runtime keeps a pool of
// connections. The daemon ties every connection that sent Hello to one session per client pid
// (SO_PEERCRED); the session's allocations, streams and events live until its last connection
// closes. Status and Shutdown need no Hello (tools use them); Shutdown and the client list in Status
// are for the daemon's owner and root only.
#pragma once

#include <cstdint>

namespace npusim::proto {

constexpr uint32_t kMagic = 0x4e505332;  // "NPS2": bump when a struct below changes

enum class Op : uint32_t {
  Hello = 1,      // join/create the caller's session; reply: value[0]=daemon pid, [1]=devices, [2]=memory
  Status,         // reply payload: JSON (see npusim.h)
  Shutdown,       // ack, then the daemon exits
  Malloc,         // device, size -> addr
  MallocAt,       // device, addr, size: re-create an allocation at a given address (restore)
  Free,           // addr
  MemInfo,        // device -> value[0]=free, [1]=total
  Exec,           // run task now, on this connection (synchronous copies and memsets)
  StreamCreate,   // device -> value[0]=stream id
  StreamDestroy,  // stream, flags=1: force (drop queued work)
  Enqueue,        // stream, task
  StreamSync,     // stream: wait until everything queued so far has run
  DeviceSync,     // device: StreamSync on each of the session's streams on device
  Drain,          // timeout_ms: wait for all session streams; code ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT if not
  Release,        // free every allocation, stream and event of the session now (Backup, Finalize)
  EventCreate,    // value: initial completed count, timestamp -> value[0]=event id
  EventDestroy,   // event
  EventQuery,     // event -> value[0]=completed count, value[1]=timestamp of the last completion (ns)
  EventSync,      // event, target: wait until completed >= target
  // The direct path (export.h). Export, ExportDevices and Import need no Hello: a tool names the
  // client by pid in value[0] and must be root or the client's owner. The daemon never opens a
  // path: the tool opens the files with its own rights and sends them as descriptors (SCM_RIGHTS)
  // with the `size` bytes that follow the request. ExportDevices: reply payload "N N ...", the
  // devices the client holds memory on. Export: body "N N ..." (those devices), one fresh empty
  // file per device attached in that order. Import: body "NAME [SIZE CHECKSUM]" lines, one
  // opened file per line attached in that order. Reply payload: JSON.
  Export,
  Import,
  Quiesce,        // flags: 1 locked (restored), 2 locked awaiting an import, 0 unlocking
  ExportDevices,
};

enum class TaskKind : uint32_t {
  HostToDevice = 1,  // dst device, src host (client memory)
  DeviceToHost,      // dst host, src device
  DeviceToDevice,    // dst, src device; also the copy kernel
  Memset,            // dst device, size bytes of (uint8_t)value
  Fill,              // dst device, m float32 elements of alpha
  Axpy,              // dst=y, src=x, m elements: y = alpha*x + y
  Matmul,            // dst=C[m,n], src=A[m,k], src2=B[k,n]
  RecordEvent,       // event
  WaitEvent,         // event, target
  HostMemset,        // dst host (client memory), size bytes of (uint8_t)value: aclrtMemsetAsync on host memory
};

struct Task {
  TaskKind kind;
  uint32_t event;
  uint64_t dst;
  uint64_t src;
  uint64_t src2;
  uint64_t size;  // bytes for copies/memset
  uint64_t m, n, k;
  uint64_t target;
  float alpha;
  int32_t value;
};

struct Request {
  uint32_t magic;
  Op op;
  int32_t device;
  uint32_t stream;
  uint32_t event;
  uint32_t flags;
  uint64_t addr;
  uint64_t size;
  uint64_t value[2];
  int64_t timeout_ms;
  Task task;
};

struct Reply {
  int32_t code;          // aclError
  uint32_t payload_len;  // bytes following the reply
  uint64_t value[3];
};

// Op::Quiesce's flags: what the client's runtime tells the daemon about its own lock (export.h).
constexpr uint32_t kQuiesceUnlocking = 0;       // about to unlock
constexpr uint32_t kQuiesceLocked = 1;          // locked and drained (after a restore)
constexpr uint32_t kQuiesceAwaitingImport = 2;  // locked, allocations awaiting an import (external restore)

}  // namespace npusim::proto

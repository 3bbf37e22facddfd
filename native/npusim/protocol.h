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
  // cann-surface: stream failure mode and host callbacks.
  StreamFailureMode,  // stream, flags: 1 = ACL_STOP_ON_FAILURE (a failed task drops the work queued behind it)
  EventSignal,        // event: complete one record now (a host callback has run)
  StreamError,        // stream: flags 0 -> value[0] = the failure the next synchronize reports (kept);
                      // flags 1: set it to value[0] (a restored stream)
  // Device binaries and kernels (kernel_host.h; cann-kernels). Each reads `size` trailing bytes.
  BinaryLoad,      // trailing: the ELF bytes -> value[0]=binary id (the session's runner dlopens it)
  BinaryUnload,    // value[0]: binary id
  FunctionLookup,  // value[0]: binary id; trailing: kernel name -> value[0]=function id
  LaunchKernel,    // stream, task (Kernel); trailing: the argument bytes
  // Virtual memory, IPC memory and notify (vmm.cpp, ipc.cpp). A physical allocation is an ordinary
  // allocation (Malloc) at an address the application never sees; a mapping is an alias of part
  // of one, placed inside a reservation.
  Reserve,        // device, size, value[0]=alignment -> value[0]=addr (the upper half of the window)
  ReserveAt,      // device, addr, size: re-create a reservation at its address (restore)
  Unreserve,      // addr: a reservation with no mappings left
  Map,            // addr, size, value[0]=physical addr (flags 0) or shareable handle (flags 1), value[1]=offset
  Unmap,          // addr: a mapping
  ShareExport,    // addr=physical, flags: 1 no pid check, value[1]: the old handle (restore) or 0 -> value[0]=shareable handle
  ShareSetPids,   // value[0]=shareable handle, value[1]=a pid to whitelist (one request per pid)
  ShareImport,    // value[0]=shareable handle: the caller may map it from now on
  ShareRelease,   // value[0]=shareable handle: drop this session's export or import
  IpcExport,      // addr, size, flags: 1 no pid check, value[1]: the old number (restore) or 0 -> value[0]=key number
  IpcSetPids,     // value[0]=key number, value[1]=a pid to whitelist (one request per pid)
  IpcImport,      // value[0]=key number, value[1]: the old address (restore) or 0 -> value[0]=addr (a mapping), value[1]=size
  IpcClose,       // value[0]=key number, addr: an exporter withdraws the key; an importer unmaps addr
  NotifyCreate,   // value[0]: initially recorded (restore) -> value[0]=notify id
  NotifyDestroy,  // event=notify id, value[0]: its key number if it was imported (else 0)
  NotifyQuery,    // event=notify id -> value[0]=1 if recorded
  NotifyReset,    // event=notify id: clear now (aclrtNotifyBatchReset)
  NotifyExport,   // event=notify id, flags: 1 no pid check, value[1]: the old number (restore) or 0 -> value[0]=key number
  NotifySetPids,  // value[0]=key number, value[1]=a pid to whitelist (one request per pid)
  NotifyImport,   // value[0]=key number -> value[0]=notify id in the caller's session
  EventExport,    // event, value[1]: the old number (restore) or 0: an IPC event from now on -> value[0]=key number (any pid may open it)
  EventImport,    // value[0]=key number -> value[0]=event id in the caller's session, value[1]=completed
  ShareImporters, // flags: 0 any, 1 memory, 2 notify, 3 event -> value[0]=imports by other processes of what the caller shares, value[1]=one of their pids
  // hccl: communicators and collectives (hccl_wire.h has each request's fields; Reply.code is an
  // HcclResult). Each reads `size` trailing bytes.
  HcclRootInfo,     // a communicator this daemon is the root of
  HcclCommInit,     // join one (blocks until every rank joined or the connect timeout)
  HcclCommDestroy,
  HcclEnqueue,      // stream, task (HcclCollective)
  HcclCommInfo,     // the member's sequence numbers
  HcclLockQuery,    // a locking rank's report to the root: the free pass (snapshot of collectives)
  // cann-rest
  HostRegister,   // device, addr (0: any; else there: restore), size, value[0]: the caller's memfd (its fd number) -> value[0]=addr
  // cann-last
  StreamAbort,    // stream, flags: 0 stop (aclrtStreamStop), 1 abort (the next synchronize reports ACL_ERROR_RT_STREAM_ABORT)
  // lazy restore: a tool's question (like Export: value[0] the client's pid, no Hello) about the
  // lazy import of that client (lazy.h); value[1]: ms to wait for its end. Reply payload: JSON.
  LazyStatus,
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
  WaitEvent,         // event, target; m: timeout ms (0: forever; aclrtStreamWaitEventWithTimeout)
  HostMemset,        // dst host (client memory), size bytes of (uint8_t)value: aclrtMemsetAsync on host memory
  // cann-surface: built-in tasks.
  ValueWrite,        // dst device: the 8 bytes there become target
  ValueWait,         // dst device: the stream stalls until the 8 bytes there meet target by value (ACL_STREAM_WAIT_VALUE_*)
  Reduce,            // dst, src device, size bytes: dst[i] = dst[i] (m: aclrtReduceKind) src[i], elements of aclDataType n
  RandomNum,         // dst results, src the 16-byte counter, size numbers of aclDataType m, n: aclrtRandomNumFuncType,
                     // k and target: the two parameters' bytes (by value), src2: the seed
  // cann-kernels
  Kernel,            // src2: function id, m: numBlocks; arguments travel with LaunchKernel
  // Notify (cann-ipc-vmm)
  RecordNotify,      // event=notify id: set
  WaitNotify,        // event=notify id, target=timeout ms (0: forever): wait until set, then clear
  // hccl
  HcclCollective,    // one rank's step of a collective or Send/Recv (fields: hccl_wire.h)
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

// Op::MallocAt's flags: an import fills the allocation before Unlock (an external restore), so its
// pages are committed by the import, chunk by chunk and in parallel with its reads, not here.
constexpr uint32_t kMallocForImport = 1;

// Op::Export's flags: the tool fsyncs the files itself, later (npusnap's seal, overlapping CRIU's dump).
constexpr uint32_t kExportNoSync = 1;
// A live checkpoint (cow.h). kExportSnapshot: no files; the locked client's memory is snapshotted
// copy-on-write (value[1]: the most bytes of copies), and kept across the next Release as with
// "keep". kExportFromSnapshot: the files are written from that snapshot, the client locked or not
// (ExportDevices with it: the snapshot's devices); the snapshot ends with it. kExportDropSnapshot:
// it ends, nothing is written.
constexpr uint32_t kExportSnapshot = 2;
constexpr uint32_t kExportFromSnapshot = 4;
constexpr uint32_t kExportDropSnapshot = 8;

// cann-rest: StreamSync / DeviceSync / EventSync with this flag wait at most timeout_ms (>= 0) and
// fail with ACL_ERROR_RT_STREAM_SYNC_TIMEOUT / ACL_ERROR_RT_EVENT_SYNC_TIMEOUT; without it, forever.
constexpr uint32_t kSyncTimed = 1;

}  // namespace npusim::proto

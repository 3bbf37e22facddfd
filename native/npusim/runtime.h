// Internal state of the client runtime (libascendcl.so). Device memory, streams and events live
// in npusimd; this process holds only handles: device addresses, and stream/event objects whose
// daemon ids are re-mapped on restore, so the handles an application holds stay valid.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "acl/acl_rt.h"
#include "protocol.h"

namespace npusim::rt {

// A pool of connections to the daemon, all joined to this process's session: a thread blocked in
// a synchronize holds one connection while other threads keep working on others.
class ConnPool {
 public:
  int32_t open(const std::string &path);  // connects, says Hello, learns the daemon's shape
  void close_all();                       // every connection, idle or not yet returned
  bool connected();
  // body: trailing bytes sent after the request (rq.size of them, for the ops that take some).
  int32_t call(const proto::Request &rq, proto::Reply *rp = nullptr, const std::string *body = nullptr);

  pid_t daemon_pid = 0;
  uint32_t device_count = 0;
  uint64_t memory = 0;

 private:
  // fd, or -1 with *code (if given) saying why: a refusal by the daemon, or a daemon not trusted.
  int connect_one(proto::Reply *hello, int32_t *code = nullptr);

  std::mutex mu_;
  std::string path_;
  std::vector<int> idle_;
  bool open_ = false;
  uint64_t generation_ = 0;  // bumped by close_all: connections of an older generation are dropped
};

struct ContextObj;  // contexts.h

struct StreamObj {
  uint32_t id;
  int32_t device;
  bool is_default;
  ContextObj *ctx = nullptr;  // the context it belongs to (contexts.h)
  uint32_t flags = 0;         // ACL_STREAM_* (aclrtCreateStreamWithConfig)
  uint32_t priority = 0;
  uint64_t failure_mode = 0;  // ACL_CONTINUE_ON_FAILURE / ACL_STOP_ON_FAILURE
  int32_t public_id = -1;     // aclrtStreamGetId: stable across restores, unlike id
  uint32_t overflow_switch = 0;  // aclrtSetStreamOverflowSwitch
  int32_t pending_error = 0;     // saved by Backup: the failure the next synchronize reports
};

struct EventObj {
  uint32_t id;
  int32_t device;
  uint64_t records;       // records queued so far; a wait targets the latest
  uint64_t completed;     // saved by Backup
  uint64_t timestamp_ns;  // saved by Backup
  ContextObj *ctx = nullptr;  // the context it belongs to (contexts.h)
  uint32_t flags = 0;         // ACL_EVENT_* (aclrtCreateEventWithFlag)
  bool reset = false;         // aclrtResetEvent and no record since: not recorded, a wait waits for the next
};

// The completed count a wait queued now waits for: the latest record, or after a reset the next.
inline uint64_t wait_target(const EventObj *e) { return e->reset ? e->records + 1 : (e->records > 0 ? e->records : 1); }

struct Alloc {
  uint64_t size;
  int32_t device;
  void *backup = nullptr;  // host copy taken by Backup (private anonymous memory)
};

struct DeviceCtx {
  int refs = 0;
  StreamObj *default_stream = nullptr;
};

enum class State { Running, Locked, BackedUp };

struct Runtime {
  std::mutex mu;  // guards every field below
  bool initialized = false;
  uint64_t epoch = 0;  // bumped by each aclInit: what an earlier session left on the daemon is gone
  std::string socket_path;
  ConnPool pool;
  int32_t current_device = -1;  // process-wide; a thread's own aclrtSetDevice takes precedence
  std::map<uint64_t, Alloc> allocs;
  std::set<StreamObj *> streams;
  std::set<EventObj *> events;
  std::map<int32_t, DeviceCtx> devices;
  std::set<std::pair<int32_t, int32_t>> peers;  // (device, peer) enabled
  std::map<void *, size_t> host_allocs;

  // Snapshot state machine.
  std::condition_variable gate_cv;
  State state = State::Running;
  std::thread::id locker;
  int inflight = 0;  // device calls that passed the gate and have not returned
  bool hccl_recv_owed = false;  // while locking: a peer's HcclSend (HcclRecv) waits for this rank's Recv (Send)
  bool hccl_behind = false;  // while locking: a communicator is behind its free pass (hccl_snapshot.cpp)
  std::vector<std::pair<aclrtSnapShotCallBack, void *>> callbacks[ACL_RT_SNAPSHOT_UNLOCK_POST + 1];
};

Runtime &runtime();

// Every device call holds one: it waits while the process is locked (unless this thread locked
// it) and tells Lock that a call is in flight.
class CallScope {
 public:
  CallScope();
  // A collective on hccl_comm: while locking, admitted if it is within the communicator's free pass.
  explicit CallScope(const void *hccl_comm);
  // An HcclSend (send) or HcclRecv on hccl_comm with rank peer: while locking, admitted while that
  // peer's Recvs from (Sends to) this rank outnumber this rank's Sends to (Recvs from) it, or
  // within the collectives' free pass.
  CallScope(const void *hccl_comm, bool send, uint32_t peer);
  ~CallScope();
  CallScope(const CallScope &) = delete;
  CallScope &operator=(const CallScope &) = delete;
};

// The calling thread's device, or -1.
int32_t current_device();
// The calling thread's device, once the runtime is initialized and the device set (else the aclError).
aclError active_device(Runtime &r, int32_t *device);
void set_thread_device(int32_t device);
// Resolves a stream handle (NULL: the current device's default stream).
int32_t resolve_stream(aclrtStream stream, StreamObj **out);
// The same, with the failure noted as api's (stream_config.cpp).
aclError stream_for(aclrtStream stream, StreamObj **out, const char *api);
// True if device memory on a may be copied to/from b.
bool peer_ok(int32_t a, int32_t b);
// Sends task to run now (stream == nullptr) or queued on stream.
int32_t submit(const proto::Task &task, StreamObj *stream);
// Frees the daemon side of a device's resources (aclrtResetDevice).
void release_device(int32_t device);
// Snapshot internals (snapshot.cpp), called with no lock held.
int32_t device_restore();
void drop_backups();
// Lock with an explicit timeout (aclrtSnapShotProcessLock uses 60 s or NPUSIM_LOCK_TIMEOUT_MS).
int32_t snapshot_lock(int64_t timeout_ms);
// ACL_SUCCESS when aclInit ran and device is one of the daemon's, else the error, noted for api
// (sysinfo.cpp).
aclError device_known(int64_t device, const char *api);
// cann-kernel-host (ascendc_launch.cpp): writes out what printing kernels launched on stream left
// in their print buffers, for a stream destroyed before their host functions ran.
void flush_stream_prints(aclrtStream stream);
// cann-kernel-host (dump.cpp): aclInit's "dump" settings; a queued launch's arguments, written
// while aclopStartDumpArgs is on.
void load_dump_config(const char *configPath);
void dump_kernel_args(const std::string &kernel, uint32_t blocks, const std::string &args);
// Remembers why the calling thread's last call failed (aclGetRecentErrMsg reports it).
void note_error(const std::string &message);
// The same, and the code aclrtGetLastError / aclrtPeekAtLastError report; returns code.
aclError note_error(aclError code, const std::string &message);
const std::string &recent_error();
// Tells the aclrtSetExceptionInfoCallback callback (if any) that a task on a stream failed
// (stream_id: as aclrtStreamGetId reports it, -1 if never asked).
// task: the failed task's place on the stream (the daemon's StreamSync reply), 0 if unknown.
void report_task_exception(StreamObj *stream, uint64_t task, aclError code);
// cann-last (task_ids.cpp): a task queued on stream got its place there (its task id, what
// aclrtGetThreadLastTaskId reports to the queuing thread); a kernel launch names its function and
// argument bytes, kept for the exception info of a launch that fails.
void note_task(StreamObj *stream, uint64_t ordinal, void *function, const std::string *args);
struct FailedLaunch {
  void *function = nullptr;
  std::string args;
};
// The launch with that place on stream, if it was one of its last launches.
bool find_launch(StreamObj *stream, uint64_t ordinal, FailedLaunch *out);
void forget_tasks(StreamObj *stream);
// cann-last (stream_abort.cpp): the aclrtRegStreamStateCallback callbacks.
void notify_stream_state(aclrtStream stream, aclrtStreamState state);
// HCCL at Lock (hccl_snapshot.cpp): reports each communicator's issued count to its root and
// learns the free pass; *ready once no communicator is behind it and (unless alone) every rank is
// locking (else *waiting says what it waits for). Unlock or a failed lock ends it (withdraw:
// tell the roots; and when a peer of the attempt already left to re-form, re-form with it first:
// "The fate of a lock" in hccl_snapshot.cpp).
void hccl_lock_poll(bool *ready, std::string *waiting, std::string *refused);
void hccl_lock_end(bool withdraw);
// After the drain: whether every HcclSend to or from this rank was received (false, with what is
// unmatched in *waiting: the lock polls on, the Recv's free pass open, and drains again).
bool hccl_lock_mail(std::string *waiting);
// True if a collective on comm may pass the gate of a locked process (runtime().mu held).
bool hccl_admits(const void *comm);
// True if an HcclSend to / HcclRecv from peer on comm may pass the gate of a locked process
// (runtime().mu held).
bool hccl_admits_p2p(const void *comm, bool send, uint32_t peer);
// The communicators as a JSON array (runtime().mu held), for npusimSnapshotInfo.
std::string hccl_describe();
// Starts the by-pid control listener (ctl.cpp) once per process; called by aclInit.
void start_ctl();

}  // namespace npusim::rt

// The daemon's state: devices and their memory, client sessions, streams and events.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "protocol.h"

namespace npusim {

namespace kernels {
struct SessionKernels;
}
namespace lazy {
struct Fill;
}

// One device allocation: memory of the daemon (anonymous, or a memfd once its client uses kernels),
// known to clients only by its address.
struct Buffer {
  Buffer(uint64_t va, uint64_t size, uint32_t device, char *base, size_t mapped, int fd = -1);
  ~Buffer();
  Buffer(const Buffer &) = delete;
  Buffer &operator=(const Buffer &) = delete;

  const uint64_t va;
  const uint64_t size;  // rounded to va::kSizeGranule
  const uint32_t device;
  char *const base;
  const size_t mapped;  // 0 for an alias
  int fd;                 // the memfd behind base, or -1 (anonymous, or an alias): a kernel runner maps it (kernel_host.cpp)
  const uint64_t serial;  // unique per allocation for the daemon's lifetime
  // An alias (a VMM mapping or an IPC import) shows part of another buffer at its own address and
  // keeps that buffer alive; it owns no memory and counts against no device's capacity.
  std::shared_ptr<Buffer> backing;
  // Host memory a client lent (host_mem.cpp): the process's own pages, which CRIU carries, so the
  // direct path neither exports nor imports it (an import would undo host writes made since Lock).
  bool lent = false;
  // Per chunk of dirty::kChunk bytes, the epoch of its last write (dirty.cpp); null for an alias,
  // whose writes land in its backing buffer's chunks.
  std::unique_ptr<std::atomic<uint64_t>[]> gens;
  // Re-created for an import (kMallocForImport) and not yet committed: the import commits each
  // chunk (MADV_POPULATE_WRITE) as it fills it, and leaves its zero chunks as the kernel gives them.
  bool uncommitted = false;
  // A lazy restore's chunks still to come from the image (lazy.h); null when all is in. Set only
  // while its client is locked (an import), read by every task that touches the buffer.
  std::shared_ptr<lazy::Fill> lazy;
};

// A notify: a flag set by RecordNotify and cleared by the WaitNotify that sees it. Shared by the
// sessions that imported it (IPC notify), so it is atomic rather than under one session's mutex.
struct Notify {
  std::atomic<bool> set{false};
};

// A task with its device addresses resolved. It holds its buffers, so freeing an allocation while
// work on it is queued cannot pull memory from under a worker.
struct Work {
  proto::Task task{};
  pid_t pid = 0;  // the client, for process_vm_readv/writev
  char *dst = nullptr;
  const char *src = nullptr;
  const char *src2 = nullptr;
  std::vector<std::shared_ptr<Buffer>> hold;
  // What the task writes, stamped dirty when it ends (dirty::stamp_work): [dst, dst+out_len) of
  // out, or every held buffer (a kernel may write any memory it can reach).
  const Buffer *out = nullptr;
  uint64_t out_len = 0;
  bool writes_all = false;
  std::string body;                                   // a kernel's argument bytes
  std::shared_ptr<kernels::SessionKernels> kernels;  // a kernel's runner
  uint64_t ordinal = 0;  // its place on its stream (1, 2, ...): the task id the client reports
};

struct Stream {
  uint32_t id = 0;
  uint32_t device = 0;
  std::deque<Work> queue;
  uint64_t enqueued = 0;
  uint64_t done = 0;
  bool cancel = false;
  int32_t error = 0;  // first failure of an async task, reported by the next synchronize
  uint64_t error_task = 0;  // the ordinal of the task that failed with error
  bool stop_on_failure = false;  // ACL_STOP_ON_FAILURE: a failed task drops the rest of the queue
  std::thread worker;
};

// An IPC event's state, shared by the sessions of its exporter and openers; each touches it under
// its own session's mutex, hence atomics.
struct SharedEvent {
  std::atomic<uint64_t> completed{0};
  std::atomic<uint64_t> timestamp_ns{0};
};

struct Event {
  uint64_t completed = 0;
  uint64_t timestamp_ns = 0;
  std::shared_ptr<SharedEvent> ipc;  // once exported or opened, the state lives there

  uint64_t done() const { return ipc ? ipc->completed.load() : completed; }
  Event state() const { return ipc ? Event{ipc->completed.load(), ipc->timestamp_ns.load(), nullptr} : *this; }
  void complete(uint64_t now) {
    if (!ipc) {
      ++completed;
      timestamp_ns = now;
      return;
    }
    ipc->timestamp_ns = now;
    ++ipc->completed;
  }
};

// Everything one client process owns. mu/cv guard streams and events; allocations and windows are
// guarded by the daemon's mutex because they are checked against device capacity.
struct Session {
  pid_t pid = 0;
  int connections = 0;
  std::map<uint64_t, std::shared_ptr<Buffer>> allocs;  // by address
  std::map<uint32_t, int> windows;                     // device -> window

  std::mutex mu;
  std::condition_variable cv;  // any stream progress, event completion or cancellation
  std::map<uint32_t, std::shared_ptr<Stream>> streams;
  std::map<uint32_t, Event> events;
  uint32_t next_id = 1;
  std::shared_ptr<kernels::SessionKernels> kernels;  // binaries, functions, the kernel runner (kernel_host.h)
  bool shared_memory = false;  // allocations are memfds, for the kernel runner (the daemon's mutex guards it)
  std::map<uint32_t, std::shared_ptr<Notify>> notifies;  // own and imported (ipc.cpp), guarded by mu

  // Virtual memory (vmm.cpp), guarded by the daemon's mutex: reserved ranges (addr -> size) in the
  // upper half of the session's windows, and the shareable handles this session imported.
  std::map<uint64_t, uint64_t> reservations;
  std::map<uint64_t, std::shared_ptr<Buffer>> imports;

  // The direct path (export.cpp), guarded by mu: locked after a successful Drain or a Quiesce,
  // until the Quiesce of Unlock; export and import need it.
  bool locked = false;
  bool awaiting_import = false;  // restored externally: Unlock is refused until an import
  bool transferring = false;     // an export or import runs
  // Incremental exports (dirty.cpp): the export whose image the session's memory was last
  // imported from, and the epoch closed right after that import (chunks stamped no later still
  // hold that image's data).
  uint64_t base_id = 0;
  uint64_t base_epoch = 0;
  // A live checkpoint's restore (DeviceState::keep): MallocAt took back the memory kept across the
  // Release (adopted) and placed none anew (fresh), so the data is in place and no import is due.
  std::atomic<bool> adopted{false};
  std::atomic<bool> fresh{false};
  // Adopted memory an import ahead filled (DeviceState::keep_ahead): that import's export and
  // epoch, for took_back to make the session's base. Guarded by the daemon's mutex.
  uint64_t adopted_base_id = 0;
  uint64_t adopted_base_epoch = 0;
};

class DeviceState {
 public:
  DeviceState(uint32_t devices, uint64_t memory, std::string socket_path);

  uint32_t device_count() const { return static_cast<uint32_t>(used_.size()); }
  uint64_t memory() const { return memory_; }
  const std::string &socket_path() const { return socket_path_; }

  std::shared_ptr<Session> join(pid_t pid);
  void leave(const std::shared_ptr<Session> &s);
  // Drops every resource of the session now (runtime Backup/Finalize); the session stays joined.
  void release(Session &s);
  // A live checkpoint (export.cpp, after its export): the next Release of pid's session keeps its
  // allocations (still counted against the device), and the restore that follows takes them back
  // at the same addresses through MallocAt, with the data in place instead of imported. What the
  // restore does not take back is freed at its Quiesce, by an import, or once pid is gone.
  void keep(pid_t pid);
  // The restore's Quiesce (awaiting an import): true when all of the session's memory was taken
  // back; what is left kept is freed either way, and so is a keep() still waiting for a Release
  // (also called at Unlock).
  // *base_id/*base_epoch: when it was, and an import ahead filled it, that import's (else 0).
  bool took_back(Session &s, uint64_t *base_id = nullptr, uint64_t *base_epoch = nullptr);
  // A restore's import ahead (export.cpp): memory for an allocation of a process that has no
  // session yet (the one CRIU is restoring), uncommitted and counted against the device, filled
  // by the import; keep_ahead then keeps it for pid (started at start) as keep() would, for its
  // runtime's MallocAt to take back, and unstage gives back what a failed one made.
  int32_t stage(uint32_t device, uint64_t va, uint64_t size, std::shared_ptr<Buffer> *out);
  void unstage(const std::vector<std::shared_ptr<Buffer>> &bufs);
  void keep_ahead(pid_t pid, uint64_t start, const std::map<uint64_t, std::shared_ptr<Buffer>> &allocs,
                  uint64_t base_id, uint64_t base_epoch);

  // Memory a client lends the device (host registration, host_mem.cpp): its memfd, mapped here.
  struct Lent {
    char *base;
    size_t mapped;
    int fd;
  };
  // lent: the allocation is that memory (the buffer owns it from then on) instead of new memory.
  int32_t malloc(Session &s, uint32_t device, uint64_t size, uint64_t *va, const Lent *lent = nullptr);
  int32_t malloc_at(Session &s, uint32_t device, uint64_t va, uint64_t size, const Lent *lent = nullptr,
                    bool commit = true);
  int32_t free(Session &s, uint64_t va);
  int32_t mem_info(uint32_t device, uint64_t *free, uint64_t *total);
  // Resolves the task's device addresses against the session's allocations.
  int32_t resolve(Session &s, const proto::Task &task, uint32_t stream_device, bool on_stream, Work &w);

  std::string status_json(bool clients);  // clients: include the per-client list (admins only)

  // Kernels (kernel_host.cpp): from now on the session's device memory is memfds a kernel runner can
  // map; what it holds already moves into memfds at the same addresses.
  int32_t share_memory(Session &s);

  // The direct path (export.cpp): the session of a client pid (null if none), and its allocations
  // in address order.
  std::shared_ptr<Session> find(pid_t pid);
  // with_aliases: VMM mappings and IPC imports too (what a kernel may touch; kernel_host.cpp).
  std::vector<std::shared_ptr<Buffer>> buffers(Session &s, bool with_aliases = false);

  // Virtual memory (vmm.cpp). reserve: at == 0 picks a free range, else re-creates one there.
  int32_t reserve(Session &s, uint32_t device, uint64_t size, uint64_t align, uint64_t at, uint64_t *va);
  int32_t unreserve(Session &s, uint64_t va);
  // Shows [offset, offset+size) of phys at va, which must lie inside one reservation.
  int32_t map(Session &s, uint64_t va, uint64_t size, const std::shared_ptr<Buffer> &phys, uint64_t offset);
  int32_t unmap(Session &s, uint64_t va);
  // The allocation of s that starts at va (null if none); the buffer holding [va, va+len) and its offset.
  std::shared_ptr<Buffer> allocation_at(Session &s, uint64_t va);
  std::shared_ptr<Buffer> containing(Session &s, uint64_t va, uint64_t len, uint64_t *offset);
  // The virtual memory, IPC and notify ops (ipc.cpp), on a joined session.
  int32_t handle_vmm_ipc(Session &s, const proto::Request &rq, proto::Reply &rp);

 private:
  int32_t claim_window(Session &s, uint32_t device, int window);
  int32_t place(Session &s, uint32_t device, uint64_t va, uint64_t size, const Lent *lent, bool commit = true);
  // Anonymous device memory (under mu_): a freed allocation's of the same size, zeroed (*commit set),
  // or new (committed as *commit asks).
  char *anonymous_memory(uint64_t size, size_t *mapped, bool *commit);
  // Before new memory of size is mapped (under mu_): freed memory kept beyond the capacity goes.
  void make_room(uint64_t size);
  int32_t lookup(Session &s, uint64_t va, uint64_t len, std::shared_ptr<Buffer> *buf, char **ptr);
  void release_locked(Session &s);

  std::mutex mu_;
  const uint64_t memory_;
  const std::string socket_path_;
  std::vector<uint64_t> used_;                  // per device
  std::vector<std::vector<pid_t>> window_owner_;  // [device][window]
  std::map<pid_t, std::shared_ptr<Session>> sessions_;
  struct Kept {
    uint64_t start = 0;  // the process's start time (/proc/PID/stat): a reused pid takes nothing back
    std::map<uint64_t, std::shared_ptr<Buffer>> allocs;
    uint64_t base_id = 0, base_epoch = 0;  // filled by an import ahead: its export and epoch
  };
  std::map<pid_t, uint64_t> keeping_;  // keep(): pid -> its start time, until its Release
  std::map<pid_t, Kept> kept_;
  void drop_kept_locked(pid_t pid);
  void drop_gone_locked();
};

// Dirty tracking for incremental exports (dirty.cpp). Every write to device memory stamps the
// chunks it touched with the current epoch, after the write; an export closes the epoch it reads
// in, so a chunk stamped no later than a parent export's epoch is unchanged since that export.
// Nothing is ever cleared: a backup that is rolled back simply never becomes a parent.
namespace dirty {
constexpr uint64_t kChunk = 1ULL << 20;
uint64_t epoch();        // the epoch writes are stamped with now
uint64_t close_epoch();  // ends the current epoch and returns it
uint64_t boot_id();      // random per daemon run: epochs of another run mean nothing here
void init(Buffer &b);    // every chunk of a new allocation: written now
void stamp(const Buffer &b, const char *p, uint64_t len);  // b may be an alias
void stamp_work(const Work &w);
}  // namespace dirty

// Field 22 of /proc/PID/stat (the process's start time), 0 if it is gone: with the pid, it names
// one process. exited: a zombie, or gone.
uint64_t start_time(pid_t pid);
bool exited(pid_t pid);

// Executes one resolved task; returns an aclError.
int32_t run_work(Work &w);
// Held shared by every task touching device memory, exclusively while DeviceState::share_memory
// moves memory into memfds: no copy or kernel runs on memory being moved.
std::shared_mutex &memory_swap();

// Field n of /proc/PID/stat (4: the parent), 0 if the process is gone.
uint64_t stat_field(pid_t pid, int n);

// Serves one client connection until it closes (server.cpp). Returns true if the client asked the
// daemon to shut down.
bool serve_connection(DeviceState &state, int fd);

// Stream and event operations (streams.cpp).
namespace streams {
uint32_t create(Session &s, uint32_t device);
int32_t destroy(Session &s, uint32_t id, bool force);
// Drops the work queued on a stream that has not started (the running task finishes); the stream
// stays usable. report: the error its next synchronize reports (0: none).
int32_t abort(Session &s, uint32_t id, int32_t report);
bool device_of(Session &s, uint32_t id, uint32_t *device);
// ordinal: where the task's place on the stream is reported (its task id), may be null.
int32_t enqueue(Session &s, uint32_t id, Work &&w, uint64_t *ordinal = nullptr);
// timeout_ms < 0: wait for ever; else at most that long (ACL_ERROR_RT_STREAM_SYNC_TIMEOUT).
// failed_task: the ordinal of the task whose failure is reported (0: none), may be null.
int32_t sync(Session &s, uint32_t id, int64_t timeout_ms = -1, uint64_t *failed_task = nullptr);
int32_t sync_device(Session &s, uint32_t device, int64_t timeout_ms = -1);
int32_t drain(Session &s, int64_t timeout_ms);
void stop_all(Session &s);
uint32_t event_create(Session &s, uint64_t completed, uint64_t timestamp_ns);
int32_t event_destroy(Session &s, uint32_t id);
int32_t event_query(Session &s, uint32_t id, Event *out);
int32_t event_sync(Session &s, uint32_t id, uint64_t target, int64_t timeout_ms = -1);  // ACL_ERROR_RT_EVENT_SYNC_TIMEOUT
int32_t set_failure_mode(Session &s, uint32_t id, bool stop_on_failure);
int32_t event_signal(Session &s, uint32_t id);
// Reads (set false: into *out) or sets (to value) the failure a stream's next synchronize reports.
int32_t pending_error(Session &s, uint32_t id, bool set, uint64_t *out, uint64_t value);
}  // namespace streams

// Notify (notify.cpp), guarded by the session's mu.
namespace notify {
uint32_t create(Session &s, bool set);
uint32_t adopt(Session &s, std::shared_ptr<Notify> n);  // an imported notify
int32_t destroy(Session &s, uint32_t id);
std::shared_ptr<Notify> find(Session &s, uint32_t id);
}  // namespace notify

// Host registration (host_mem.cpp): the memfd the client holds its registered host memory in
// becomes an allocation of the session (Op::HostRegister), so copies and kernels reach that host
// memory in place.
namespace host_mem {
int32_t lend(DeviceState &state, Session &s, const proto::Request &rq, uint64_t *va);
}  // namespace host_mem

// IPC share tables (ipc.cpp): what a client exported ends with its session.
namespace ipc {
void forget(pid_t owner);
// An opened IPC event of importer is destroyed: its import ends.
void drop_event_import(pid_t importer, const std::shared_ptr<SharedEvent> &event);
}  // namespace ipc

}  // namespace npusim

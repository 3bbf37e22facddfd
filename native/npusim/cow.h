// Copy-on-write snapshots of a client's device memory (a live checkpoint, export.cpp): taken in
// microseconds while the client is locked, written out after it runs on. Until a chunk of the
// snapshot is written out, the first task that writes it (run_work: the same ranges the dirty
// tracking stamps, a kernel every buffer it holds) copies it aside first; the export reads each
// chunk from its copy, or straight from device memory when nothing wrote it. A copy is freed as soon
// as its chunk is written out, and the copies never exceed the snapshot's cap: a task that would go
// beyond it waits for the export to pass that chunk (and, with no export running, ends the snapshot
// instead: its export then fails, the workload never waits on a checkpoint that is not written).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_state.h"

namespace npusim::cow {

enum State : uint8_t { kLive = 0, kCopying = 1, kCopied = 2, kExporting = 3, kDone = 4 };

// One allocation of the snapshot.
struct Alloc {
  std::shared_ptr<Buffer> buf;
  std::vector<uint64_t> gens;  // its chunks' dirty stamps when the snapshot was taken
  std::unique_ptr<std::atomic<uint8_t>[]> state;
  std::vector<std::unique_ptr<char[]>> copy;  // per chunk, while kCopied
};

struct Snapshot {
  pid_t pid = 0;
  uint64_t start = 0;  // the process's start time: a reused pid is another process
  uint64_t id = 0;     // the export id of the images it becomes
  uint64_t epoch = 0;  // closed when it was taken: later writes count for the next export
  uint64_t base_id = 0, base_epoch = 0;  // the session's incremental base then
  uint64_t cap = 0;    // most bytes of copies at once
  std::map<uint32_t, std::vector<Alloc>> devices;  // address order

  std::mutex mu;
  std::condition_variable cv;  // a chunk changed state, or the snapshot ended
  uint64_t copied = 0;         // bytes of copies held now
  uint64_t copied_total = 0;   // bytes ever copied aside
  bool exporting = false;
  std::string lost;  // why it ended before being written out ("": it did not)
};

// Takes the snapshot of a locked, drained client (replacing an older one of pid).
std::shared_ptr<Snapshot> open(pid_t pid, std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> devices,
                               uint64_t id, uint64_t epoch, uint64_t base_id, uint64_t base_epoch, uint64_t cap);
// pid's snapshot, null if none; claim: mark it being exported (null if it already is).
std::shared_ptr<Snapshot> find(pid_t pid, bool claim);
// Ends pid's snapshot (written out, failed or dropped): its copies are freed, waiting tasks go on.
void drop(pid_t pid);
// Ends the snapshots of processes that ended (a client's connection closed, the daemon's status).
void drop_gone();
// How many snapshots exist (the daemon's status).
size_t count();

// Before a task writes (run_work, memory_swap held shared): what it writes is saved first.
void before_work(const Work &w);

// The export's side, for chunk c of a: the snapshot's bytes, kept stable until release(). Returns
// null once the snapshot was lost (the reason is in s.lost).
const char *acquire(Snapshot &s, Alloc &a, uint64_t c);
void release(Snapshot &s, Alloc &a, uint64_t c);
// A chunk the export needs no bytes of (referenced in the parent): done at once.
void skip(Snapshot &s, Alloc &a, uint64_t c);

}  // namespace npusim::cow

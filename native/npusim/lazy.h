// Lazy import (lazy.cpp): an import that returns before the data is in. The allocations get their
// chunks from the image files on first touch (any task: copies, kernels, collectives; an export
// or the move into memfds takes them all) and from one background thread, which walks the files
// in order and also recomputes each file's XXH3-128. Every chunk is checked against its XXH3-64
// before anything may read it; a chunk that fails is never handed over: every task touching it
// fails with ACL_ERROR_RT_DEVICE_MEM_ERROR, and the import's status reports it (Op::LazyStatus).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace npusim {

struct Buffer;
struct Work;

namespace lazy {

enum ChunkState : uint8_t { kPending = 0, kFilling = 1, kReady = 2, kBad = 3 };

// Where one chunk's bytes are.
struct Src {
  int fd = -1;  // the image (or the ancestor) that holds them; -1: a zero chunk
  uint64_t offset = 0;
  uint32_t length = 0;
  uint64_t hash = 0;
  const std::string *file = nullptr;  // its name, for messages
  uint64_t index = 0;                 // the chunk's number in that file's index
};

struct Import;

// The chunks of one allocation still to come (Buffer::lazy). Shared with the import's thread.
struct Fill {
  Fill(std::shared_ptr<Import> imp, char *base, uint64_t va, std::vector<Src> src);
  // Makes chunk c readable: loads it if nobody has, else waits for whoever does. ACL_SUCCESS or
  // ACL_ERROR_RT_DEVICE_MEM_ERROR (its bytes did not match their checksum, or could not be read).
  int32_t get(uint64_t c);

  const std::shared_ptr<Import> import;
  char *const base;
  const uint64_t va;
  const std::vector<Src> src;  // per chunk
  std::unique_ptr<std::atomic<uint8_t>[]> state;
  std::atomic<uint64_t> left;  // chunks not ready yet (bad ones never are): 0 is the fast path

  bool claim(uint64_t c);             // kPending -> kFilling
  bool load(uint64_t c, void *hash);  // a claimed chunk: read, check, mark; hash: an XXH3_state_t* or null
};

// One image file of a lazy import, for the background's whole-file hash.
struct File {
  std::string name;
  int fd = -1;
  std::string expected;  // its XXH3-128 (hex) from the caller, or empty
  std::string head;      // the header's bytes
  std::string tail;      // the index's and footer's bytes
  std::vector<std::shared_ptr<Fill>> fills;  // its allocations, in file order
};

// The state of one client's lazy import.
struct Import {
  pid_t pid = 0;
  std::vector<int> fds;  // the files and their ancestors (dup'ed): closed when the import ends
  std::deque<std::string> names;  // theirs (Src::file points here)
  std::vector<File> files;
  std::vector<std::shared_ptr<Buffer>> hold;  // the allocations, alive while the thread fills them

  std::mutex mu;
  std::condition_variable cv;  // a chunk got ready or bad; the thread ended
  uint64_t total = 0, ready = 0, bad = 0, bytes = 0;
  bool cancel = false, finished = false;
  std::vector<std::string> errors;  // the first few
  double seconds = 0;
  std::thread worker;
  std::mutex join_mu;

  ~Import();
  void done(bool ok, uint64_t bytes, const std::string &error);  // one chunk decided
  void report(const std::string &error);                          // recorded and logged
};

// Makes [p, p+len) of b (an alias: of its backing) readable. ACL_SUCCESS when nothing is lazy.
int32_t ensure(const Buffer &b, const char *p, uint64_t len);
// Every device range a task reads or writes (run_work, memory_swap held shared).
int32_t ensure_work(const Work &w);
// Every chunk of these buffers (an export, a move into memfds).
int32_t ensure_all(const std::vector<std::shared_ptr<Buffer>> &bufs);

// Starts the background fill of a prepared import (its Fills already on the buffers); a previous
// import of the same pid is cancelled first.
void start(std::shared_ptr<Import> imp);
// The client's session ends or drops its memory: stop its fill and close the files.
void cancel(pid_t pid);
// {"state": "none"|"filling"|"done"|"failed"|"cancelled" (the session ended first), "chunks", "ready", "bad", "bytes", "seconds", "errors"}; waits
// up to wait_ms for the fill to end (0: answer at once).
std::string status(pid_t pid, int64_t wait_ms);

}  // namespace lazy
}  // namespace npusim

// The direct path (see export.h for the file format): export and import of a locked client's
// device memory by the daemon itself.
//
// Export: one thread walks the chunks of a device in order, drops all-zero ones, feeds the file's
// XXH3-128, and hands each non-zero chunk to a small pool of writer threads that hash it (XXH3-64)
// and pwrite() it straight from device memory: the daemon's memory is the device memory, so there
// is no staging copy at all. At most kInFlight chunks are queued or being written, and the page
// cache is kept bounded too: every kWindow of file data starts its writeback
// (sync_file_range) and the window three back is waited for and dropped (FADV_DONTNEED), so a
// 100 GiB device costs about 3 windows of dirty cache, never its size. fsync before returning,
// unless the tool asked to do it itself (kExportNoSync: npusnap's seal, while CRIU dumps).
//
// Import: the index is read and checked against the client's allocations (restored at the same
// addresses by an external Restore), then reader threads pread() each chunk straight into device
// memory and check its XXH3-64 while the walking thread feeds the whole file's XXH3-128 in order,
// and compares it with the expected checksum when the caller gave one. A mismatch stops the import
// with a clear error; the client then stays LOCKED with its import pending (Unlock is refused), so
// a half-imported device never runs.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "export.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "acl/acl_base.h"
#include "acl/acl_rt.h"
#include "cow.h"
#include "lazy.h"
#include "wire.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (as in device_state.cpp)
#endif

namespace npusim {

// DeviceState's part of the direct path (declared in device_state.h).
std::shared_ptr<Session> DeviceState::find(pid_t pid) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = sessions_.find(pid);
  return it == sessions_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<Buffer>> DeviceState::buffers(Session &s, bool with_aliases) {
  std::lock_guard<std::mutex> g(mu_);
  std::vector<std::shared_ptr<Buffer>> out;
  out.reserve(s.allocs.size());
  for (auto &[va, b] : s.allocs)
    if (with_aliases || !b->backing) out.push_back(b);  // a mapping's data is its physical allocation's
  return out;
}

namespace xfer {

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

std::string json_string(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char b[8];
      std::snprintf(b, sizeof(b), "\\u%04x", c);
      out += b;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {

constexpr int kThreads = 3;           // writers / readers
constexpr size_t kInFlight = 8;       // chunks queued or in transfer
constexpr uint64_t kWindow = 32ULL << 20;
constexpr size_t kMaxRequest = 64 << 10;
constexpr uint64_t kMaxIndex = 1ULL << 30;
constexpr int kAheadNice = 5;  // an import ahead's threads, below CRIU's restore

// An import ahead shares the CPUs with CRIU's restore of the same process, the longer of the two:
// while CRIU restores it (the process is CRIU's child), the import's threads run at kAheadNice,
// and each takes back its priority once CRIU is done (the process has another parent: us). On
// a busy machine that keeps CRIU's restore from waiting for the import, and the import from
// waiting for others once it alone holds up the restore. Each thread polls (at most every
// kPollNs) and sets its own priority (raising it back needs CAP_SYS_NICE: a daemon of a user
// keeps its import ahead's threads niced to the end).
class Yield {
 public:
  static constexpr int64_t kPollNs = 5'000'000;
  explicit Yield(pid_t pid) : pid_(pid), parent_(stat_field(pid, 4)) {
    over_ = parent_ == 0;
    poll();
  }
  // Per chunk, on each thread of the import.
  void poll() {
    if (niced() != this && !over_.load(std::memory_order_relaxed)) {
      errno = 0;
      const int was = ::getpriority(PRIO_PROCESS, tid());
      if (errno != 0) return;
      before() = was;
      set(std::min(19, was + kAheadNice));
      niced() = this;
    }
    if (niced() != this) return;
    const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
    int64_t last = last_.load(std::memory_order_relaxed);
    if (!over_.load(std::memory_order_relaxed) && now - last >= kPollNs && last_.compare_exchange_strong(last, now) &&
        stat_field(pid_, 4) != parent_)
      over_ = true;
    if (over_.load(std::memory_order_relaxed)) back();
  }
  ~Yield() {
    if (niced() == this) back();  // the connection's thread serves on at its own priority
  }

 private:
  static const Yield *&niced() {  // the Yield this thread's priority follows
    thread_local const Yield *y = nullptr;
    return y;
  }
  static int &before() {  // this thread's own priority, to go back to
    thread_local int nice = 0;
    return nice;
  }
  static void back() {
    set(before());
    niced() = nullptr;
  }
  static id_t tid() { return static_cast<id_t>(::syscall(SYS_gettid)); }
  static void set(int nice) { ::setpriority(PRIO_PROCESS, tid(), nice); }
  const pid_t pid_;
  const uint64_t parent_;
  std::atomic<bool> over_{false};
  std::atomic<int64_t> last_{0};
};

struct Failure {
  int32_t code;
  int err;  // errno, 0 if not an OS error
  std::string msg;
};

[[noreturn]] void fail(int32_t code, int err, std::string msg) { throw Failure{code, err, std::move(msg)}; }



std::string digest_hex(XXH3_state_t *st) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, XXH3_128bits_digest(st));  // big-endian: Python's hexdigest()
  std::string out;
  char b[3];
  for (unsigned char byte : c.digest) {
    std::snprintf(b, sizeof(b), "%02x", byte);
    out += b;
  }
  return out;
}

struct Hasher {
  Hasher() : st(XXH3_createState()) {
    if (st == nullptr) fail(ACL_ERROR_BAD_ALLOC, ENOMEM, "out of memory");
    XXH3_128bits_reset(st);
  }
  ~Hasher() { XXH3_freeState(st); }
  void update(const void *p, size_t n) { XXH3_128bits_update(st, p, n); }
  std::string hex() { return digest_hex(st); }
  XXH3_state_t *st;
};

bool all_zero(const char *p, size_t n) {
  const auto *w = reinterpret_cast<const uint64_t *>(p);
  const size_t words = n / 8;
  for (size_t i = 0; i < words; i += 512) {  // 4 KiB at a time: non-zero data exits at once
    uint64_t acc = 0;
    const size_t end = std::min(words, i + 512);
    for (size_t j = i; j < end; ++j) acc |= w[j];
    if (acc != 0) return false;
  }
  for (size_t i = words * 8; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// A few threads running transfer jobs, at most `limit` of them queued or running. The first
// failure is kept; later jobs are skipped and check() rethrows it.
class Pool {
 public:
  Pool(int threads, size_t limit) : limit_(limit) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto &t : threads_) t.join();
  }
  size_t submit(std::function<void()> f) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return pending_ < limit_; });
    const size_t id = done_.size();
    done_.push_back(false);
    queue_.emplace_back(id, std::move(f));
    ++pending_;
    cv_.notify_all();
    return id;
  }
  void wait(size_t id) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return static_cast<bool>(done_[id]); });
  }
  void wait_all() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return pending_ == 0; });
  }
  bool failed() {
    std::lock_guard<std::mutex> g(mu_);
    return error_.has_value();
  }
  void check() {
    std::lock_guard<std::mutex> g(mu_);
    if (error_) throw *error_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto [id, f] = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = error_.has_value();
      l.unlock();
      std::optional<Failure> err;
      if (!skip) {
        try {
          f();
        } catch (const Failure &e) {
          err = e;
        }
      }
      l.lock();
      if (err && !error_) error_ = std::move(err);
      done_[id] = true;
      --pending_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, std::function<void()>>> queue_;
  std::vector<bool> done_;
  std::vector<std::thread> threads_;
  std::optional<Failure> error_;
  size_t pending_ = 0;
  const size_t limit_;
  bool stop_ = false;
};

void pwrite_all(int fd, const char *p, size_t n, uint64_t off, const std::string &name) {
  while (n > 0) {
    ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = w < 0 ? errno : ENOSPC;  // a zero-length write: the file system is full
      fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, e, "writing " + name + ": " + std::strerror(e));
    }
    p += w;
    n -= static_cast<size_t>(w);
    off += static_cast<uint64_t>(w);
  }
}

void pread_all(int fd, char *p, size_t n, uint64_t off, const std::string &name) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(ACL_ERROR_SNAPSHOT_RESTORE_FAILED, errno, "reading " + name + ": " + std::strerror(errno));
    if (r == 0) fail(ACL_ERROR_INVALID_FILE, 0, name + " is truncated");
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
}

// The peer must be root or own the client (its memory is about to be written out or replaced).
void check_peer(int fd, pid_t pid) {
  uid_t uid = 0;
  if (!wire::peer_cred(fd, nullptr, &uid, nullptr)) fail(ACL_ERROR_INVALID_PARAM, EPERM, "cannot identify the caller");
  if (uid == 0) return;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream in(line.substr(4));
      unsigned real = 0;
      in >> real;
      if (real == uid) return;
      break;
    }
  }
  fail(ACL_ERROR_INVALID_PARAM, EPERM, "permission denied: only root or the owner of process " +
                                           std::to_string(pid) + " may move its device memory");
}

// Marks the session busy for the transfer's duration; the client must be locked and idle.
class Transfer {
 public:
  Transfer(DeviceState &state, pid_t pid, bool import) : import_(import) {
    const int32_t refuse = import ? ACL_ERROR_SNAPSHOT_RESTORE_FAILED : ACL_ERROR_SNAPSHOT_BACKUP_FAILED;
    s_ = state.find(pid);
    const std::string who = "client " + std::to_string(pid);
    if (!s_)
      fail(refuse, 0, "no npusim client with pid " + std::to_string(pid) + " is connected to this daemon" +
                          (import ? " (restore its allocations first: restore external)" : ""));
    std::lock_guard<std::mutex> g(s_->mu);
    if (!s_->locked)
      fail(refuse, 0, who + " is not locked: lock it first (aclrtSnapShotProcessLock) so that its device memory "
                            "cannot change during the " + (import ? "import" : "export"));
    for (auto &[id, st] : s_->streams)
      if (st->done != st->enqueued) fail(refuse, 0, who + " still has device work queued on stream " + std::to_string(id));
    if (s_->transferring) fail(refuse, EBUSY, "an export or import of " + who + " is already running");
    s_->transferring = true;
  }
  ~Transfer() {
    std::lock_guard<std::mutex> g(s_->mu);
    s_->transferring = false;
  }
  void imported() {
    std::lock_guard<std::mutex> g(s_->mu);
    s_->awaiting_import = false;
  }
  bool awaiting_import() {
    std::lock_guard<std::mutex> g(s_->mu);
    return s_->awaiting_import;
  }
  Session &session() { return *s_; }

 private:
  std::shared_ptr<Session> s_;
  bool import_;
};

struct Totals {
  uint64_t allocations = 0, bytes = 0, nonzero = 0, file_bytes = 0;
  uint64_t referenced = 0;  // bytes of chunks an incremental export referenced in its chain
};

// A device image's header, footer and index, checked for consistency (not its data).
struct Image {
  FileHeader hdr{};
  Footer ft{};
  std::string index;
  std::vector<AllocRec> recs;
  std::vector<ChunkRec> chunks;
  uint64_t size = 0;
};

Image read_image(int fd, const std::string &path) {
  const int32_t bad = ACL_ERROR_INVALID_FILE;
  Image im;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(bad, 0, path + " is not a regular file");
  im.size = static_cast<uint64_t>(st.st_size);
  if (im.size < sizeof(FileHeader) + sizeof(Footer)) fail(bad, 0, path + " is too short to be a device image");
  FileHeader &hdr = im.hdr;
  Footer &ft = im.ft;
  pread_all(fd, reinterpret_cast<char *>(&hdr), sizeof(hdr), 0, path);
  pread_all(fd, reinterpret_cast<char *>(&ft), sizeof(ft), im.size - sizeof(ft), path);
  if (std::memcmp(hdr.magic, kHeaderMagic, 8) != 0 || std::memcmp(ft.magic, kFooterMagic, 8) != 0)
    fail(bad, 0, path + " is not an npusim device image (bad magic)");
  if (hdr.version < 1 || hdr.version > kFormatVersion || ft.version != hdr.version)
    fail(bad, 0, path + ": unsupported device image version " + std::to_string(hdr.version));
  if (hdr.chunk_size != kChunk || ft.chunk_size != kChunk || ft.device != hdr.device || ft.file_size != im.size ||
      ft.index_offset != sizeof(hdr) + ft.data_bytes || ft.index_len > kMaxIndex ||
      ft.index_offset + ft.index_len + sizeof(ft) != im.size ||
      ft.index_len != ft.n_allocs * sizeof(AllocRec) + ft.n_chunks * sizeof(ChunkRec))
    fail(bad, 0, path + ": inconsistent footer (truncated or altered)");
  im.index.assign(ft.index_len, '\0');
  pread_all(fd, im.index.data(), im.index.size(), ft.index_offset, path);
  if (XXH3_64bits(im.index.data(), im.index.size()) != ft.index_hash) fail(bad, 0, path + ": checksum mismatch in the index");
  im.recs.resize(ft.n_allocs);
  im.chunks.resize(ft.n_chunks);
  std::memcpy(im.recs.data(), im.index.data(), im.recs.size() * sizeof(AllocRec));
  std::memcpy(im.chunks.data(), im.index.data() + im.recs.size() * sizeof(AllocRec), im.chunks.size() * sizeof(ChunkRec));
  uint64_t expect_chunk = 0;
  for (auto &a : im.recs) {
    if (a.first_chunk != expect_chunk || a.nchunks != (a.size + kChunk - 1) / kChunk || a.first_chunk + a.nchunks > im.chunks.size())
      fail(bad, 0, path + ": inconsistent index");
    for (uint64_t c = 0; c < a.nchunks; ++c) {
      const ChunkRec &r = im.chunks[a.first_chunk + c];
      if (r.length != std::min(kChunk, a.size - c * kChunk)) fail(bad, 0, path + ": inconsistent index");
      const bool ref = (r.flags & kChunkRef) != 0;
      if (ref && (hdr.version < 2 || (r.flags & kChunkZero) || ref_depth(r.flags) < 1 || ref_depth(r.flags) > kMaxDepth))
        fail(bad, 0, path + ": inconsistent index");
    }
    expect_chunk += a.nchunks;
  }
  if (expect_chunk != im.chunks.size()) fail(bad, 0, path + ": inconsistent index");
  return im;
}

// What an incremental export may take from its parent's image: the parent's index, and the
// epoch up to which a chunk's stamp means "as in the parent".
struct Parent {
  Image image;
  uint64_t threshold = 0;
  bool usable = false;  // false: another daemon run or lineage; every chunk is written
  std::map<uint64_t, const AllocRec *> by_va;
};

struct FileResult {
  std::string name;
  uint64_t size;
  std::string checksum;
};

// The descriptors a tool sent with its request: the files it opened with its own rights.
struct Fds {
  std::vector<int> fds;
  ~Fds() {
    for (int fd : fds) ::close(fd);
  }
};

// The one-line JSON a transfer returns: its files (name, size, xxh3_128) and totals.
std::string transfer_json(const std::vector<FileResult> &files, const Totals &tot, const char *bytes_key,
                          std::chrono::steady_clock::time_point t0) {
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ostringstream o;
  o << "{\"files\": [";
  for (size_t i = 0; i < files.size(); ++i)
    o << (i ? ", " : "") << "{\"path\": " << json_string(files[i].name) << ", \"size\": " << files[i].size
      << ", \"checksum\": " << json_string(files[i].checksum) << "}";
  o << "], \"allocations\": " << tot.allocations << ", \"bytes\": " << tot.bytes << ", \"nonzero_bytes\": " << tot.nonzero
    << ", \"referenced_bytes\": " << tot.referenced << ", \"" << bytes_key << "\": " << tot.file_bytes
    << ", \"seconds\": " << secs << "}";
  return o.str();
}

// ------------------------------------------------------------------------------------ export

// Writes into fd, a fresh empty file the tool created (O_EXCL) and sent.
// Where an export reads each chunk: device memory itself (the client is locked), or a live
// checkpoint's snapshot (cow.h) while the client runs on; the bytes stay put until put().
class Source {
 public:
  explicit Source(const std::vector<std::shared_ptr<Buffer>> &bufs) : bufs_(bufs) {}
  Source(const std::vector<std::shared_ptr<Buffer>> &bufs, cow::Snapshot &snap, std::vector<cow::Alloc> &allocs)
      : bufs_(bufs), snap_(&snap), allocs_(&allocs) {}
  size_t size() const { return bufs_.size(); }
  const Buffer &buf(size_t a) const { return *bufs_[a]; }
  bool tracked(size_t a) const { return snap_ ? !(*allocs_)[a].gens.empty() : static_cast<bool>(bufs_[a]->gens); }
  uint64_t gen(size_t a, uint64_t c) const {
    return snap_ ? (*allocs_)[a].gens[c] : bufs_[a]->gens[c].load(std::memory_order_acquire);
  }
  const char *get(size_t a, uint64_t c) const {
    if (!snap_) return bufs_[a]->base + c * kChunk;
    const char *p = cow::acquire(*snap_, (*allocs_)[a], c);
    if (p == nullptr) fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, 0, "the live snapshot ended: " + snap_->lost);
    return p;
  }
  void put(size_t a, uint64_t c) const {
    if (snap_) cow::release(*snap_, (*allocs_)[a], c);
  }
  void skip(size_t a, uint64_t c) const {
    if (snap_) cow::skip(*snap_, (*allocs_)[a], c);
  }

 private:
  const std::vector<std::shared_ptr<Buffer>> &bufs_;
  cow::Snapshot *snap_ = nullptr;
  std::vector<cow::Alloc> *allocs_ = nullptr;
};

FileResult export_device(int fd, uint32_t device, const Source &src, const FileHeader &meta,
                         const Parent *parent, bool sync, Totals &tot) {
  const std::string name = "dev" + std::to_string(device) + ".img";
  const std::string &path = name;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0)
    fail(ACL_ERROR_INVALID_PARAM, EINVAL, "the file sent for " + name + " is not a fresh empty regular file");
  try {
    std::vector<AllocRec> allocs;
    std::vector<ChunkRec> chunks;
    for (size_t a = 0; a < src.size(); ++a) {
      const Buffer &b = src.buf(a);
      const uint64_t n = (b.size + kChunk - 1) / kChunk;
      allocs.push_back({b.va, b.size, chunks.size(), n});
      chunks.resize(chunks.size() + n);
    }
    Hasher h;
    FileHeader hdr{};
    std::memcpy(hdr.magic, kHeaderMagic, 8);
    hdr.version = kFormatVersion;
    hdr.device = device;
    hdr.chunk_size = kChunk;
    hdr.boot = meta.boot;
    hdr.epoch = meta.epoch;
    hdr.pid = meta.pid;
    hdr.export_id = meta.export_id;
    pwrite_all(fd, reinterpret_cast<const char *>(&hdr), sizeof(hdr), 0, path);
    h.update(&hdr, sizeof(hdr));

    uint64_t cur = sizeof(hdr);
    uint64_t next_window = kWindow;
    {
      Pool pool(kThreads, kInFlight);
      for (size_t a = 0; a < src.size() && !pool.failed(); ++a) {
        const Buffer &b = src.buf(a);
        tot.allocations++;
        tot.bytes += b.size;
        const AllocRec *was = nullptr;  // the same allocation in the parent's image
        if (parent != nullptr && parent->usable && src.tracked(a)) {
          auto it = parent->by_va.find(b.va);
          if (it != parent->by_va.end() && it->second->size == b.size) was = it->second;
        }
        for (uint64_t c = 0; c < allocs[a].nchunks && !pool.failed(); ++c) {
          const uint32_t len = static_cast<uint32_t>(std::min(kChunk, b.size - c * kChunk));
          ChunkRec &rec = chunks[allocs[a].first_chunk + c];
          rec.length = len;
          if (was != nullptr && src.gen(a, c) <= parent->threshold) {
            // Unchanged since the parent's export: as there (zero), or a reference one link further.
            const ChunkRec &pr = parent->image.chunks[was->first_chunk + c];
            const uint32_t depth = (pr.flags & kChunkRef) ? ref_depth(pr.flags) + 1 : 1;
            if (pr.flags & kChunkZero) {
              rec.flags = kChunkZero;
              src.skip(a, c);
              continue;
            }
            if (depth <= kMaxDepth) {
              rec.offset = pr.offset;
              rec.flags = kChunkRef | (depth << 8);
              rec.hash = pr.hash;
              tot.referenced += len;
              src.skip(a, c);
              continue;
            }
          }
          const char *p = src.get(a, c);
          if (all_zero(p, len)) {
            rec.flags = kChunkZero;
            src.put(a, c);
            continue;
          }
          rec.offset = cur;
          h.update(p, len);
          const uint64_t off = cur;
          cur += len;
          tot.nonzero += len;
          pool.submit([fd, p, len, off, &rec, &path, &src, a, c] {
            struct Put {  // the chunk's bytes are free to change again, written or not
              const Source &src;
              size_t a;
              uint64_t c;
              ~Put() { src.put(a, c); }
            } put{src, a, c};
            rec.hash = XXH3_64bits(p, len);
            pwrite_all(fd, p, len, off, path);
          });
          // Keep the page cache bounded: start writing back the last window, and wait for and
          // drop the one three back (its writes have long completed: at most kInFlight pend).
          while (cur >= next_window) {
            const uint64_t k = next_window / kWindow;
            ::sync_file_range(fd, static_cast<off_t>((k - 1) * kWindow), kWindow, SYNC_FILE_RANGE_WRITE);
            if (k >= 3) {
              const off_t old = static_cast<off_t>((k - 3) * kWindow);
              ::sync_file_range(fd, old, kWindow,
                                SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
              ::posix_fadvise(fd, old, kWindow, POSIX_FADV_DONTNEED);
            }
            next_window += kWindow;
          }
        }
      }
      pool.wait_all();
      pool.check();
    }
    // The index and the footer, then everything to stable storage.
    std::string index(allocs.size() * sizeof(AllocRec) + chunks.size() * sizeof(ChunkRec), '\0');
    std::memcpy(index.data(), allocs.data(), allocs.size() * sizeof(AllocRec));
    std::memcpy(index.data() + allocs.size() * sizeof(AllocRec), chunks.data(), chunks.size() * sizeof(ChunkRec));
    Footer ft{};
    std::memcpy(ft.magic, kFooterMagic, 8);
    ft.version = kFormatVersion;
    ft.device = device;
    ft.chunk_size = kChunk;
    ft.n_allocs = allocs.size();
    ft.n_chunks = chunks.size();
    ft.index_offset = cur;
    ft.index_len = index.size();
    ft.index_hash = XXH3_64bits(index.data(), index.size());
    ft.data_bytes = cur - sizeof(hdr);
    ft.file_size = cur + index.size() + sizeof(ft);
    pwrite_all(fd, index.data(), index.size(), cur, path);
    h.update(index.data(), index.size());
    pwrite_all(fd, reinterpret_cast<const char *>(&ft), sizeof(ft), cur + index.size(), path);
    h.update(&ft, sizeof(ft));
    if (sync) {
      if (::fsync(fd) != 0)
        fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, errno, "flushing " + path + ": " + std::strerror(errno));
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);  // written: no reason to keep it cached
    } else {
      // The tool fsyncs it later (kExportNoSync): the disk writes the rest meanwhile.
      ::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    }
    tot.file_bytes += ft.file_size;
    return {name, ft.file_size, h.hex()};
  } catch (...) {
    [[maybe_unused]] int rc = ::ftruncate(fd, 0);  // nothing half-written stays readable; the tool unlinks
    throw;
  }
}

// The devices a client holds memory on, in order (what a tool creates files for).
std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> by_device(DeviceState &state, Session &s) {
  std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> out;
  for (auto &b : state.buffers(s))
    if (!b->lent) out[b->device].push_back(b);  // address order; lent host memory is the process's
  return out;
}

std::string device_list(const std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> &devs) {
  std::string out;
  for (auto &[device, bufs] : devs) out += (out.empty() ? "" : " ") + std::to_string(device);
  return out;
}

// A live checkpoint's snapshot of pid (cow.h): its buffers by device, as an export walks them.
std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> by_device(cow::Snapshot &snap) {
  std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> out;
  for (auto &[device, allocs] : snap.devices)
    for (auto &a : allocs) out[device].push_back(a.buf);
  return out;
}

std::string do_export_devices(DeviceState &state, pid_t pid, uint32_t flags) {
  if (flags & proto::kExportFromSnapshot) {
    auto snap = cow::find(pid, false);
    if (!snap) fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, 0, "client " + std::to_string(pid) + " has no live snapshot");
    return device_list(by_device(*snap));
  }
  Transfer tr(state, pid, false);
  return device_list(by_device(state, tr.session()));
}

// body: the client's devices ("N N ..."), then for an incremental export "\nparent N N ...": the
// devices whose parent image follows the new files among the descriptors. flags: kExportSnapshot
// (no files: a copy-on-write snapshot, at most cap bytes of copies), kExportFromSnapshot (written
// from it), kExportDropSnapshot (cow.h).
std::string do_export(DeviceState &state, pid_t pid, const std::string &body, const std::vector<int> &fds,
                      uint32_t flags, uint64_t cap) {
  const auto t0 = std::chrono::steady_clock::now();
  if (flags & proto::kExportDropSnapshot) {
    cow::drop(pid);
    return "{\"files\": []}";
  }
  std::optional<Transfer> tr;
  std::shared_ptr<cow::Snapshot> snap;
  std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> devs;
  struct Drop {  // a snapshot is written out once: it ends with this export, whatever its outcome
    pid_t pid;
    bool armed;
    ~Drop() {
      if (armed) cow::drop(pid);
    }
  } drop{pid, (flags & proto::kExportFromSnapshot) != 0};
  if (flags & proto::kExportFromSnapshot) {
    snap = cow::find(pid, true);
    if (!snap) {
      drop.armed = false;  // another export of it runs, or there is none: leave it be
      fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, 0, "client " + std::to_string(pid) +
                                                    " has no live snapshot to write out, or it is being written");
    }
    devs = by_device(*snap);
  } else {
    tr.emplace(state, pid, false);
    // A lazily imported memory still filling: everything in (and checked) before it is written out.
    std::shared_lock<std::shared_mutex> use(memory_swap());
    if (lazy::ensure_all(state.buffers(tr->session())) != ACL_SUCCESS)
      fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, 0, "client " + std::to_string(pid) + "'s device memory holds chunks of "
           "a lazy restore that failed their checksum: it cannot be checkpointed (see the daemon's log)");
    devs = by_device(state, tr->session());
  }
  const size_t nl = body.find('\n');
  const std::string devices = body.substr(0, nl);
  std::vector<uint32_t> parent_devs;
  bool keep = false;  // "keep": a live checkpoint's, DeviceState::keep
  if (nl != std::string::npos) {
    std::istringstream in(body.substr(nl + 1));
    bool in_parent = false;
    for (std::string word; in >> word;) {
      if (word == "keep") {
        keep = true;
        in_parent = false;
      } else if (word == "parent") {
        in_parent = true;
      } else if (in_parent && !word.empty() && word.size() < 10 &&
                 word.find_first_not_of("0123456789") == std::string::npos) {
        parent_devs.push_back(static_cast<uint32_t>(std::strtoul(word.c_str(), nullptr, 10)));
      } else {
        fail(ACL_ERROR_INVALID_PARAM, EINVAL, "malformed export request");
      }
    }
  }
  const bool snapshot = (flags & proto::kExportSnapshot) != 0;
  const size_t nfiles = snapshot ? 0 : devs.size();
  if (devices != device_list(devs) || fds.size() != nfiles + parent_devs.size() || (snapshot && !parent_devs.empty()))
    fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, EINVAL,
         "the files sent do not match the client's devices (" + device_list(devs) + "): ask again (ExportDevices)");
  FileHeader meta{};
  meta.boot = dirty::boot_id();
  meta.pid = static_cast<uint64_t>(pid);
  uint64_t base_id, base_epoch;
  if (snap) {  // the images of the memory as it was when the snapshot was taken
    meta.epoch = snap->epoch;
    meta.export_id = snap->id;
    base_id = snap->base_id;
    base_epoch = snap->base_epoch;
  } else {
    meta.epoch = dirty::close_epoch();  // writes from now on count for the next export
    std::random_device rd;
    meta.export_id = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;  // never 0: "none"
    Session &s = tr->session();
    std::lock_guard<std::mutex> g(s.mu);
    base_id = s.base_id;
    base_epoch = s.base_epoch;
  }
  Totals tot;
  if (snapshot) {
    for (auto &[device, bufs] : devs)
      for (auto &b : bufs) {
        tot.allocations++;
        tot.bytes += b->size;
      }
    cow::open(pid, devs, meta.export_id, meta.epoch, base_id, base_epoch, cap);
    state.keep(pid);  // the resume takes the memory back in place, as after a kept export
    std::string out = transfer_json({}, tot, "written_bytes", t0);
    out.insert(out.size() - 1, ", \"snapshot\": true");
    return out;
  }
  std::map<uint32_t, Parent> parents;
  for (size_t k = 0; k < parent_devs.size(); ++k) {
    const uint32_t d = parent_devs[k];
    const std::string name = "parent dev" + std::to_string(d) + ".img";
    if (!devs.count(d) || parents.count(d))
      fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, EINVAL, "the parent image sent for device " + std::to_string(d) +
                                                        " matches none of the client's devices");
    Parent &p = parents[d];
    p.image = read_image(fds[devs.size() + k], name);
    const FileHeader &ph = p.image.hdr;
    if (ph.device != d) fail(ACL_ERROR_INVALID_FILE, 0, name + " holds device " + std::to_string(ph.device));
    if (ph.version >= 2 && ph.pid != meta.pid)
      fail(ACL_ERROR_SNAPSHOT_BACKUP_FAILED, EINVAL, "the parent image is of process " + std::to_string(ph.pid) +
                                                        ", not " + std::to_string(pid) + ": it cannot be a parent");
    // Stamps compare with the parent's epoch only within this daemon run, and only if the memory
    // was not re-imported since (then only an image of that import's export is a known base).
    if (ph.version >= 2 && ph.boot == meta.boot && ph.export_id != 0) {
      if (ph.export_id == base_id) {
        p.usable = true;
        p.threshold = base_epoch;
      } else if (ph.epoch >= base_epoch) {
        p.usable = true;
        p.threshold = ph.epoch;
      }
    }
    for (auto &a : p.image.recs) p.by_va[a.va] = &a;
  }
  std::vector<FileResult> files;
  size_t i = 0;
  for (auto &[device, bufs] : devs) {
    auto pit = parents.find(device);
    const Parent *parent = pit == parents.end() ? nullptr : &pit->second;
    const bool sync = (flags & proto::kExportNoSync) == 0;
    if (snap) {
      files.push_back(export_device(fds[i++], device, Source(bufs, *snap, snap->devices[device]), meta, parent, sync, tot));
    } else {
      files.push_back(export_device(fds[i++], device, Source(bufs), meta, parent, sync, tot));
    }
  }
  if (keep) state.keep(pid);  // exported whole: only now may its memory outlive the Release
  std::string out = transfer_json(files, tot, "written_bytes", t0);
  if (snap) {
    std::lock_guard<std::mutex> g(snap->mu);
    out.insert(out.size() - 1, ", \"copied_bytes\": " + std::to_string(snap->copied_total));
  }
  return out;
}

// ------------------------------------------------------------------------------------ import

struct Expected {
  uint64_t size;
  std::string checksum;
};

// One device image's data, read by kReaders threads straight into device memory. They take
// chunks in file order (a shared cursor), so together they read the file front to back; each
// pread()s its chunk into place, checks the chunk's XXH3-64 and memsets zero chunks. The calling
// thread feeds the whole file's XXH3-128 in file order from device memory as chunks complete
// (that hash is sequential by nature and costs far less than reading), and keeps the page cache
// bounded: it drops what it has hashed, and the readers stay at most kLag chunks ahead of it while
// asking the kernel for the next kAhead bytes of the file (FADV_WILLNEED), so the disk always
// has reads queued. No staging buffers: memory use does not grow with the file.
struct ImportJob {
  char *dst;
  const ChunkRec *rec;
  size_t idx;        // in the index
  uint64_t va, at;   // the allocation, and the chunk's offset in it (for messages)
  uint64_t seq;      // number of data chunks before this one
  bool zero;
  int ref_fd = -1;                      // a reference: read from this ancestor's file
  const std::string *ref_name = nullptr;
  bool fresh = false;  // an uncommitted allocation's: commit its pages first; zero ones are zero already
};

class Importer {
 public:
  static constexpr int kReaders = 3;
  static constexpr uint64_t kPage = 4096;           // enough for the rounding: larger pages stay cached
  static constexpr uint64_t kLag = 64;              // chunks read ahead of the file hash
  static constexpr uint64_t kAhead = 64ULL << 20;  // readahead beyond the readers' position
  // One FADV_WILLNEED request; the kernel reads at most max(io_pages, 2 x read_ahead_kb) of one.
  static constexpr uint64_t kRaStep = 2ULL << 20;

  // yield: an import ahead's (null for an import), which each of its threads follows.
  Importer(int fd, const std::string &path, const std::vector<ImportJob> &jobs, uint64_t data_chunks,
           uint64_t data_begin, uint64_t data_end, Yield *yield)
      : fd_(fd), path_(path), jobs_(jobs), done_(data_chunks, 0), data_end_(data_end), ra_next_(data_begin),
        yield_(yield) {
    for (const auto &j : jobs_)
      if (!j.zero && j.ref_fd < 0) order_.push_back(&j);
  }

  // Reads everything, feeding h with the data chunks in file order. Throws the first failure
  // (after every reader has stopped).
  void run(Hasher &h) {
    readahead(ra_next_.load());
    std::vector<std::thread> readers;
    std::optional<Failure> hash_err;
    try {
      for (int i = 0; i < kReaders; ++i) readers.emplace_back([this] { read_loop(); });
      for (uint64_t seq = 0; seq < order_.size(); ++seq) {
        {
          std::unique_lock<std::mutex> l(mu_);
          hasher_cv_.wait(l, [&] { return done_[seq] || error_.has_value(); });
          if (error_) break;
        }
        const ImportJob &j = *order_[seq];
        if (yield_ != nullptr) yield_->poll();
        h.update(j.dst, j.rec->length);
        {
          std::lock_guard<std::mutex> g(mu_);
          hashed_ = seq + 1;
        }
        reader_cv_.notify_all();
      }
    } catch (const Failure &e) {
      hash_err = e;
    } catch (...) {
      stop();
      for (auto &t : readers) t.join();
      throw;
    }
    if (hash_err) stop();
    for (auto &t : readers) t.join();
    if (error_) throw *error_;
    if (hash_err) throw *hash_err;
  }

 private:
  void stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!error_) error_ = Failure{ACL_ERROR_SNAPSHOT_RESTORE_FAILED, 0, "import stopped"};
    }
    reader_cv_.notify_all();
    hasher_cv_.notify_all();
  }

  void readahead(uint64_t upto) {
    // Called with mu_ not held; ra_mu_ keeps the requests in order and not duplicated.
    std::lock_guard<std::mutex> g(ra_mu_);
    while (ra_next_ < data_end_ && ra_next_ < upto + kAhead) {
      const uint64_t n = std::min(kRaStep, data_end_ - ra_next_);
      ::posix_fadvise(fd_, static_cast<off_t>(ra_next_), static_cast<off_t>(n), POSIX_FADV_WILLNEED);
      ra_next_ += n;
    }
  }

  void read_loop() {
    for (;;) {
      size_t k;
      {
        std::unique_lock<std::mutex> l(mu_);
        if (error_ || next_ >= jobs_.size()) return;
        k = next_++;
        const ImportJob &j = jobs_[k];
        if (!j.zero && j.ref_fd < 0) {
          reader_cv_.wait(l, [&] { return error_.has_value() || j.seq < hashed_ + kLag; });
          if (error_) return;
        }
      }
      const ImportJob &j = jobs_[k];
      if (yield_ != nullptr) yield_->poll();
      try {
        // Committed here, on the reader threads and while the disk reads, rather than all at once
        // before the import (CPU work: the kernel zeroes each page); a full host fails cleanly.
        if (j.fresh && ::madvise(j.dst, j.rec->length, MADV_POPULATE_WRITE) != 0)
          fail(ACL_ERROR_BAD_ALLOC, errno, "cannot commit device memory at " + hex(j.va) + " (offset " +
                                               std::to_string(j.at) + "): " + std::strerror(errno));
        if (j.zero) {
          if (!j.fresh) std::memset(j.dst, 0, j.rec->length);
          continue;
        }
        if (j.ref_fd >= 0) {  // off the file's order: read where it lies in the ancestor, checked the same
          pread_all(j.ref_fd, j.dst, j.rec->length, j.rec->offset, *j.ref_name);
          if (XXH3_64bits(j.dst, j.rec->length) != j.rec->hash)
            fail(ACL_ERROR_INVALID_FILE, 0,
                 *j.ref_name + ": checksum mismatch in a chunk " + path_ + " references (allocation " + hex(j.va) +
                     ", offset " + std::to_string(j.at) + "): the chain is corrupted; refusing it");
          continue;
        }
        if (j.rec->offset + kAhead > ra_next_.load(std::memory_order_relaxed) + kRaStep) readahead(j.rec->offset);
        pread_all(fd_, j.dst, j.rec->length, j.rec->offset, path_);
        if (XXH3_64bits(j.dst, j.rec->length) != j.rec->hash)
          fail(ACL_ERROR_INVALID_FILE, 0,
               path_ + ": checksum mismatch in chunk " + std::to_string(j.idx) + " (allocation " + hex(j.va) +
                   ", offset " + std::to_string(j.at) + "): the image is corrupted; refusing it");
        // The chunk is in device memory now: drop its cached pages (those wholly inside it; the
        // few shared with a neighbour go with the whole file's at the end), so that the page
        // cache holds about the readahead window, never the file, and the cost is shared out.
        const uint64_t lo = (j.rec->offset + kPage - 1) & ~(kPage - 1), hi = (j.rec->offset + j.rec->length) & ~(kPage - 1);
        if (hi > lo) ::posix_fadvise(fd_, static_cast<off_t>(lo), static_cast<off_t>(hi - lo), POSIX_FADV_DONTNEED);
      } catch (const Failure &e) {
        {
          std::lock_guard<std::mutex> g(mu_);
          if (!error_) error_ = e;
        }
        reader_cv_.notify_all();
        hasher_cv_.notify_all();
        return;
      } catch (const std::bad_alloc &) {
        {
          std::lock_guard<std::mutex> g(mu_);
          if (!error_) error_ = Failure{ACL_ERROR_BAD_ALLOC, ENOMEM, "out of memory in the daemon"};
        }
        reader_cv_.notify_all();
        hasher_cv_.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> g(mu_);
        done_[j.seq] = 1;
      }
      hasher_cv_.notify_one();
    }
  }

  const int fd_;
  const std::string &path_;
  const std::vector<ImportJob> &jobs_;
  std::vector<const ImportJob *> order_;  // the data chunks, in file order
  std::mutex mu_;
  std::condition_variable reader_cv_, hasher_cv_;
  std::vector<uint8_t> done_;  // per data chunk: read and verified
  size_t next_ = 0;            // the next job to take
  uint64_t hashed_ = 0;        // data chunks fed to the file hash
  std::optional<Failure> error_;
  const uint64_t data_end_;
  std::mutex ra_mu_;
  std::atomic<uint64_t> ra_next_;  // readahead requested up to here
  Yield *const yield_;
};

// An ancestor of an incremental image (its parent, grandparent, ...), sent after it.
struct Ancestor {
  int fd;
  std::string name;
};

int dup_kept(int fd, lazy::Import &li) {
  const int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) fail(ACL_ERROR_SNAPSHOT_RESTORE_FAILED, errno, std::string("cannot keep an image open: ") + std::strerror(errno));
  li.fds.push_back(d);
  return d;
}

// A lazy import's part of one checked image: where each chunk of each allocation comes from.
void prepare_lazy(int fd, const std::string &path, const Expected *want, const FileHeader &hdr, const Image &img,
                  const std::vector<Ancestor> &chain, const std::vector<Buffer *> &targets,
                  const std::shared_ptr<lazy::Import> &imp,
                  std::vector<std::pair<Buffer *, std::shared_ptr<lazy::Fill>>> *fills) {
  lazy::Import &li = *imp;
  lazy::File f;
  f.name = path;
  f.fd = dup_kept(fd, li);
  f.expected = want != nullptr ? want->checksum : "";
  f.head.assign(reinterpret_cast<const char *>(&hdr), sizeof(hdr));
  f.tail = img.index + std::string(reinterpret_cast<const char *>(&img.ft), sizeof(img.ft));
  li.names.push_back(path);
  const std::string *fname = &li.names.back();
  std::vector<int> anc;
  std::vector<const std::string *> anames;
  for (const auto &a : chain) {
    anc.push_back(dup_kept(a.fd, li));
    li.names.push_back(a.name);
    anames.push_back(&li.names.back());  // a deque: its elements stay where they are
  }
  for (size_t a = 0; a < img.recs.size(); ++a) {
    std::vector<lazy::Src> src;
    for (uint64_t c = 0; c < img.recs[a].nchunks; ++c) {
      const size_t idx = img.recs[a].first_chunk + c;
      const ChunkRec &r = img.chunks[idx];
      lazy::Src x;
      x.length = r.length;
      x.index = idx;
      x.file = fname;
      if (r.flags & kChunkRef) {
        x.fd = anc[ref_depth(r.flags) - 1];
        x.file = anames[ref_depth(r.flags) - 1];
      } else if (!(r.flags & kChunkZero)) {
        x.fd = f.fd;
      }
      if (x.fd >= 0) {
        x.offset = r.offset;
        x.hash = r.hash;
      }
      src.push_back(x);
    }
    auto fill = std::make_shared<lazy::Fill>(imp, targets[a]->base, targets[a]->va, std::move(src));
    f.fills.push_back(fill);
    fills->emplace_back(targets[a], std::move(fill));
  }
  li.files.push_back(std::move(f));
}

// Reads fd, a file the tool opened with its own rights and sent, under the name it gave; its
// references are read from the ancestors' files (chain[0] the parent).
// li: a lazy import (lazy.h): the structure is checked and each allocation gets its Fill (into
// fills), but no data is read here. yield: an import ahead's (CRIU restores meanwhile).
FileResult import_file(int fd, const std::string &name, const Expected *want, const std::vector<Ancestor> &chain,
                       const std::map<uint64_t, std::shared_ptr<Buffer>> &allocs,
                       std::map<uint64_t, bool> &covered, Totals &tot, uint64_t *export_id,
                       const std::shared_ptr<lazy::Import> &li,
                       std::vector<std::pair<Buffer *, std::shared_ptr<lazy::Fill>>> *fills, Yield *yield = nullptr) {
  const std::string &path = name;
  const int32_t bad = ACL_ERROR_INVALID_FILE;
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail(bad, 0, path + " is not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (want != nullptr && want->size != size)
    fail(bad, 0, path + ": size " + std::to_string(size) + " differs from the expected " + std::to_string(want->size) +
                     " (truncated or altered)");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  Image img = read_image(fd, path);
  const FileHeader &hdr = img.hdr;
  const Footer &ft = img.ft;
  const std::string &index = img.index;
  const std::vector<AllocRec> &recs = img.recs;
  const std::vector<ChunkRec> &chunks = img.chunks;
  *export_id = hdr.version >= 2 ? hdr.export_id : 0;
  std::vector<uint64_t> data_end;  // per ancestor: where its data ends
  for (const auto &a : chain) {
    Image ai = read_image(a.fd, a.name);
    if (ai.hdr.device != hdr.device) fail(bad, 0, a.name + " holds another device than " + path);
    data_end.push_back(ai.ft.index_offset);
  }

  // Structure, and every allocation present in the client at the same address and size.
  std::vector<Buffer *> targets;
  uint64_t expect_off = sizeof(hdr);
  for (auto &a : recs) {
    auto it = allocs.find(a.va);
    if (it == allocs.end() || it->second->size != a.size || it->second->device != hdr.device)
      fail(ACL_ERROR_SNAPSHOT_RESTORE_FAILED, 0,
           "the client has no allocation at " + hex(a.va) + " of " + std::to_string(a.size) + " bytes on device " +
               std::to_string(hdr.device) + " (" + name + " holds one): re-create the allocations first (restore external)");
    for (uint64_t c = 0; c < a.nchunks; ++c) {
      const ChunkRec &r = chunks[a.first_chunk + c];
      if (r.flags & kChunkRef) {
        const uint32_t d = ref_depth(r.flags);
        if (d > chain.size())
          fail(ACL_ERROR_SNAPSHOT_RESTORE_FAILED, 0, path + " references link " + std::to_string(d) +
                                                         " of its chain, but only " + std::to_string(chain.size()) +
                                                         " parent images were sent");
        if (r.offset < sizeof(FileHeader) || r.offset + r.length > data_end[d - 1])
          fail(bad, 0, path + ": a reference lies outside " + chain[d - 1].name);
      } else if (!(r.flags & kChunkZero)) {
        if (r.offset != expect_off) fail(bad, 0, path + ": inconsistent index");
        expect_off += r.length;
      }
    }
    targets.push_back(it->second.get());
    covered[a.va] = true;
  }
  if (expect_off != ft.index_offset) fail(bad, 0, path + ": inconsistent index");

  // The work, in allocation and chunk order: data chunks are in file order (the index check
  // above), zero chunks interleaved where they fall.
  std::vector<ImportJob> jobs;
  jobs.reserve(chunks.size());
  uint64_t data_chunks = 0;
  for (size_t a = 0; a < recs.size(); ++a) {
    Buffer &b = *targets[a];
    tot.allocations++;
    tot.bytes += b.size;
    // Fresh only for this import's first attempt: one that fails part-way leaves data in it, and
    // a retry must then write every zero chunk.
    const bool fresh = b.uncommitted;
    b.uncommitted = false;
    for (uint64_t c = 0; c < recs[a].nchunks; ++c) {
      const size_t idx = recs[a].first_chunk + c;
      const ChunkRec &r = chunks[idx];
      const bool zero = (r.flags & kChunkZero) != 0;
      jobs.push_back({b.base + c * kChunk, &r, idx, b.va, c * kChunk, data_chunks, zero});
      jobs.back().fresh = fresh;
      if (r.flags & kChunkRef) {
        const Ancestor &a = chain[ref_depth(r.flags) - 1];
        jobs.back().ref_fd = a.fd;
        jobs.back().ref_name = &a.name;
        tot.nonzero += r.length;
        tot.referenced += r.length;
      } else if (!zero) {
        tot.nonzero += r.length;
        ++data_chunks;
      }
    }
  }
  if (li) {
    prepare_lazy(fd, path, want, hdr, img, chain, targets, li, fills);
    tot.file_bytes += size;
    return {name, size, ""};  // its XXH3-128 is checked by the background fill
  }
  Hasher h;
  h.update(&hdr, sizeof(hdr));
  Importer im(fd, path, jobs, data_chunks, sizeof(hdr), ft.index_offset, yield);
  im.run(h);
  h.update(index.data(), index.size());
  h.update(&ft, sizeof(ft));
  std::string digest = h.hex();
  if (want != nullptr && !want->checksum.empty() && want->checksum != digest)
    fail(ACL_ERROR_INVALID_FILE, 0, path + ": checksum mismatch (expected " + want->checksum + ", read " + digest +
                                        "): the image was altered or corrupted; refusing it");
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  tot.file_bytes += size;
  return {name, size, digest};
}

using Names = std::vector<std::pair<std::string, std::optional<Expected>>>;

// An import ahead (npusnap's restore, while CRIU restores the process): pid has no session yet,
// so its allocations are made here, from the images' index, filled and checked exactly as by an
// import, and only then kept for the process (pid started at start, CRIU's restored task) to take
// back through MallocAt at its external Restore; its Quiesce then finds the data in place. A
// failure gives the memory back and leaves nothing kept: the restore imports as usual.
std::string import_ahead(DeviceState &state, pid_t pid, uint64_t start, const Names &names,
                         const std::vector<std::vector<Ancestor>> &chains, const std::vector<int> &fds,
                         std::chrono::steady_clock::time_point t0) {
  const int32_t refuse = ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
  if (state.find(pid)) fail(refuse, EBUSY, "client " + std::to_string(pid) + " is connected: no import ahead for it");
  Yield yield(pid);
  if (start == 0 || start_time(pid) != start)
    fail(refuse, ESRCH, "process " + std::to_string(pid) + " is not the one the import ahead was asked for");
  struct Staged {
    DeviceState &state;
    std::vector<std::shared_ptr<Buffer>> bufs;
    bool kept = false;
    ~Staged() {
      if (!kept) state.unstage(bufs);
    }
  } staged{state, {}};
  std::map<uint64_t, std::shared_ptr<Buffer>> allocs;
  for (size_t i = 0, k = 0; i < names.size(); k += 1 + chains[i].size(), ++i) {
    const Image im = read_image(fds[k], names[i].first);
    for (const AllocRec &a : im.recs) {
      std::shared_ptr<Buffer> b;
      if (int32_t rc = state.stage(im.hdr.device, a.va, a.size, &b); rc != ACL_SUCCESS)
        fail(rc, ENOMEM, "no room on device " + std::to_string(im.hdr.device) + " for the allocation at " + hex(a.va) +
                             " of " + std::to_string(a.size) + " bytes (" + names[i].first + ")");
      staged.bufs.push_back(b);
      if (!allocs.emplace(a.va, b).second) fail(ACL_ERROR_INVALID_FILE, 0, names[i].first + ": inconsistent index");
    }
  }
  std::map<uint64_t, bool> covered;
  Totals tot;
  std::vector<FileResult> files;
  std::set<uint64_t> ids;
  for (size_t i = 0, k = 0; i < names.size(); k += 1 + chains[i].size(), ++i) {
    uint64_t id = 0;
    const auto &want = names[i].second;
    files.push_back(import_file(fds[k], names[i].first, want ? &*want : nullptr, chains[i], allocs, covered, tot, &id,
                                nullptr, nullptr, &yield));
    ids.insert(id);
  }
  state.keep_ahead(pid, start, allocs, ids.size() == 1 ? *ids.begin() : 0, dirty::close_epoch());
  staged.kept = true;
  return transfer_json(files, tot, "read_bytes", t0);
}

std::string do_import(DeviceState &state, pid_t pid, const std::string &request, const std::vector<int> &fds) {
  const auto t0 = std::chrono::steady_clock::now();
  // "NAME [SIZE CHECKSUM]" lines, one per file sent: exactly these files, with these checksums;
  // after one, "^ LABEL" lines for its ancestors' files (parent first), named LABEL in messages.
  // A first line "! lazy": the data comes in after the reply (lazy.h); "! ahead START": an import
  // ahead (import_ahead); "! if-due": nothing read when an import ahead left the data in place.
  std::istringstream in(request);
  std::string line;
  std::shared_ptr<lazy::Import> li;
  uint64_t ahead = 0;
  bool if_due = false;
  if (request.rfind("! lazy\n", 0) == 0) {
    li = std::make_shared<lazy::Import>();
    li->pid = pid;
    std::getline(in, line);
  } else if (request.rfind("! ahead ", 0) == 0) {
    std::getline(in, line);
    ahead = std::strtoull(line.c_str() + 8, nullptr, 10);
    if (ahead == 0) fail(ACL_ERROR_INVALID_PARAM, EINVAL, "malformed import ahead");
  } else if (request.rfind("! if-due\n", 0) == 0) {
    if_due = true;
    std::getline(in, line);
  }
  Names names;
  std::vector<std::vector<Ancestor>> chains;
  size_t nfds = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line.rfind("^ ", 0) == 0) {
      if (names.empty() || nfds >= fds.size() || chains.back().size() >= kMaxDepth)
        fail(ACL_ERROR_INVALID_PARAM, EINVAL, "malformed ancestor line");
      chains.back().push_back({fds[nfds++], line.substr(2)});
      continue;
    }
    std::istringstream ls(line);
    std::string name;
    Expected e{};
    ls >> name;
    const bool sized = static_cast<bool>(ls >> e.size >> e.checksum);
    if (name.empty() || name.find('/') != std::string::npos)
      fail(ACL_ERROR_INVALID_PARAM, EINVAL, "malformed expected-file line");
    names.emplace_back(name, sized ? std::optional<Expected>(e) : std::nullopt);
    chains.emplace_back();
    ++nfds;
  }
  if (nfds != fds.size())
    fail(ACL_ERROR_INVALID_PARAM, EINVAL, "the request names " + std::to_string(nfds) + " files but sent " +
                                              std::to_string(fds.size()));
  if (ahead != 0) return import_ahead(state, pid, ahead, names, chains, fds, t0);
  Transfer tr(state, pid, true);
  if (if_due && !tr.awaiting_import()) {
    std::string out = transfer_json({}, Totals{}, "read_bytes", t0);
    return out.insert(out.size() - 1, ", \"in_place\": true");
  }
  std::map<uint64_t, std::shared_ptr<Buffer>> allocs;
  for (auto &b : state.buffers(tr.session()))
    if (!b->lent) allocs[b->va] = b;
  std::map<uint64_t, bool> covered;
  Totals tot;
  std::vector<FileResult> files;
  std::set<uint64_t> ids;
  std::vector<std::pair<Buffer *, std::shared_ptr<lazy::Fill>>> fills;
  for (size_t i = 0, k = 0; i < names.size(); ++i) {
    const auto &[n, want] = names[i];
    uint64_t id = 0;
    files.push_back(import_file(fds[k], n, want ? &*want : nullptr, chains[i], allocs, covered, tot, &id, li, &fills));
    ids.insert(id);
    k += 1 + chains[i].size();
  }
  for (auto &[va, b] : allocs)
    if (!covered.count(va))
      fail(ACL_ERROR_SNAPSHOT_RESTORE_FAILED, 0,
           "no device image sent holds the client's allocation at " + hex(va) + " (device " +
               std::to_string(b->device) + "): the images do not belong to this process");
  {
    // The memory now holds exactly that export's image: an incremental export may take it as its base.
    Session &s = tr.session();
    std::lock_guard<std::mutex> g(s.mu);
    s.base_id = ids.size() == 1 ? *ids.begin() : 0;
    s.base_epoch = dirty::close_epoch();
  }
  // Only now, all of it checked: the lazy chunks (a full import: none, from an earlier lazy one).
  lazy::cancel(pid);
  for (auto &[va, b] : allocs) b->lazy = nullptr;
  for (auto &[b, fill] : fills) b->lazy = fill;
  if (li) {
    li->hold.reserve(allocs.size());
    for (auto &[va, b] : allocs) li->hold.push_back(b);
    lazy::start(li);
  }
  tr.imported();
  std::string out = transfer_json(files, tot, "read_bytes", t0);
  if (li) out.insert(out.size() - 1, ", \"lazy\": true");
  return out;
}

}  // namespace

bool serve(DeviceState &state, int fd, pid_t /*peer*/, const proto::Request &rq, proto::Reply &rp,
           std::string *payload) {
  if (rq.size > kMaxRequest) return false;
  std::string body(rq.size, '\0');
  Fds sent;
  if (rq.size > 0 && !wire::recv_with_fds(fd, body.data(), body.size(), sent.fds, wire::kMaxFds)) return false;
  const pid_t pid = static_cast<pid_t>(rq.value[0]);
  try {
    if (pid <= 0) fail(ACL_ERROR_INVALID_PARAM, EINVAL, "invalid client pid");
    check_peer(fd, pid);
    if (rq.op == proto::Op::ExportDevices) *payload = do_export_devices(state, pid, rq.flags);
    else if (rq.op == proto::Op::LazyStatus) *payload = lazy::status(pid, static_cast<int64_t>(rq.value[1]));
    else if (rq.op == proto::Op::Export) *payload = do_export(state, pid, body, sent.fds, rq.flags, rq.value[1]);
    else *payload = do_import(state, pid, body, sent.fds);
    rp.code = ACL_SUCCESS;
  } catch (const Failure &e) {
    rp.code = e.code;
    *payload = "{\"error\": " + json_string(e.msg) + ", \"errno\": " + std::to_string(e.err) + "}";
  } catch (const std::bad_alloc &) {
    rp.code = ACL_ERROR_BAD_ALLOC;
    *payload = "{\"error\": \"out of memory in the daemon\", \"errno\": " + std::to_string(ENOMEM) + "}";
  }
  return true;
}

int32_t quiesce(Session &s, uint32_t flags) {
  std::lock_guard<std::mutex> g(s.mu);
  if (flags == proto::kQuiesceUnlocking) {
    if (s.transferring || s.awaiting_import) return ACL_ERROR_SNAPSHOT_UNLOCK_FAILED;
    s.locked = false;
    return ACL_SUCCESS;
  }
  if (flags > proto::kQuiesceAwaitingImport) return ACL_ERROR_INVALID_PARAM;
  s.locked = true;
  s.awaiting_import = flags == proto::kQuiesceAwaitingImport;
  return ACL_SUCCESS;
}

void mark_drained(Session &s) {
  std::lock_guard<std::mutex> g(s.mu);
  s.locked = true;
}

void adopt_base(Session &s, uint64_t base_id, uint64_t base_epoch) {
  std::lock_guard<std::mutex> g(s.mu);
  s.base_id = base_id;
  s.base_epoch = base_epoch;
}

}  // namespace xfer
}  // namespace npusim

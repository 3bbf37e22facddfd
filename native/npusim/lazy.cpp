// Lazy import: chunks loaded on first touch and by one background thread (see lazy.h).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "lazy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <shared_mutex>

#include "acl/acl_base.h"
#include "acl/error_codes/rt_error_codes.h"
#include "device_state.h"
#include "export.h"

namespace npusim::lazy {
namespace {

using xfer::hex;
using xfer::json_string;

constexpr uint64_t kChunk = dirty::kChunk;
constexpr size_t kMaxErrors = 8;
constexpr size_t kKept = 64;  // ended imports kept for status
constexpr auto kTouchWait = std::chrono::seconds(120);  // a chunk another thread is reading

std::mutex g_mu;
// Never destroyed: a daemon exiting with a fill running must not join (or terminate on) it.
auto &g_imports = *new std::map<pid_t, std::shared_ptr<Import>>;

// pread of exactly n bytes; false with errno (0: the file is shorter) otherwise.
bool read_exact(int fd, char *p, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(off));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
  }
  return true;
}

bool cancelled(Import &imp) {
  std::lock_guard<std::mutex> g(imp.mu);
  return imp.cancel;
}

// Hex of a file's XXH3-128 as npusnap's manifest writes it (big-endian: Python's hexdigest()).
std::string digest_hex(XXH3_state_t *st) {
  const XXH128_hash_t d = XXH3_128bits_digest(st);
  char b[40];
  std::snprintf(b, sizeof(b), "%016llx%016llx", static_cast<unsigned long long>(d.high64),
                static_cast<unsigned long long>(d.low64));
  return b;
}

// The background: every file front to back, loading what no touch has, and the whole file's
// XXH3-128 from the bytes as they are checked (or, for a chunk a touch loaded, from the file).
void run(const std::shared_ptr<Import> &imp) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<char> scratch(kChunk);
  XXH3_state_t *st = XXH3_createState();
  for (File &f : imp->files) {
    if (st == nullptr) break;
    XXH3_128bits_reset(st);
    XXH3_128bits_update(st, f.head.data(), f.head.size());
    bool whole = true;  // every data chunk fed the hash
    for (auto &fill : f.fills) {
      for (uint64_t c = 0; c < fill->src.size(); ++c) {
        if (cancelled(*imp)) goto out;
        const Src &s = fill->src[c];
        const bool own = s.fd == f.fd;  // this file's data, in file order
        std::shared_lock<std::shared_mutex> use(memory_swap());  // not while share_memory moves it
        if (fill->claim(c)) {
          fill->load(c, own ? st : nullptr);
        } else if (own) {
          if (read_exact(f.fd, scratch.data(), s.length, s.offset)) XXH3_128bits_update(st, scratch.data(), s.length);
          else whole = false;  // that chunk's touch reported it
        }
      }
    }
    XXH3_128bits_update(st, f.tail.data(), f.tail.size());
    if (whole && !f.expected.empty() && digest_hex(st) != f.expected)
      imp->report(f.name + ": checksum mismatch of the whole file (expected " + f.expected + ", read " +
                              digest_hex(st) + "): the image was altered or corrupted");
  }
out:
  if (st != nullptr) XXH3_freeState(st);
  std::unique_lock<std::mutex> l(imp->mu);
  // A touch may still be reading a chunk: the import ends when every chunk is decided.
  imp->cv.wait_for(l, kTouchWait, [&] { return imp->cancel || imp->ready + imp->bad == imp->total; });
  imp->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  imp->finished = true;
  imp->files.clear();  // the Fills keep the import (and its files) alive while their buffers live
  imp->hold.clear();
  if (imp->bad > 0 || !imp->errors.empty())
    std::fprintf(stderr, "npusimd: lazy import of client %d failed: %s\n", static_cast<int>(imp->pid),
                 imp->errors.empty() ? "cancelled" : imp->errors.front().c_str());
  l.unlock();
  imp->cv.notify_all();
}

}  // namespace

Fill::Fill(std::shared_ptr<Import> imp, char *b, uint64_t v, std::vector<Src> s)
    : import(std::move(imp)), base(b), va(v), src(std::move(s)),
      state(std::make_unique<std::atomic<uint8_t>[]>(src.size())), left(src.size()) {
  for (size_t i = 0; i < src.size(); ++i) state[i].store(kPending, std::memory_order_relaxed);
}

bool Fill::claim(uint64_t c) {
  uint8_t want = kPending;
  return state[c].compare_exchange_strong(want, kFilling, std::memory_order_acq_rel);
}

bool Fill::load(uint64_t c, void *hash) {
  const Src &s = src[c];
  char *dst = base + c * kChunk;
  std::string error;
  if (s.fd < 0) {
    std::memset(dst, 0, s.length);
  } else if (!read_exact(s.fd, dst, s.length, s.offset)) {
    const int e = errno;
    error = *s.file + (e ? std::string(": ") + std::strerror(e) : std::string(" is truncated")) + " reading chunk " +
            std::to_string(s.index);
  } else {
    if (hash != nullptr) XXH3_128bits_update(static_cast<XXH3_state_t *>(hash), dst, s.length);
    if (XXH3_64bits(dst, s.length) != s.hash)
      error = *s.file + ": checksum mismatch in chunk " + std::to_string(s.index) + " (allocation " + hex(va) +
              ", offset " + std::to_string(c * kChunk) + "): the image is corrupted; its data is refused";
  }
  const bool ok = error.empty();
  if (!ok) std::memset(dst, 0, s.length);  // nothing of it may be read, even by mistake
  state[c].store(ok ? kReady : kBad, std::memory_order_release);
  if (ok) left.fetch_sub(1, std::memory_order_acq_rel);  // a bad chunk keeps its buffer off the fast path
  import->done(ok, s.fd < 0 ? 0 : s.length, error);
  return ok;
}

int32_t Fill::get(uint64_t c) {
  uint8_t s = state[c].load(std::memory_order_acquire);
  if (s == kPending && claim(c)) return load(c, nullptr) ? ACL_SUCCESS : ACL_ERROR_RT_DEVICE_MEM_ERROR;
  if (s != kReady && s != kBad) {
    std::unique_lock<std::mutex> l(import->mu);
    import->cv.wait_for(l, kTouchWait, [&] { return state[c].load(std::memory_order_acquire) >= kReady; });
    s = state[c].load(std::memory_order_acquire);
  }
  return s == kReady ? ACL_SUCCESS : ACL_ERROR_RT_DEVICE_MEM_ERROR;
}

Import::~Import() {
  for (int fd : fds) ::close(fd);
}

void Import::report(const std::string &error) {
  std::lock_guard<std::mutex> g(mu);
  if (errors.size() < kMaxErrors) errors.push_back(error);
  std::fprintf(stderr, "npusimd: lazy import of client %d: %s\n", static_cast<int>(pid), error.c_str());
}

void Import::done(bool ok, uint64_t n, const std::string &error) {
  if (!error.empty()) report(error);
  {
    std::lock_guard<std::mutex> g(mu);
    (ok ? ready : bad) += 1;
    bytes += n;
  }
  cv.notify_all();
}

int32_t ensure(const Buffer &b, const char *p, uint64_t len) {
  const Buffer *owner = &b;
  while (owner->backing) owner = owner->backing.get();  // an alias shows its backing's memory
  Fill *f = owner->lazy.get();
  if (f == nullptr || f->left.load(std::memory_order_acquire) == 0 || len == 0 || p < owner->base) return ACL_SUCCESS;
  const uint64_t off = static_cast<uint64_t>(p - owner->base);
  if (off >= owner->size) return ACL_SUCCESS;
  const uint64_t last = std::min(owner->size, off + len) - 1;
  for (uint64_t c = off / kChunk; c <= last / kChunk && c < f->src.size(); ++c)
    if (int32_t rc = f->get(c); rc != ACL_SUCCESS) return rc;
  return ACL_SUCCESS;
}

int32_t ensure_work(const Work &w) {
  using proto::TaskKind;
  const TaskKind k = w.task.kind;
  // A copy or memset touches its bytes only; anything else (a kernel, a collective, a built-in
  // task) is taken to touch the whole of every buffer it holds.
  const bool ranged = k == TaskKind::HostToDevice || k == TaskKind::DeviceToHost || k == TaskKind::DeviceToDevice ||
                      k == TaskKind::Memset;
  for (const auto &b : w.hold) {
    if (!ranged) {
      if (int32_t rc = ensure(*b, b->base, b->size); rc != ACL_SUCCESS) return rc;
      continue;
    }
    for (const char *p : {static_cast<const char *>(w.dst), w.src})
      if (p != nullptr && p >= b->base && p < b->base + b->size)
        if (int32_t rc = ensure(*b, p, w.task.size); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
}

int32_t ensure_all(const std::vector<std::shared_ptr<Buffer>> &bufs) {
  for (const auto &b : bufs)
    if (int32_t rc = ensure(*b, b->base, b->size); rc != ACL_SUCCESS) return rc;
  return ACL_SUCCESS;
}

void start(std::shared_ptr<Import> imp) {
  cancel(imp->pid);
  for (const File &f : imp->files)
    for (const auto &fill : f.fills) imp->total += fill->src.size();
  std::vector<std::shared_ptr<Import>> old;
  {
    std::lock_guard<std::mutex> g(g_mu);
    // Ended imports stay to be asked about (a workload that exited on a bad chunk: the restore
    // reports it afterwards), up to kKept of them.
    for (auto it = g_imports.begin(); it != g_imports.end() && g_imports.size() >= kKept;) {
      std::lock_guard<std::mutex> l(it->second->mu);
      if (it->second->finished) {
        old.push_back(std::move(it->second));
        it = g_imports.erase(it);
      } else {
        ++it;
      }
    }
    imp->worker = std::thread([imp] { run(imp); });
    g_imports[imp->pid] = std::move(imp);
  }
  for (auto &o : old)
    if (o->worker.joinable()) o->worker.join();  // ended: at once
}

void cancel(pid_t pid) {
  std::shared_ptr<Import> imp;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_imports.find(pid);
    if (it == g_imports.end()) return;
    imp = it->second;
  }
  {
    std::lock_guard<std::mutex> g(imp->mu);
    imp->cancel = true;
  }
  imp->cv.notify_all();
  // Two sessions' ends (release, then leave) may both get here: one joins, the other waits for it.
  std::lock_guard<std::mutex> j(imp->join_mu);
  if (imp->worker.joinable()) imp->worker.join();
}

std::string status(pid_t pid, int64_t wait_ms) {
  std::shared_ptr<Import> imp;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_imports.find(pid);
    if (it != g_imports.end()) imp = it->second;
  }
  if (!imp) return "{\"state\": \"none\"}";
  std::unique_lock<std::mutex> l(imp->mu);
  if (wait_ms > 0) imp->cv.wait_for(l, std::chrono::milliseconds(wait_ms), [&] { return imp->finished; });
  const bool failed = imp->bad > 0 || !imp->errors.empty();
  const bool all = imp->ready + imp->bad == imp->total;
  std::string out = "{\"state\": \"";
  out += !imp->finished ? "filling" : failed ? "failed" : !all ? "cancelled" : "done";
  out += "\", \"chunks\": " + std::to_string(imp->total) + ", \"ready\": " + std::to_string(imp->ready) +
         ", \"bad\": " + std::to_string(imp->bad) + ", \"bytes\": " + std::to_string(imp->bytes) +
         ", \"seconds\": " + std::to_string(imp->seconds) + ", \"errors\": [";
  for (size_t i = 0; i < imp->errors.size(); ++i) out += (i ? ", " : "") + json_string(imp->errors[i]);
  return out + "]}";
}

}  // namespace npusim::lazy

// Copy-on-write snapshots of device memory (cow.h). Every chunk's state changes under its
// snapshot's mutex, so a task waiting for a chunk never misses the change; the fast path of a
// task while no snapshot exists is one atomic load.
#include "cow.h"

#include <algorithm>
#include <cstring>
#include <new>

namespace npusim::cow {
namespace {

constexpr uint64_t kChunk = dirty::kChunk;

std::mutex g_mu;
std::map<pid_t, std::shared_ptr<Snapshot>> g_snaps;
std::map<const Buffer *, std::pair<std::shared_ptr<Snapshot>, Alloc *>> g_by_buf;
std::atomic<size_t> g_open{0};

uint64_t chunk_len(const Alloc &a, uint64_t c) { return std::min(kChunk, a.buf->size - c * kChunk); }

void unregister_locked(pid_t pid) {
  auto it = g_snaps.find(pid);
  if (it == g_snaps.end()) return;
  for (auto &[device, allocs] : it->second->devices)
    for (auto &a : allocs) g_by_buf.erase(a.buf.get());
  {
    std::lock_guard<std::mutex> l(it->second->mu);
    if (it->second->lost.empty()) it->second->lost = "it was dropped";
  }
  it->second->cv.notify_all();
  g_snaps.erase(it);
  g_open.store(g_snaps.size(), std::memory_order_release);
}

// s.mu held. The snapshot cannot be written out whole any more: tasks stop waiting for it.
void lose(Snapshot &s, std::string why) {
  if (s.lost.empty()) s.lost = std::move(why);
  s.cv.notify_all();
}

void save_chunk(Snapshot &s, Alloc &a, uint64_t c) {
  std::atomic<uint8_t> &st = a.state[c];
  std::unique_lock<std::mutex> l(s.mu);
  for (;;) {
    const uint8_t v = st.load();
    if (v == kCopied || v == kDone || !s.lost.empty()) return;
    if (v == kLive) {
      const uint64_t len = chunk_len(a, c);
      if (s.copied + len > s.cap) {
        // At the bound: wait for the export to write the chunk out, if one runs.
        if (!s.exporting) {
          lose(s, "its copies of the memory the workload wrote meanwhile reached the bound of " +
                      std::to_string(s.cap >> 20) + " MiB before the write-out began");
          return;
        }
        s.cv.wait(l);
        continue;
      }
      st.store(kCopying);
      s.copied += len;
      l.unlock();
      std::unique_ptr<char[]> copy(new (std::nothrow) char[len]);
      if (copy) std::memcpy(copy.get(), a.buf->base + c * kChunk, len);
      l.lock();
      if (!copy) {
        s.copied -= len;
        st.store(kLive);
        lose(s, "the daemon ran out of memory copying the memory the workload wrote meanwhile");
        return;
      }
      a.copy[c] = std::move(copy);
      s.copied_total += len;
      st.store(kCopied);
      s.cv.notify_all();
      return;
    }
    s.cv.wait(l);  // kCopying (another task) or kExporting (the export reads it in place)
  }
}

void save(const Buffer &b, const char *p, uint64_t len) {
  const Buffer *owner = &b;
  while (owner->backing) owner = owner->backing.get();  // an alias writes its backing's memory
  if (len == 0 || p < owner->base || static_cast<uint64_t>(p - owner->base) >= owner->size) return;
  std::shared_ptr<Snapshot> s;
  Alloc *a = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mu);
    auto it = g_by_buf.find(owner);
    if (it == g_by_buf.end()) return;
    s = it->second.first;
    a = it->second.second;
  }
  const uint64_t off = static_cast<uint64_t>(p - owner->base);
  const uint64_t last = std::min(owner->size, off + len) - 1;
  for (uint64_t c = off / kChunk; c <= last / kChunk; ++c) save_chunk(*s, *a, c);
}

}  // namespace

std::shared_ptr<Snapshot> open(pid_t pid, std::map<uint32_t, std::vector<std::shared_ptr<Buffer>>> devices,
                               uint64_t id, uint64_t epoch, uint64_t base_id, uint64_t base_epoch, uint64_t cap) {
  auto s = std::make_shared<Snapshot>();
  s->pid = pid;
  s->start = start_time(pid);
  s->id = id;
  s->epoch = epoch;
  s->base_id = base_id;
  s->base_epoch = base_epoch;
  s->cap = cap;
  for (auto &[device, bufs] : devices) {
    auto &allocs = s->devices[device];
    allocs.reserve(bufs.size());  // stable: g_by_buf points into it
    for (auto &b : bufs) {
      const uint64_t n = (b->size + kChunk - 1) / kChunk;
      Alloc a;
      a.buf = b;
      if (b->gens)
        for (uint64_t c = 0; c < n; ++c) a.gens.push_back(b->gens[c].load(std::memory_order_acquire));
      a.state = std::make_unique<std::atomic<uint8_t>[]>(n);
      for (uint64_t c = 0; c < n; ++c) a.state[c].store(kLive, std::memory_order_relaxed);
      a.copy.resize(n);
      allocs.push_back(std::move(a));
    }
  }
  std::lock_guard<std::mutex> g(g_mu);
  unregister_locked(pid);
  for (auto &[device, allocs] : s->devices)
    for (auto &a : allocs) g_by_buf[a.buf.get()] = {s, &a};
  g_snaps[pid] = s;
  g_open.store(g_snaps.size(), std::memory_order_release);
  return s;
}

std::shared_ptr<Snapshot> find(pid_t pid, bool claim) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_snaps.find(pid);
  if (it == g_snaps.end()) return nullptr;
  std::lock_guard<std::mutex> l(it->second->mu);
  if (claim) {
    if (it->second->exporting) return nullptr;
    it->second->exporting = true;
  }
  return it->second;
}

void drop(pid_t pid) {
  std::lock_guard<std::mutex> g(g_mu);
  unregister_locked(pid);
}

void drop_gone() {
  if (g_open.load() == 0) return;
  std::lock_guard<std::mutex> g(g_mu);
  std::vector<pid_t> gone;
  for (auto &[pid, s] : g_snaps)
    if (exited(pid) || start_time(pid) != s->start) gone.push_back(pid);
  for (pid_t pid : gone) unregister_locked(pid);
}

size_t count() { return g_open.load(); }

void before_work(const Work &w) {
  if (g_open.load(std::memory_order_acquire) == 0) return;
  if (w.writes_all) {
    for (const auto &b : w.hold) save(*b, b->base, b->size);
    return;
  }
  if (w.out != nullptr && w.dst != nullptr) save(*w.out, w.dst, w.out_len);
}

const char *acquire(Snapshot &s, Alloc &a, uint64_t c) {
  std::atomic<uint8_t> &st = a.state[c];
  std::unique_lock<std::mutex> l(s.mu);
  s.cv.wait(l, [&] { return st.load() != kCopying || !s.lost.empty(); });
  if (!s.lost.empty()) return nullptr;
  if (st.load() == kCopied) return a.copy[c].get();
  st.store(kExporting);  // tasks writing it wait until it is out
  return a.buf->base + c * kChunk;
}

void release(Snapshot &s, Alloc &a, uint64_t c) {
  std::unique_ptr<char[]> freed;
  {
    std::lock_guard<std::mutex> l(s.mu);
    if (a.copy[c]) {
      freed = std::move(a.copy[c]);
      s.copied -= chunk_len(a, c);
    }
    a.state[c].store(kDone);
  }
  s.cv.notify_all();
}

void skip(Snapshot &s, Alloc &a, uint64_t c) {
  if (acquire(s, a, c) != nullptr) release(s, a, c);
}

}  // namespace npusim::cow

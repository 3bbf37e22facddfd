// Dirty tracking for incremental device exports (device_state.h, namespace dirty): an epoch
// counter and, per allocation, the epoch of each chunk's last write. A write is stamped after it
// completes, so a write that races an export's epoch change is stamped with the later epoch and
// counts as changed: the tracking can only over-report, never miss a write.
#include <algorithm>
#include <random>

#include "device_state.h"

namespace npusim::dirty {
namespace {

std::atomic<uint64_t> g_epoch{1};

uint64_t chunks_of(uint64_t size) { return (size + kChunk - 1) / kChunk; }

}  // namespace

uint64_t epoch() { return g_epoch.load(); }

uint64_t close_epoch() { return g_epoch.fetch_add(1); }

uint64_t boot_id() {
  static const uint64_t id = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;  // never 0 (0: no daemon)
  }();
  return id;
}

void init(Buffer &b) {
  const uint64_t n = chunks_of(b.size), now = epoch();
  b.gens = std::make_unique<std::atomic<uint64_t>[]>(n);
  for (uint64_t i = 0; i < n; ++i) b.gens[i].store(now, std::memory_order_relaxed);
}

void stamp(const Buffer &b, const char *p, uint64_t len) {
  const Buffer *owner = &b;
  while (owner->backing) owner = owner->backing.get();  // an alias writes its backing's memory
  if (!owner->gens || len == 0 || p < owner->base) return;
  const uint64_t off = static_cast<uint64_t>(p - owner->base);
  if (off >= owner->size) return;
  const uint64_t last = std::min(owner->size, off + len) - 1;
  const uint64_t now = epoch();
  for (uint64_t c = off / kChunk; c <= last / kChunk; ++c) owner->gens[c].store(now, std::memory_order_release);
}

void stamp_work(const Work &w) {
  if (w.writes_all) {
    for (const auto &b : w.hold) stamp(*b, b->base, b->size);
    return;
  }
  if (w.out != nullptr && w.dst != nullptr) stamp(*w.out, w.dst, w.out_len);
}

}  // namespace npusim::dirty

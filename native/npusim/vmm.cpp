// Virtual memory in the daemon: reservations and mappings.
//
// A reservation is a range of the session's window with nothing behind it; reservations live in
// the window's upper half, so aclrtMalloc's first fit (which starts at the bottom) never meets
// them. A mapping is an alias Buffer in the session's allocations: address resolution, copies
// and kernels reach the physical memory through it unchanged.
#include <algorithm>

#include "acl/acl_base.h"
#include "device_state.h"
#include "va.h"

namespace npusim {
namespace {

constexpr uint64_t kReserveBase = va::kWindowSize / 2;

bool overlaps(const std::map<uint64_t, uint64_t> &ranges, uint64_t va, uint64_t size) {
  auto next = ranges.lower_bound(va);
  if (next != ranges.end() && next->first < va + size) return true;
  if (next == ranges.begin()) return false;
  auto prev = std::prev(next);
  return prev->first + prev->second > va;
}

}  // namespace

int32_t DeviceState::reserve(Session &s, uint32_t device, uint64_t size, uint64_t align, uint64_t at,
                             uint64_t *out) {
  if (device >= device_count()) return ACL_ERROR_RT_INVALID_DEVICEID;
  if (size == 0 || size > kReserveBase) return ACL_ERROR_INVALID_PARAM;
  if (align == 0 || (align & (align - 1)) != 0) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(mu_);
  if (at != 0) {
    if (!va::is_device(at) || va::device_of(at) != device || va::offset_of(at) < kReserveBase ||
        va::offset_of(at) + size > va::kWindowSize)
      return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    if (int32_t rc = claim_window(s, device, static_cast<int>(va::window_of(at))); rc != ACL_SUCCESS) return rc;
    if (overlaps(s.reservations, at, size)) return ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    s.reservations[at] = size;
    *out = at;
    return ACL_SUCCESS;
  }
  if (int32_t rc = claim_window(s, device, -1); rc != ACL_SUCCESS) return rc;
  const uint64_t lo = va::make(device, static_cast<uint32_t>(s.windows[device]), kReserveBase);
  const uint64_t hi = lo + kReserveBase;
  uint64_t cursor = lo;  // first fit over this window's reservations
  for (auto it = s.reservations.lower_bound(lo); it != s.reservations.end() && it->first < hi; ++it) {
    if (it->first >= cursor && it->first - cursor >= size) break;
    cursor = std::max(cursor, (it->first + it->second + align - 1) / align * align);
  }
  if (cursor >= hi || hi - cursor < size) return ACL_ERROR_RT_MEMORY_ALLOCATION;
  s.reservations[cursor] = size;
  *out = cursor;
  return ACL_SUCCESS;
}

int32_t DeviceState::unreserve(Session &s, uint64_t va) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = s.reservations.find(va);
  if (it == s.reservations.end()) return ACL_ERROR_INVALID_PARAM;
  auto m = s.allocs.lower_bound(va);
  if (m != s.allocs.end() && m->first < va + it->second) return ACL_ERROR_INVALID_PARAM;  // unmap first
  s.reservations.erase(it);
  return ACL_SUCCESS;
}

int32_t DeviceState::map(Session &s, uint64_t va, uint64_t size, const std::shared_ptr<Buffer> &phys,
                         uint64_t offset) {
  if (!phys || size == 0 || offset > phys->size || size > phys->size - offset) return ACL_ERROR_INVALID_PARAM;
  std::lock_guard<std::mutex> g(mu_);
  auto r = s.reservations.upper_bound(va);
  if (r == s.reservations.begin()) return ACL_ERROR_INVALID_PARAM;
  --r;
  if (va - r->first >= r->second || size > r->second - (va - r->first)) return ACL_ERROR_INVALID_PARAM;
  auto next = s.allocs.lower_bound(va);
  if (next != s.allocs.end() && next->first < va + size) return ACL_ERROR_INVALID_PARAM;  // already mapped
  if (next != s.allocs.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second->size > va) return ACL_ERROR_INVALID_PARAM;
  }
  auto alias = std::make_shared<Buffer>(va, size, phys->device, phys->base + offset, 0);
  alias->backing = phys->backing ? phys->backing : phys;
  s.allocs[va] = alias;
  return ACL_SUCCESS;
}

int32_t DeviceState::unmap(Session &s, uint64_t va) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = s.allocs.find(va);
  if (it == s.allocs.end() || !it->second->backing) return ACL_ERROR_INVALID_PARAM;
  s.allocs.erase(it);
  return ACL_SUCCESS;
}

std::shared_ptr<Buffer> DeviceState::allocation_at(Session &s, uint64_t va) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = s.allocs.find(va);
  return it == s.allocs.end() || it->second->backing ? nullptr : it->second;
}

std::shared_ptr<Buffer> DeviceState::containing(Session &s, uint64_t va, uint64_t len, uint64_t *offset) {
  std::lock_guard<std::mutex> g(mu_);
  std::shared_ptr<Buffer> b;
  char *p = nullptr;
  if (lookup(s, va, len, &b, &p) != ACL_SUCCESS) return nullptr;
  *offset = va - b->va;
  return b;
}

}  // namespace npusim

// Device virtual address layout, shared by the daemon and the runtime.
//
// A device address has 0b0001 in its top nibble, which is non-canonical on x86-64 with 4- and
// 5-level paging (and outside any arm64 user VA), so the CPU faults if a program dereferences one,
// and no mmap in the client can ever collide with it.
//
//   63..60: 0x1   59..52: device   51..40: window   39..0: offset in the window (1 TiB)
//
// Every client session gets its own randomly chosen window per device. A client restored after a
// daemon restart asks for the same window again, and so gets every allocation back at the same
// address without colliding with clients that connected in the meantime.
#pragma once

#include <cstdint>

namespace npusim::va {

constexpr uint64_t kTag = 1ULL << 60;
constexpr int kDeviceShift = 52;
constexpr int kWindowShift = 40;
constexpr uint32_t kMaxDevices = 256;
constexpr uint32_t kWindows = 4096;
constexpr uint64_t kWindowSize = 1ULL << kWindowShift;
constexpr uint64_t kAlign = 512;  // allocation start alignment (covers the 64-byte D2D rule)
constexpr uint64_t kSizeGranule = 32;  // aclrtMalloc rounds sizes up to this

inline bool is_device(uint64_t a) { return (a >> 60) == 1; }
inline uint32_t device_of(uint64_t a) { return static_cast<uint32_t>((a >> kDeviceShift) & 0xff); }
inline uint32_t window_of(uint64_t a) { return static_cast<uint32_t>((a >> kWindowShift) & 0xfff); }
inline uint64_t offset_of(uint64_t a) { return a & (kWindowSize - 1); }
inline uint64_t make(uint32_t device, uint32_t window, uint64_t offset) {
  return kTag | (uint64_t{device} << kDeviceShift) | (uint64_t{window} << kWindowShift) | offset;
}
inline uint64_t round_size(uint64_t size) { return (size + kSizeGranule - 1) / kSizeGranule * kSizeGranule; }

}  // namespace npusim::va

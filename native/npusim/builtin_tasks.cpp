// Built-in device tasks: 64-bit value writes and waits, and elementwise reductions of two device
// buffers, in the element types CANN's SDMA reduce takes.
#include "builtin_tasks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "acl/acl_base.h"

namespace npusim::builtin {
namespace {

// The reduce kinds (aclrtReduceKind) and stream wait modes (ACL_STREAM_WAIT_VALUE_*), as acl_rt.h
// numbers them; the daemon does not include the client's enums.
enum : uint64_t { kSum = 10, kMax = 11, kMin = 12, kEqual = 13 };
enum : int32_t { kGeq = 0, kEq = 1, kAnd = 2, kNor = 3 };

float half_to_float(uint16_t h) {
  const uint32_t sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float mag = exp == 0 ? std::ldexp(static_cast<float>(man), -24)
              : exp == 0x1f ? (man ? NAN : INFINITY)
                            : std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -mag : mag;
}

uint16_t float_to_half(float f) {  // round to nearest even
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  if (std::isnan(f)) return sign | 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.0f) return sign | 0x7c00;
  if (a < std::ldexp(1.0f, -14)) return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  int e;
  std::frexp(a, &e);
  uint32_t man = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 11 - e)));
  int exp = e + 14;
  if (man == 0x800) { man = 0x400; ++exp; }
  return exp >= 0x1f ? (sign | 0x7c00) : static_cast<uint16_t>(sign | (exp << 10) | (man & 0x3ff));
}

float bf16_to_float(uint16_t b) {
  uint32_t x = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

template <typename T>
T combine(uint64_t kind, T a, T b) {
  switch (kind) {
    case kSum: return static_cast<T>(a + b);
    case kMax: return std::max(a, b);
    case kMin: return std::min(a, b);
    default: return static_cast<T>(a == b ? 1 : 0);  // kEqual
  }
}

template <typename T>
void reduce_as(uint64_t kind, char *dst, const char *src, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, dst + i * sizeof(T), sizeof(T));
    std::memcpy(&b, src + i * sizeof(T), sizeof(T));
    T r = combine(kind, a, b);
    std::memcpy(dst + i * sizeof(T), &r, sizeof(T));
  }
}

template <float (*To)(uint16_t), uint16_t (*From)(float)>
void reduce_16(uint64_t kind, char *dst, const char *src, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, dst + 2 * i, 2);
    std::memcpy(&b, src + 2 * i, 2);
    uint16_t r = From(combine(kind, To(a), To(b)));
    std::memcpy(dst + 2 * i, &r, 2);
  }
}

size_t element_size(uint64_t type) {
  switch (type) {
    case ACL_INT8: case ACL_UINT8: return 1;
    case ACL_INT16: case ACL_UINT16: case ACL_FLOAT16: case ACL_BF16: return 2;
    case ACL_INT32: case ACL_UINT32: case ACL_FLOAT: return 4;
    default: return 0;
  }
}

}  // namespace

bool reduce_ok(const proto::Task &t) {
  const size_t es = element_size(t.n);
  return t.m >= kSum && t.m <= kEqual && es != 0 && t.size % es == 0;
}

int32_t run(Work &w) {
  const proto::Task &t = w.task;
  if (t.kind == proto::TaskKind::ValueWrite) {
    std::memcpy(w.dst, &t.target, sizeof(t.target));
    return ACL_SUCCESS;
  }
  char *dst = w.dst;
  const char *src = w.src;
  const uint64_t n = t.size / element_size(t.n);
  switch (t.n) {
    case ACL_INT8: reduce_as<int8_t>(t.m, dst, src, n); break;
    case ACL_UINT8: reduce_as<uint8_t>(t.m, dst, src, n); break;
    case ACL_INT16: reduce_as<int16_t>(t.m, dst, src, n); break;
    case ACL_UINT16: reduce_as<uint16_t>(t.m, dst, src, n); break;
    case ACL_INT32: reduce_as<int32_t>(t.m, dst, src, n); break;
    case ACL_UINT32: reduce_as<uint32_t>(t.m, dst, src, n); break;
    case ACL_FLOAT: reduce_as<float>(t.m, dst, src, n); break;
    case ACL_FLOAT16: reduce_16<half_to_float, float_to_half>(t.m, dst, src, n); break;
    case ACL_BF16: reduce_16<bf16_to_float, float_to_bf16>(t.m, dst, src, n); break;
    default: return ACL_ERROR_INVALID_PARAM;
  }
  return ACL_SUCCESS;
}

bool value_met(const Work &w) {
  uint64_t v;
  std::memcpy(&v, w.dst, sizeof(v));  // another stream may be writing it: any of its values will do
  const uint64_t want = w.task.target;
  switch (w.task.value) {
    case kGeq: return v >= want;
    case kEq: return v == want;
    case kAnd: return (v & want) != 0;
    default: return ~(v | want) != 0;  // kNor
  }
}

}  // namespace npusim::builtin

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

}  // namespace

// fp16 and bf16 <-> float, round to nearest even (also HCCL's reductions: hccl_reduce.cpp).
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

namespace {

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

// Bytes per element of the types the built-in tasks take (0 for any other).
uint64_t type_size(uint64_t type) {
  switch (type) {
    case ACL_INT8: case ACL_UINT8: return 1;
    case ACL_INT16: case ACL_UINT16: case ACL_FLOAT16: case ACL_BF16: return 2;
    case ACL_INT32: case ACL_UINT32: case ACL_FLOAT: return 4;
    case ACL_INT64: case ACL_UINT64: return 8;
    default: return 0;
  }
}

// Reductions take elements of at most 32 bits.
size_t element_size(uint64_t type) { return type == ACL_INT64 || type == ACL_UINT64 ? 0 : type_size(type); }

// Random numbers: number i of a stream with a given seed is a hash of (seed, counter + i), so a
// task's results depend only on its seed and the counter, which advances by the numbers drawn.
enum : uint64_t { kDropout = 0, kUniform = 1, kNormal = 2, kTruncatedNormal = 3 };

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double unit(uint64_t seed, uint64_t n, uint64_t salt) {  // in [0, 1)
  return static_cast<double>(mix64(seed ^ mix64(n * 2 + salt)) >> 11) * 0x1.0p-53;
}

// A parameter's value: its bytes hold a number of the task's data type.
double param(uint64_t bits, uint64_t type) {
  switch (type) {
    case ACL_FLOAT: { float f; std::memcpy(&f, &bits, 4); return f; }
    case ACL_FLOAT16: return half_to_float(static_cast<uint16_t>(bits));
    case ACL_BF16: return bf16_to_float(static_cast<uint16_t>(bits));
    case ACL_INT32: return static_cast<int32_t>(bits);
    case ACL_UINT32: return static_cast<uint32_t>(bits);
    case ACL_INT64: return static_cast<double>(static_cast<int64_t>(bits));
    default: return static_cast<double>(bits);  // ACL_UINT64
  }
}

void store(char *dst, uint64_t i, uint64_t type, double v) {
  switch (type) {
    case ACL_FLOAT: { float f = static_cast<float>(v); std::memcpy(dst + 4 * i, &f, 4); break; }
    case ACL_FLOAT16: { uint16_t h = float_to_half(static_cast<float>(v)); std::memcpy(dst + 2 * i, &h, 2); break; }
    case ACL_BF16: { uint16_t b = float_to_bf16(static_cast<float>(v)); std::memcpy(dst + 2 * i, &b, 2); break; }
    default: break;
  }
}

// A uniformly drawn integer of [lo, hi) (lo when the range is empty).
template <typename T>
void store_int(char *dst, uint64_t i, uint64_t bits_lo, uint64_t bits_hi, uint64_t r) {
  T lo, hi;
  std::memcpy(&lo, &bits_lo, sizeof(T));
  std::memcpy(&hi, &bits_hi, sizeof(T));
  const uint64_t span = hi > lo ? static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) : 0;
  T v = span ? static_cast<T>(static_cast<uint64_t>(lo) + r % span) : lo;
  std::memcpy(dst + sizeof(T) * i, &v, sizeof(T));
}

void random_run(Work &w) {
  const proto::Task &t = w.task;
  char *counter_at = const_cast<char *>(w.src);
  uint64_t counter;
  std::memcpy(&counter, counter_at, sizeof(counter));
  const uint64_t seed = t.src2, type = t.m, func = t.n;
  if (func == kDropout) {  // bit i set: element i is kept (with probability 1 - ratio)
    const double ratio = param(t.k, type);
    std::memset(w.dst, 0, (t.size + 7) / 8);
    for (uint64_t i = 0; i < t.size; ++i)
      if (unit(seed, counter + i, 0) >= ratio) w.dst[i / 8] = static_cast<char>(w.dst[i / 8] | (1 << (i % 8)));
  } else if (func == kUniform && (type == ACL_INT32 || type == ACL_UINT32 || type == ACL_INT64 || type == ACL_UINT64)) {
    for (uint64_t i = 0; i < t.size; ++i) {
      const uint64_t r = mix64(seed ^ mix64(counter + i));
      if (type == ACL_INT32) store_int<int32_t>(w.dst, i, t.k, t.target, r);
      else if (type == ACL_UINT32) store_int<uint32_t>(w.dst, i, t.k, t.target, r);
      else if (type == ACL_INT64) store_int<int64_t>(w.dst, i, t.k, t.target, r);
      else store_int<uint64_t>(w.dst, i, t.k, t.target, r);
    }
  } else if (func == kUniform) {
    const double lo = param(t.k, type), hi = param(t.target, type);
    for (uint64_t i = 0; i < t.size; ++i) store(w.dst, i, type, lo + (hi - lo) * unit(seed, counter + i, 0));
  } else {  // normal: Box-Muller; truncated: redrawn until within two standard deviations
    const double mean = param(t.k, type), stddev = param(t.target, type);
    for (uint64_t i = 0; i < t.size; ++i) {
      double z = 0;
      for (uint64_t attempt = 0; attempt < 64; ++attempt) {
        const double u1 = 1.0 - unit(seed, counter + i, 2 * attempt + 1), u2 = unit(seed, counter + i, 2 * attempt + 2);
        z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
        if (func != kTruncatedNormal || std::fabs(z) <= 2.0) break;
      }
      store(w.dst, i, type, mean + stddev * z);
    }
  }
  counter += t.size;
  std::memcpy(counter_at, &counter, sizeof(counter));
}

}  // namespace

uint64_t random_bytes(const proto::Task &t) {
  const uint64_t n = t.size;
  if (n == 0 || n > (1ULL << 32)) return 0;
  const bool floating = t.m == ACL_FLOAT || t.m == ACL_FLOAT16 || t.m == ACL_BF16;
  switch (t.n) {
    case kDropout: return floating ? (n + 7) / 8 : 0;
    case kUniform: return floating || t.m == ACL_INT32 || t.m == ACL_UINT32 || t.m == ACL_INT64 || t.m == ACL_UINT64
                              ? n * type_size(t.m) : 0;
    case kNormal:
    case kTruncatedNormal: return floating ? n * type_size(t.m) : 0;
    default: return 0;
  }
}

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
  if (t.kind == proto::TaskKind::RandomNum) {
    random_run(w);
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

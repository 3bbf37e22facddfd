#include "hccl_reduce.h"

#include <cstring>
#include <type_traits>

#include "builtin_tasks.h"
#include "hccl/hccl_types.h"

namespace npusim::hccl {
namespace {

template <typename T>
T combine(uint32_t op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;  // signed overflow wraps instead of being undefined
    if (op == HCCL_REDUCE_SUM) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    if (op == HCCL_REDUCE_PROD) return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    if (op == HCCL_REDUCE_SUM) return a + b;
    if (op == HCCL_REDUCE_PROD) return a * b;
  }
  if (op == HCCL_REDUCE_MAX) return a < b ? b : a;
  return b < a ? b : a;  // HCCL_REDUCE_MIN
}

template <typename T>
void fold_as(uint32_t op, char *acc, const char *x, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, x + i * sizeof(T), sizeof(T));
    const T r = combine(op, a, b);
    std::memcpy(acc + i * sizeof(T), &r, sizeof(T));
  }
}

template <float (*To)(uint16_t), uint16_t (*From)(float)>
void fold_16(uint32_t op, char *acc, const char *x, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, acc + 2 * i, 2);
    std::memcpy(&b, x + 2 * i, 2);
    const uint16_t r = From(combine(op, To(a), To(b)));
    std::memcpy(acc + 2 * i, &r, 2);
  }
}

}  // namespace

void fold(uint32_t dtype, uint32_t op, char *acc, const char *x, uint64_t n) {
  switch (dtype) {
    case HCCL_DATA_TYPE_INT8: return fold_as<int8_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_UINT8: return fold_as<uint8_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_INT16: return fold_as<int16_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_UINT16: return fold_as<uint16_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_INT32: return fold_as<int32_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_UINT32: return fold_as<uint32_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_INT64: return fold_as<int64_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_UINT64: return fold_as<uint64_t>(op, acc, x, n);
    case HCCL_DATA_TYPE_FP32: return fold_as<float>(op, acc, x, n);
    case HCCL_DATA_TYPE_FP64: return fold_as<double>(op, acc, x, n);
    case HCCL_DATA_TYPE_FP16: return fold_16<builtin::half_to_float, builtin::float_to_half>(op, acc, x, n);
    case HCCL_DATA_TYPE_BFP16: return fold_16<builtin::bf16_to_float, builtin::float_to_bf16>(op, acc, x, n);
    default: return;
  }
}

}  // namespace npusim::hccl

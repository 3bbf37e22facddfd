// HCCL's reductions, element by element, deterministic: the root folds the ranks' inputs in rank
// order (acc = in[0]; acc = acc OP in[1]; ...), so a float sum is the same on every run.
#pragma once

#include <cstdint>

#include "hccl/hccl_types.h"

namespace npusim::hccl {

// Bytes per element of an HcclDataType npusim supports (0: not supported, e.g. INT128).
inline uint64_t dtype_size(uint32_t dtype) {
  switch (dtype) {
    case HCCL_DATA_TYPE_INT8: case HCCL_DATA_TYPE_UINT8: return 1;
    case HCCL_DATA_TYPE_INT16: case HCCL_DATA_TYPE_UINT16: case HCCL_DATA_TYPE_FP16: case HCCL_DATA_TYPE_BFP16: return 2;
    case HCCL_DATA_TYPE_INT32: case HCCL_DATA_TYPE_UINT32: case HCCL_DATA_TYPE_FP32: return 4;
    case HCCL_DATA_TYPE_INT64: case HCCL_DATA_TYPE_UINT64: case HCCL_DATA_TYPE_FP64: return 8;
    default: return 0;
  }
}
// Whether op is an HcclReduceOp npusim supports (sum, prod, max, min).
inline bool op_ok(uint32_t op) { return op <= HCCL_REDUCE_MIN; }
// acc[i] = acc[i] OP x[i] for n elements of dtype. Integers wrap around (two's complement) on
// sum and prod; fp16 and bf16 are computed in float and rounded to nearest even after each step;
// max(a, b) is (a < b ? b : a) and min(a, b) is (b < a ? b : a).
void fold(uint32_t dtype, uint32_t op, char *acc, const char *x, uint64_t n);

}  // namespace npusim::hccl

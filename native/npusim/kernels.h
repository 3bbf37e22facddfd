// The software NPU's compute kernels: plain float32 loops on daemon-side device memory.
#pragma once

#include <cstddef>

namespace npusim::kernels {

void fill(float *dst, size_t count, float value);
void axpy(size_t n, float alpha, const float *x, float *y);
// c[m,n] = a[m,k] . b[k,n], row-major.
void matmul(size_t m, size_t n, size_t k, const float *a, const float *b, float *c);

}  // namespace npusim::kernels

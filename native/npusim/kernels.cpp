#include "kernels.h"

#include <algorithm>

namespace npusim::kernels {

void fill(float *dst, size_t count, float value) { std::fill(dst, dst + count, value); }

void axpy(size_t n, float alpha, const float *x, float *y) {
  for (size_t i = 0; i < n; ++i) y[i] = alpha * x[i] + y[i];
}

void matmul(size_t m, size_t n, size_t k, const float *a, const float *b, float *c) {
  // i-p-j order: the inner loop streams rows of b and c, which the compiler vectorizes.
  for (size_t i = 0; i < m; ++i) {
    float *crow = c + i * n;
    std::fill(crow, crow + n, 0.0f);
    for (size_t p = 0; p < k; ++p) {
      const float aip = a[i * k + p];
      const float *brow = b + p * n;
      for (size_t j = 0; j < n; ++j) crow[j] += aip * brow[j];
    }
  }
}

}  // namespace npusim::kernels

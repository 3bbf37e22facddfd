/* The device binary behind libopapi.so's operators: npusim kernels (npusim/kernel.h), loaded with
 * aclrtBinaryLoadFromFile like any application's. Each block takes one contiguous slice. */
#include <stdint.h>

#include "npusim/kernel.h"

/* Must match ops.cpp. */
struct npusim_binop_args {
    uint64_t self, other, out, count;
    double alpha;
    uint32_t op;    /* 0: out = self + alpha * other, 1: out = self * other */
    uint32_t dtype; /* 0: float32, 3: int32 (aclDataType) */
};

void npusim_binop(npusimKernelCtx *ctx, const void *raw, size_t size) {
    const struct npusim_binop_args *a = raw;
    if (size < sizeof(*a)) return;
    const uint64_t blocks = npusimKernelNumBlocks(ctx), b = npusimKernelBlockIdx(ctx);
    const uint64_t per = (a->count + blocks - 1) / blocks, lo = b * per;
    if (lo >= a->count) return;
    const uint64_t n = a->count - lo < per ? a->count - lo : per;
    const uint64_t off = lo * 4, len = n * 4;
    void *x = npusimKernelGm(ctx, a->self + off, len), *y = npusimKernelGm(ctx, a->other + off, len);
    void *z = npusimKernelGm(ctx, a->out + off, len);
    if (x == 0 || y == 0 || z == 0) return; /* checked by the host side: not reached */
    if (a->dtype == 0) {
        const float *fx = x, *fy = y;
        float *fz = z;
        const float alpha = (float)a->alpha;
        for (uint64_t i = 0; i < n; i++) fz[i] = a->op == 0 ? fx[i] + alpha * fy[i] : fx[i] * fy[i];
    } else {
        const int32_t *ix = x, *iy = y;
        int32_t *iz = z;
        const int32_t alpha = (int32_t)a->alpha;
        for (uint64_t i = 0; i < n; i++) iz[i] = a->op == 0 ? ix[i] + alpha * iy[i] : ix[i] * iy[i];
    }
}

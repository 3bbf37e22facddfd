/* An npusim device binary (npusim/kernel.h) for the tests: a few kernels, built with
 * cc -shared -fPIC -I$ASCEND_TOOLKIT_HOME/include. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <npusim/kernel.h>

/* This block's slice [lo, hi) of n elements. */
static int slice(npusimKernelCtx *ctx, uint64_t n, uint64_t *lo, uint64_t *hi) {
    uint64_t blocks = npusimKernelNumBlocks(ctx), per = (n + blocks - 1) / blocks;
    *lo = npusimKernelBlockIdx(ctx) * per;
    *hi = *lo + per < n ? *lo + per : n;
    return *lo < *hi;
}

struct vadd_args { uint64_t x, y, z, n; };

/* z = x + y */
void vadd(npusimKernelCtx *ctx, const void *raw, size_t size) {
    const struct vadd_args *a = raw;
    uint64_t lo, hi;
    if (size != sizeof(*a) || !slice(ctx, a->n, &lo, &hi)) return;
    const float *x = npusimKernelGm(ctx, a->x + lo * 4, (hi - lo) * 4);
    const float *y = npusimKernelGm(ctx, a->y + lo * 4, (hi - lo) * 4);
    float *z = npusimKernelGm(ctx, a->z + lo * 4, (hi - lo) * 4);
    if (x && y && z)
        for (uint64_t i = 0; i < hi - lo; i++) z[i] = x[i] + y[i];
}

/* y = scale * x + bias, with {scale, bias} behind a pointer (a placeholder's data). */
struct affine_args { uint64_t x, y, n, params; };

void affine(npusimKernelCtx *ctx, const void *raw, size_t size) {
    const struct affine_args *a = raw;
    uint64_t lo, hi;
    /* More bytes: aclrtLaunchKernelWithHostArgs passes the placeholder data after the arguments. */
    if (size < sizeof(*a) || !slice(ctx, a->n, &lo, &hi)) return;
    const float *p = npusimKernelGm(ctx, a->params, 2 * sizeof(float));
    const float *x = npusimKernelGm(ctx, a->x + lo * 4, (hi - lo) * 4);
    float *y = npusimKernelGm(ctx, a->y + lo * 4, (hi - lo) * 4);
    if (p && x && y)
        for (uint64_t i = 0; i < hi - lo; i++) y[i] = p[0] * x[i] + p[1];
}

/* out[b] = 1 + b for every block b; out[blocks + k] = what npusimKernelGm says about bad ranges. */
struct probe_args { uint64_t out, bytes; };

void probe(npusimKernelCtx *ctx, const void *raw, size_t size) {
    const struct probe_args *a = raw;
    if (size != sizeof(*a)) return;
    uint32_t b = npusimKernelBlockIdx(ctx), blocks = npusimKernelNumBlocks(ctx);
    int32_t *out = npusimKernelGm(ctx, a->out, a->bytes);
    if (out == NULL) return;
    out[b] = (int32_t)(1 + b);
    if (b == 0) {
        out[blocks + 0] = npusimKernelGm(ctx, a->out + a->bytes, 1) == NULL;   /* past the allocation */
        out[blocks + 1] = npusimKernelGm(ctx, a->out + 8, a->bytes) == NULL;   /* runs over its end */
        out[blocks + 2] = npusimKernelGm(ctx, 0x1000, 4) == NULL;              /* a host address */
    }
}

/* Who runs this kernel, and may it open path for writing? out: {uid, gid, opened, errno}. */
struct whoami_args { uint64_t out; char path[240]; };

void whoami(npusimKernelCtx *ctx, const void *raw, size_t size) {
    const struct whoami_args *a = raw;
    if (size != sizeof(*a)) return;
    int32_t *out = npusimKernelGm(ctx, a->out, 4 * sizeof(int32_t));
    if (out == NULL) return;
    out[0] = (int32_t)getuid();
    out[1] = (int32_t)getgid();
    int fd = open(a->path, O_WRONLY | O_APPEND);
    out[2] = fd >= 0;
    out[3] = fd >= 0 ? 0 : errno;
    if (fd >= 0) {
        (void)!write(fd, "written by a kernel\n", 20);
        close(fd);
    }
}

/* Writes to the host address in its arguments (0 from the test): the runner dies, the daemon
 * and the client must not. */
void crash(npusimKernelCtx *ctx, const void *raw, size_t size) {
    (void)ctx;
    uint64_t addr = 0;
    if (size >= sizeof addr) memcpy(&addr, raw, sizeof addr);
    *(volatile int *)(uintptr_t)addr = 1;
}

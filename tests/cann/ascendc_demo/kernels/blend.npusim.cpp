// The npusim implementation of blend.cpp's kernel (npusim/kernel.h): z = 0.5 * z + x, one slice
// per block. Arguments as aclrtlaunch_blend packs them: x, z (device addresses), n.
#include <cstdint>
#include <cstring>

#include "npusim/kernel.h"

extern "C" void blend(npusimKernelCtx* ctx, const void* args, size_t size)
{
    uint64_t x = 0, z = 0;
    uint32_t n = 0;
    if (size < 20) return;
    std::memcpy(&x, args, 8);
    std::memcpy(&z, static_cast<const char*>(args) + 8, 8);
    std::memcpy(&n, static_cast<const char*>(args) + 16, 4);
    const auto* px = static_cast<const float*>(npusimKernelGm(ctx, x, n * sizeof(float)));
    auto* pz = static_cast<float*>(npusimKernelGm(ctx, z, n * sizeof(float)));
    if (px == nullptr || pz == nullptr) __builtin_trap();
    const uint32_t blocks = npusimKernelNumBlocks(ctx), b = npusimKernelBlockIdx(ctx);
    for (uint32_t i = n * b / blocks; i < n * (b + 1) / blocks; ++i) pz[i] = 0.5f * pz[i] + px[i];
}

// z = 0.5 * z + x with a cube-unit call that npusim's kernel_operator.h does not emulate: npusim
// runs blend.npusim.cpp instead (the npusim kernel of the same name and arguments).
#include "kernel_operator.h"
#include "demo_kernels.h"

extern "C" __global__ __aicore__ void blend(GM_ADDR x, GM_ADDR z, uint32_t n)
{
    AscendC::LocalTensor<float> t;
    AscendC::Mmad(t, t, t, n);
}

uint32_t BlendDo(uint32_t blockDim, void* stream, float* x, float* z, uint32_t n)
{
    return blend<<<blockDim, nullptr, stream>>>(x, z, n);
}

// A kernel npusim cannot run: its API is not emulated and no missing.npusim.cpp is given, so the
// library builds and its launch fails with a message naming it.
#include "kernel_operator.h"
#include "demo_kernels.h"

extern "C" __global__ __aicore__ void missing_kernel(GM_ADDR x)
{
    AscendC::LocalTensor<float> t;
    AscendC::Mmad(t, t, t, 1);
}

uint32_t MissingDo(uint32_t blockDim, void* stream, float* x) { return missing_kernel<<<blockDim, nullptr, stream>>>(x); }

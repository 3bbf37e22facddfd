// A kernel that prints: each block's AscendC::printf line reaches the program's stdout once the
// kernel has run (npusim's print buffer, as CANN's device printf).
#include "kernel_operator.h"
#include "demo_kernels.h"

extern "C" __global__ __aicore__ void greet(uint32_t tag)
{
    AscendC::printf("greet %u from block %ld of %ld\n", tag, AscendC::GetBlockIdx(), AscendC::GetBlockNum());
}

uint32_t GreetDo(uint32_t blockDim, void* stream, uint32_t tag) { return greet<<<blockDim, nullptr, stream>>>(tag); }

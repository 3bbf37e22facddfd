// The host wrappers of kernels/*.cpp (their <<<>>> launches).
#ifndef DEMO_KERNELS_H_
#define DEMO_KERNELS_H_
#include <cstdint>
uint32_t ScaleAddDo(uint32_t blockDim, void *stream, float *x, float *y, float *z, float alpha, uint32_t n);
uint32_t BlendDo(uint32_t blockDim, void *stream, float *x, float *z, uint32_t n);
uint32_t MissingDo(uint32_t blockDim, void *stream, float *x);
uint32_t GreetDo(uint32_t blockDim, void *stream, uint32_t tag);
#endif

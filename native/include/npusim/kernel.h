/*
 * npusim: the device-binary contract. An npusim device binary is an ELF shared object built for
 * the host (cc -shared -fPIC kernels.c -I$ASCEND_TOOLKIT_HOME/include); each kernel is an
 * exported function
 *
 *     extern "C" void NAME(npusimKernelCtx *ctx, const void *args, size_t argsSize);
 *
 * loaded with aclrtBinaryLoadFromFile / aclrtBinaryLoadFromData, found with
 * aclrtBinaryGetFunction and queued with aclrtLaunchKernel* on a stream. It is called once per
 * block (numBlocks of the launch), blocks in parallel; args are the launch's argument bytes
 * (device addresses and values, as appended with aclrtKernelArgsAppend).
 *
 * A kernel runs in a kernel runner process with the rights of the process that loaded it, never
 * with the device daemon's: it can do nothing its client could not do itself.
 */
#ifndef NPUSIM_KERNEL_H_
#define NPUSIM_KERNEL_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct npusimKernelCtx npusimKernelCtx;

/* This block's index, 0 .. numBlocks-1. */
uint32_t npusimKernelBlockIdx(const npusimKernelCtx *ctx);
/* The launch's number of blocks. */
uint32_t npusimKernelNumBlocks(const npusimKernelCtx *ctx);
/* A host pointer to len bytes of device memory at devAddr, or NULL when that range is not inside
 * one allocation of the launching process. */
void *npusimKernelGm(npusimKernelCtx *ctx, uint64_t devAddr, size_t len);

#ifdef __cplusplus
}
#endif

#endif /* NPUSIM_KERNEL_H_ */

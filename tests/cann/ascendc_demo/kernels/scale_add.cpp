// z = alpha * x + y, the AscendC way: each block copies tiles of its slice into queue buffers,
// computes on them and copies the result out. Built for npusim against its kernel_operator.h.
#include "kernel_operator.h"
#include "demo_kernels.h"

#ifndef DEMO_TILE
#error DEMO_TILE comes from ascendc_compile_definitions
#endif

namespace {
constexpr int32_t BUFFER_NUM = 2;
constexpr uint32_t TILE = DEMO_TILE;

class ScaleAdd {
public:
    __aicore__ inline void Init(GM_ADDR x, GM_ADDR y, GM_ADDR z, float alpha, uint32_t n)
    {
        per_ = n / AscendC::GetBlockNum();
        const uint32_t start = per_ * AscendC::GetBlockIdx();
        alpha_ = alpha;
        xg_.SetGlobalBuffer((__gm__ float*)x + start, per_);
        yg_.SetGlobalBuffer((__gm__ float*)y + start, per_);
        zg_.SetGlobalBuffer((__gm__ float*)z + start, per_);
        pipe_.InitBuffer(qx_, BUFFER_NUM, TILE * sizeof(float));
        pipe_.InitBuffer(qy_, BUFFER_NUM, TILE * sizeof(float));
        pipe_.InitBuffer(qz_, BUFFER_NUM, TILE * sizeof(float));
    }
    __aicore__ inline void Process()
    {
        for (uint32_t off = 0; off < per_; off += TILE) {
            const uint32_t len = per_ - off < TILE ? per_ - off : TILE;
            AscendC::LocalTensor<float> a = qx_.AllocTensor<float>();
            AscendC::LocalTensor<float> b = qy_.AllocTensor<float>();
            AscendC::DataCopy(a, xg_[off], len);
            AscendC::DataCopy(b, yg_[off], len);
            qx_.EnQue(a);
            qy_.EnQue(b);
            a = qx_.DeQue<float>();
            b = qy_.DeQue<float>();
            AscendC::LocalTensor<float> c = qz_.AllocTensor<float>();
            AscendC::Muls(c, a, alpha_, len);
            AscendC::Add(c, c, b, len);
            qz_.EnQue<float>(c);
            qx_.FreeTensor(a);
            qy_.FreeTensor(b);
            c = qz_.DeQue<float>();
            AscendC::DataCopy(zg_[off], c, len);
            qz_.FreeTensor(c);
        }
    }

private:
    AscendC::TPipe pipe_;
    AscendC::TQue<AscendC::QuePosition::VECIN, BUFFER_NUM> qx_, qy_;
    AscendC::TQue<AscendC::QuePosition::VECOUT, BUFFER_NUM> qz_;
    AscendC::GlobalTensor<float> xg_, yg_, zg_;
    uint32_t per_ = 0;
    float alpha_ = 0;
};
} // namespace

extern "C" __global__ __aicore__ void scale_add(GM_ADDR x, GM_ADDR y, GM_ADDR z, float alpha, uint32_t n)
{
    ScaleAdd op;
    op.Init(x, y, z, alpha, n);
    op.Process();
}

uint32_t ScaleAddDo(uint32_t blockDim, void* stream, float* x, float* y, float* z, float alpha, uint32_t n)
{
    return scale_add<<<blockDim, nullptr, stream>>>(x, y, z, alpha, n);
}

// npusim's host emulation of the AscendC kernel API (kernel_operator.h), a small subset: enough for
// the vector kernels of the add_custom kind (GlobalTensor, LocalTensor, TPipe, TQue/TBuf, DataCopy,
// element-wise vector operations, GetBlockIdx) and for scalar kernels that index __gm__ pointers.
// ascendc.cmake compiles a kernel source against it with the host compiler into an npusim device
// binary (npusim/kernel.h). Semantics are those of one AI core run in program order: queues and
// pipe synchronisation order nothing that is not already ordered, so they only hand buffers
// around. A kernel this subset cannot compile gets no npusim implementation (ascendc.cmake says
// so) unless the project supplies one (SOURCE.npusim.cpp).
#ifndef NPUSIM_ASCENDC_KERNEL_OPERATOR_H_
#define NPUSIM_ASCENDC_KERNEL_OPERATOR_H_

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <type_traits>
#include <vector>

#include "npusim/kernel.h"

#define __global__
#define __aicore__
#define __gm__
#define __ubuf__
#define __cbuf__
#define __ca__
#define __cb__
#define __cc__
#define GM_ADDR uint8_t *

using half = _Float16;

// The running block, as the device's block_idx / block_num registers: blocks run on threads.
inline thread_local int64_t block_idx = 0;
inline thread_local int64_t block_num = 1;

enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_ALL };

namespace npusim_ascendc {

inline thread_local npusimKernelCtx *t_ctx = nullptr;

struct BlockScope {
  explicit BlockScope(npusimKernelCtx *ctx) {
    t_ctx = ctx;
    block_idx = npusimKernelBlockIdx(ctx);
    block_num = npusimKernelNumBlocks(ctx);
  }
  ~BlockScope() { t_ctx = nullptr; }
};

// A device address argument as a host pointer into the allocation it points into (the runner
// maps each allocation whole, so pointer arithmetic inside it stays valid). An address outside
// every allocation stays what it was: touching it faults, as on the device.
template <typename T>
T take_pointer(npusimKernelCtx *ctx, const void *args, size_t size, size_t &off) {
  uint64_t addr = 0;
  if (off + sizeof(addr) <= size) std::memcpy(&addr, static_cast<const char *>(args) + off, sizeof(addr));
  off += sizeof(addr);
  if (addr == 0) return nullptr;
  void *host = npusimKernelGm(ctx, addr, 1);
  return reinterpret_cast<T>(host != nullptr ? reinterpret_cast<uintptr_t>(host) : static_cast<uintptr_t>(addr));
}

template <typename T>
T take_value(npusimKernelCtx *, const void *args, size_t size, size_t &off) {
  T v{};
  if (off + sizeof(T) <= size) std::memcpy(&v, static_cast<const char *>(args) + off, sizeof(T));
  off += sizeof(T);
  return v;
}

// AscendC::printf's target: the launch's print buffer (npusimAscendcLaunch's last argument),
// {uint64 used, uint64 capacity} then the text; blocks append to it atomically.
inline thread_local unsigned char *t_print = nullptr;

struct PrintScope {
  PrintScope(npusimKernelCtx *ctx, const void *args, size_t size, size_t &off) {
    uint64_t addr = 0;
    if (off + sizeof(addr) <= size) std::memcpy(&addr, static_cast<const char *>(args) + off, sizeof(addr));
    off += sizeof(addr);
    auto *head = static_cast<uint64_t *>(addr != 0 ? npusimKernelGm(ctx, addr, 2 * sizeof(uint64_t)) : nullptr);
    if (head != nullptr && npusimKernelGm(ctx, addr, 2 * sizeof(uint64_t) + head[1]) != nullptr)
      t_print = reinterpret_cast<unsigned char *>(head);
  }
  ~PrintScope() { t_print = nullptr; }
};

inline void print_formatted(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
inline void print_formatted(const char *fmt, ...) {
  if (t_print == nullptr) return;  // not launched through aclrtlaunch_*: nowhere to print
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = std::vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  const uint64_t len = static_cast<uint64_t>(n) < sizeof text ? static_cast<uint64_t>(n) : sizeof text - 1;
  auto *head = reinterpret_cast<uint64_t *>(t_print);
  const uint64_t at = __atomic_fetch_add(&head[0], len, __ATOMIC_RELAXED);
  if (at + len <= head[1]) std::memcpy(t_print + 2 * sizeof(uint64_t) + at, text, len);
}

// A host wrapper's <<<>>> launch compiled into the device binary, where nothing calls it.
template <typename... A>
uint32_t no_launch(A &&...) {
  return 1;
}

}  // namespace npusim_ascendc

namespace AscendC {

inline int64_t GetBlockIdx() { return block_idx; }
inline int64_t GetBlockNum() { return block_num; }
inline int64_t GetSubBlockIdx() { return 0; }
inline int64_t GetTaskRation() { return 1; }

enum class TPosition { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC, SPM, SHM, TSCM, MAX };
using QuePosition = TPosition;
enum class HardEvent { MTE2_MTE1, MTE1_MTE2, MTE1_M, M_MTE1, MTE2_V, V_MTE2, MTE3_V, V_MTE3, M_V, V_M, V_V,
                       MTE3_MTE1, MTE1_MTE3, MTE1_V, MTE2_M, M_MTE2, V_MTE1, M_FIX, FIX_M, MTE3_MTE2,
                       MTE2_MTE3, S_V, V_S, S_MTE2, MTE2_S, S_MTE3, MTE3_S, MTE2_FIX, FIX_MTE2, FIX_S,
                       M_S, FIX_MTE3, MTE1_FIX, FIX_MTE1, FIX_FIX, MAX };

// One core runs in program order: barriers and flags have nothing left to order.
template <pipe_t pipe>
inline void PipeBarrier() {}
template <HardEvent event>
inline void SetFlag(int32_t) {}
template <HardEvent event>
inline void WaitFlag(int32_t) {}
inline void SyncAll() {}

template <typename T>
class LocalTensor {
 public:
  LocalTensor() = default;
  LocalTensor(T *data, uint32_t size) : data_(data), size_(size) {}
  LocalTensor operator[](uint32_t offset) const { return LocalTensor(data_ + offset, size_ > offset ? size_ - offset : 0); }
  T GetValue(uint32_t i) const { return data_[i]; }
  void SetValue(uint32_t i, T v) const { data_[i] = v; }
  T &operator()(uint32_t i) const { return data_[i]; }
  uint32_t GetSize() const { return size_; }
  T *GetPhyAddr() const { return data_; }
  template <typename U>
  LocalTensor<U> ReinterpretCast() const {
    return LocalTensor<U>(reinterpret_cast<U *>(data_), static_cast<uint32_t>(size_ * sizeof(T) / sizeof(U)));
  }

 private:
  T *data_ = nullptr;
  uint32_t size_ = 0;
};

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(T *buffer, uint64_t size = 0) {
    data_ = buffer;
    size_ = size;
  }
  GlobalTensor operator[](uint64_t offset) const {
    GlobalTensor g;
    g.SetGlobalBuffer(data_ + offset, size_ > offset ? size_ - offset : 0);
    return g;
  }
  T GetValue(uint64_t i) const { return data_[i]; }
  void SetValue(uint64_t i, T v) const { data_[i] = v; }
  T &operator()(uint64_t i) const { return data_[i]; }
  uint64_t GetSize() const { return size_; }
  T *GetPhyAddr() const { return data_; }
  T *GetPhyAddr(uint64_t offset) const { return data_ + offset; }

 private:
  T *data_ = nullptr;
  uint64_t size_ = 0;
};

// Buffers handed out in turn by a queue: AllocTensor takes a free one, EnQue/DeQue pass it on in
// FIFO order, FreeTensor gives it back.
class QueueStore {
 public:
  void init(uint32_t num, uint32_t len) {
    len_ = (len + 31) / 32 * 32;
    storage_.assign(static_cast<size_t>(num) * len_ + 64, 0);
    free_.clear();
    for (uint32_t i = 0; i < num; ++i) free_.push_back(aligned() + static_cast<size_t>(i) * len_);
  }
  template <typename T>
  LocalTensor<T> alloc() {
    if (free_.empty()) __builtin_trap();  // more tensors allocated than the queue was given
    unsigned char *b = free_.front();
    free_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T *>(b), len_ / sizeof(T));
  }
  template <typename T>
  void enque(const LocalTensor<T> &t) { queued_.push_back(reinterpret_cast<unsigned char *>(t.GetPhyAddr())); }
  template <typename T>
  LocalTensor<T> deque() {
    if (queued_.empty()) __builtin_trap();  // DeQue with nothing queued
    unsigned char *b = queued_.front();
    queued_.pop_front();
    return LocalTensor<T>(reinterpret_cast<T *>(b), len_ / sizeof(T));
  }
  template <typename T>
  void release(const LocalTensor<T> &t) { free_.push_back(reinterpret_cast<unsigned char *>(t.GetPhyAddr())); }
  template <typename T>
  LocalTensor<T> whole(uint32_t count) {
    return LocalTensor<T>(reinterpret_cast<T *>(aligned()), count != 0 ? count : len_ / sizeof(T));
  }

 private:
  unsigned char *aligned() {
    auto p = reinterpret_cast<uintptr_t>(storage_.data());
    return reinterpret_cast<unsigned char *>((p + 63) & ~static_cast<uintptr_t>(63));
  }
  std::vector<unsigned char> storage_;
  std::deque<unsigned char *> free_, queued_;
  uint32_t len_ = 0;
};

template <TPosition pos, int32_t depth = 1>
class TQue {
 public:
  template <typename T>
  LocalTensor<T> AllocTensor() { return store_.alloc<T>(); }
  template <typename T>
  void EnQue(const LocalTensor<T> &t) { store_.enque(t); }
  template <typename T>
  LocalTensor<T> DeQue() { return store_.deque<T>(); }
  template <typename T>
  void FreeTensor(LocalTensor<T> &t) { store_.release(t); }
  QueueStore store_;
};

template <TPosition src, TPosition dst, int32_t depth = 1>
class TQueBind : public TQue<src, depth> {};

template <TPosition pos = TPosition::VECCALC>
class TBuf {
 public:
  template <typename T>
  LocalTensor<T> Get(uint32_t count = 0) { return store_.whole<T>(count); }
  QueueStore store_;
};

class TPipe {
 public:
  template <class Q>
  void InitBuffer(Q &que, uint32_t num, uint32_t len) { que.store_.init(num, len); }
  template <TPosition pos>
  void InitBuffer(TBuf<pos> &buf, uint32_t len) { buf.store_.init(1, len); }
  void Destroy() {}
  void Reset() {}
};

template <typename T>
inline void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, uint32_t count) {
  std::memcpy(dst.GetPhyAddr(), src.GetPhyAddr(), static_cast<size_t>(count) * sizeof(T));
}
template <typename T>
inline void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, uint32_t count) {
  std::memcpy(dst.GetPhyAddr(), src.GetPhyAddr(), static_cast<size_t>(count) * sizeof(T));
}
template <typename T>
inline void DataCopy(const LocalTensor<T> &dst, const LocalTensor<T> &src, uint32_t count) {
  std::memmove(dst.GetPhyAddr(), src.GetPhyAddr(), static_cast<size_t>(count) * sizeof(T));
}

namespace detail {
template <typename T, typename F>
inline void binary(const LocalTensor<T> &dst, const LocalTensor<T> &a, const LocalTensor<T> &b, int32_t n, F f) {
  T *d = dst.GetPhyAddr();
  const T *x = a.GetPhyAddr();
  const T *y = b.GetPhyAddr();
  for (int32_t i = 0; i < n; ++i) d[i] = static_cast<T>(f(x[i], y[i]));
}
template <typename T, typename F>
inline void unary(const LocalTensor<T> &dst, const LocalTensor<T> &a, int32_t n, F f) {
  T *d = dst.GetPhyAddr();
  const T *x = a.GetPhyAddr();
  for (int32_t i = 0; i < n; ++i) d[i] = static_cast<T>(f(x[i]));
}
}  // namespace detail

#define NPUSIM_ASCENDC_BINARY(NAME, EXPR)                                                              \
  template <typename T>                                                                             \
  inline void NAME(const LocalTensor<T> &dst, const LocalTensor<T> &src0, const LocalTensor<T> &src1, \
                   const int32_t &count) {                                                          \
    detail::binary(dst, src0, src1, count, [](T a, T b) { return EXPR; });                          \
  }
NPUSIM_ASCENDC_BINARY(Add, a + b)
NPUSIM_ASCENDC_BINARY(Sub, a - b)
NPUSIM_ASCENDC_BINARY(Mul, a * b)
NPUSIM_ASCENDC_BINARY(Div, a / b)
NPUSIM_ASCENDC_BINARY(Max, a > b ? a : b)
NPUSIM_ASCENDC_BINARY(Min, a < b ? a : b)
#undef NPUSIM_ASCENDC_BINARY

#define NPUSIM_ASCENDC_UNARY(NAME, EXPR)                                                    \
  template <typename T>                                                                  \
  inline void NAME(const LocalTensor<T> &dst, const LocalTensor<T> &src, const int32_t &count) { \
    detail::unary(dst, src, count, [](T a) { return EXPR; });                            \
  }
NPUSIM_ASCENDC_UNARY(Exp, static_cast<T>(std::exp(static_cast<float>(a))))
NPUSIM_ASCENDC_UNARY(Ln, static_cast<T>(std::log(static_cast<float>(a))))
NPUSIM_ASCENDC_UNARY(Abs, a < static_cast<T>(0) ? static_cast<T>(-a) : a)
NPUSIM_ASCENDC_UNARY(Sqrt, static_cast<T>(std::sqrt(static_cast<float>(a))))
NPUSIM_ASCENDC_UNARY(Reciprocal, static_cast<T>(static_cast<T>(1) / a))
NPUSIM_ASCENDC_UNARY(Relu, a > static_cast<T>(0) ? a : static_cast<T>(0))
#undef NPUSIM_ASCENDC_UNARY

#define NPUSIM_ASCENDC_SCALAR(NAME, EXPR)                                                          \
  template <typename T, typename U>                                                             \
  inline void NAME(const LocalTensor<T> &dst, const LocalTensor<T> &src, const U &scalar, const int32_t &count) { \
    const T s = static_cast<T>(scalar);                                                         \
    detail::unary(dst, src, count, [s](T a) { return EXPR; });                                  \
  }
NPUSIM_ASCENDC_SCALAR(Adds, a + s)
NPUSIM_ASCENDC_SCALAR(Muls, a * s)
NPUSIM_ASCENDC_SCALAR(Maxs, a > s ? a : s)
NPUSIM_ASCENDC_SCALAR(Mins, a < s ? a : s)
#undef NPUSIM_ASCENDC_SCALAR

template <typename T, typename U>
inline void Duplicate(const LocalTensor<T> &dst, const U &scalar, const int32_t &count) {
  T *d = dst.GetPhyAddr();
  for (int32_t i = 0; i < count; ++i) d[i] = static_cast<T>(scalar);
}

// As on the device: the text goes to a buffer the host prints once the kernel has run.
template <typename... A>
inline void printf(const char *fmt, A... args) {
  npusim_ascendc::print_formatted(fmt, args...);
}
template <typename... A>
inline void PRINTF(const char *fmt, A... args) {
  npusim_ascendc::print_formatted(fmt, args...);
}
template <typename T>
inline void DumpTensor(const LocalTensor<T> &, uint32_t, uint32_t) {}
template <typename T>
inline void DumpTensor(const GlobalTensor<T> &, uint32_t, uint32_t) {}

}  // namespace AscendC

#endif  // NPUSIM_ASCENDC_KERNEL_OPERATOR_H_

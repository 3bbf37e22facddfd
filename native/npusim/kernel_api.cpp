// Kernel launches (npusim.h): checked here, queued on a stream, run by the daemon.
#include "acl/npusim.h"
#include "runtime.h"
#include "va.h"
#include "wire.h"

using namespace npusim;
using namespace npusim::rt;

namespace {

// All pointers must be device memory on the stream's device.
aclError launch(proto::Task &t, aclrtStream stream, std::initializer_list<const void *> ptrs) {
  CallScope scope;
  StreamObj *s = nullptr;
  if (int32_t rc = resolve_stream(stream, &s); rc != ACL_SUCCESS) return rc;
  for (const void *p : ptrs) {
    const auto a = reinterpret_cast<uint64_t>(p);
    if (!va::is_device(a) || static_cast<int32_t>(va::device_of(a)) != s->device) return ACL_ERROR_INVALID_PARAM;
  }
  return submit(t, s);
}

}  // namespace

extern "C" {

aclError npusimLaunchFill(void *dst, size_t count, float value, aclrtStream stream) {
  proto::Task t{};
  t.kind = proto::TaskKind::Fill;
  t.dst = reinterpret_cast<uint64_t>(dst);
  t.m = count;
  t.alpha = value;
  return launch(t, stream, {dst});
}

aclError npusimLaunchCopy(void *dst, const void *src, size_t size, aclrtStream stream) {
  proto::Task t{};
  t.kind = proto::TaskKind::DeviceToDevice;
  t.dst = reinterpret_cast<uint64_t>(dst);
  t.src = reinterpret_cast<uint64_t>(src);
  t.size = size;
  return launch(t, stream, {dst, src});
}

aclError npusimLaunchAxpy(size_t n, float alpha, const void *x, void *y, aclrtStream stream) {
  proto::Task t{};
  t.kind = proto::TaskKind::Axpy;
  t.dst = reinterpret_cast<uint64_t>(y);
  t.src = reinterpret_cast<uint64_t>(x);
  t.m = n;
  t.alpha = alpha;
  return launch(t, stream, {x, y});
}

aclError npusimLaunchMatmul(size_t m, size_t n, size_t k, const void *a, const void *b, void *c,
                            aclrtStream stream) {
  proto::Task t{};
  t.kind = proto::TaskKind::Matmul;
  t.dst = reinterpret_cast<uint64_t>(c);
  t.src = reinterpret_cast<uint64_t>(a);
  t.src2 = reinterpret_cast<uint64_t>(b);
  t.m = m;
  t.n = n;
  t.k = k;
  return launch(t, stream, {a, b, c});
}

}  // extern "C"

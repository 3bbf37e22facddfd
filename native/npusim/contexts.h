// Contexts (contexts.cpp): each device opened by aclrtSetDevice has a default context, and
// aclrtCreateContext makes more; every context has its own default stream, and the streams and
// events created while it is current belong to it. The current context is per thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "runtime.h"

namespace npusim::rt {

struct ContextObj {
  int32_t device;
  StreamObj *default_stream;
  bool is_default;                // the device's own (aclrtSetDevice), not aclrtDestroyContext's to end
  std::atomic<bool> alive{true};  // false once destroyed; objects are never freed, since another
                                  // thread may still name one as its current context
};

// The calling thread's current context, or null (it set none, or the one it set is gone). Any lock.
ContextObj *thread_context();
void set_thread_context(ContextObj *ctx);
// The context streams and events created now belong to: the thread's, else the default context
// of current_device(); null if neither. With r.mu held.
ContextObj *owning_context(Runtime &r);
// The default context of an opened device (created with its default stream by aclrtSetDevice).
// With r.mu held.
ContextObj *make_default_context(Runtime &r, int32_t device, StreamObj *default_stream);
// Ends the contexts of device (aclrtResetDevice) or of every device (device < 0: aclFinalize).
// With r.mu held; their streams are the caller's to free.
void end_contexts(Runtime &r, int32_t device);

}  // namespace npusim::rt

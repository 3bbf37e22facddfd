// Messages between npusimd and a session's kernel runner (kernel_runner.cpp), over a private
// socketpair: a fixed header, `len` trailing bytes, descriptors (SCM_RIGHTS) attached to the
// header. Strictly request -> reply; the reply is a header with `code` (an aclError).
#pragma once

#include <cstdint>

namespace npusim::runner {

enum class Op : uint32_t {
  Load = 1,  // id: binary id; one fd: a memfd holding the ELF bytes
  Unload,    // id: binary id
  Lookup,    // id: binary id; trailing: kernel name
  Map,       // id: device address, a: mapping length, b: allocation size; one fd: its memfd; body: empty, or
             // the uint64 offset in that memfd where an alias (VMM mapping, IPC import) starts
  Unmap,     // id: device address
  Launch,    // id: binary id, a: numBlocks | most blocks at once << 32, b: name length; trailing: name, args
};

struct Msg {
  Op op;
  int32_t code;
  uint64_t id;
  uint64_t a;
  uint64_t b;
  uint64_t len;
};

}  // namespace npusim::runner

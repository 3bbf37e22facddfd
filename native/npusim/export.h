// The direct path for device memory (export.cpp): while a client is locked, a tool asks the daemon
// to stream the client's allocations straight from device memory into files, or back.
//
// One file per device, DIR/dev<N>.img, written strictly in order:
//
//   FileHeader (64 B) | non-zero chunks, in allocation and address order | index | Footer (80 B)
//
// index = AllocRec[n_allocs] then ChunkRec[n_chunks]. Every allocation is cut into kChunk (1 MiB)
// chunks; an all-zero chunk is recorded in the index (kChunkZero) and not written.
//
// Incremental (version 2): an export given its parent's image writes only the chunks written
// since the parent's export (dirty tracking, device_state.h); an unchanged chunk is recorded as
// kChunkRef with the depth of the image up the chain that holds its bytes (1: the parent), their
// offset there and their XXH3-64, so an image never needs more than its own index and its
// ancestors' data. An import is sent the ancestors' files after each file. Each written
// chunk carries its XXH3-64, so an import refuses a damaged chunk before going further; the
// whole file's XXH3-128 (what npusnap's manifest records) is computed while streaming, in both
// directions. Integers are little-endian (the host's; npusim runs on x86-64 and arm64 only).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "device_state.h"

namespace npusim::xfer {

constexpr char kHeaderMagic[8] = {'N', 'P', 'S', 'I', 'M', 'D', 'V', '1'};
constexpr char kFooterMagic[8] = {'N', 'P', 'S', 'I', 'M', 'I', 'X', '1'};
constexpr uint32_t kFormatVersion = 2;  // 1 had no references (read still)
constexpr uint64_t kChunk = 1ULL << 20;
static_assert(kChunk == dirty::kChunk);
constexpr uint32_t kChunkZero = 1;
constexpr uint32_t kChunkRef = 2;   // flags bits 8-15: the depth up the chain
constexpr uint32_t kMaxDepth = 32;  // a longer chain gets its data written again
inline uint32_t ref_depth(uint32_t flags) { return (flags >> 8) & 0xffu; }

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t device;
  uint64_t chunk_size;
  uint64_t boot;       // the daemon run that wrote it (dirty::boot_id), 0 in version 1
  uint64_t epoch;      // the epoch its export read in (dirty::close_epoch)
  uint64_t pid;        // the client it holds
  uint64_t export_id;  // shared by the files of one export
  uint64_t reserved;
};
static_assert(sizeof(FileHeader) == 64);

struct AllocRec {
  uint64_t va;
  uint64_t size;
  uint64_t first_chunk;
  uint64_t nchunks;
};

struct ChunkRec {
  uint64_t offset;  // in the file; 0 for a zero chunk
  uint32_t length;
  uint32_t flags;   // kChunkZero, or kChunkRef | depth << 8 (offset is then in that ancestor)
  uint64_t hash;    // XXH3-64 of the chunk's bytes (0 for a zero chunk)
};
static_assert(sizeof(ChunkRec) == 24);

struct Footer {
  char magic[8];
  uint32_t version;
  uint32_t device;
  uint64_t chunk_size;
  uint64_t n_allocs;
  uint64_t n_chunks;
  uint64_t index_offset;
  uint64_t index_len;
  uint64_t index_hash;  // XXH3-64 of the index
  uint64_t data_bytes;  // bytes of written (non-zero) chunks
  uint64_t file_size;
};
static_assert(sizeof(Footer) == 80);

// Messages and JSON (lazy.cpp too): an address as 0x..., a string quoted and escaped.
std::string hex(uint64_t v);
std::string json_string(const std::string &s);

// Serves an Export or Import request on a tool's connection (server.cpp). Reads the request's
// trailing bytes (rq.size of them) from fd; sets rp.code and fills payload with the reply's JSON
// ({"files": [...], stats} or {"error": "...", "errno": N}). Returns false if the connection broke.
bool serve(DeviceState &state, int fd, pid_t peer, const proto::Request &rq, proto::Reply &rp,
           std::string *payload);

// Op::Quiesce from the client's runtime: flags 1 = locked and drained (after a restore), 2 = locked
// with allocations awaiting an import (after an external restore), 0 = about to unlock (refused
// with ACL_ERROR_SNAPSHOT_UNLOCK_FAILED while an import is awaited or a transfer runs).
int32_t quiesce(Session &s, uint32_t flags);
// A successful Op::Drain: the client is locked and its queues are empty.
void mark_drained(Session &s);
// A restore whose memory an import ahead filled: that image's export is the session's base.
void adopt_base(Session &s, uint64_t base_id, uint64_t base_epoch);

}  // namespace npusim::xfer

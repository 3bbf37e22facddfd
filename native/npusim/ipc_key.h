// IPC keys as CANN programs see them: NUL-terminated strings a process passes to another (a file,
// a pipe). npusim's keys name a row of the daemon's share table: "npusim-KIND-HEX". And the
// whitelist of such a row.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime.h"
#include "wire.h"

namespace npusim::rt {

// Writes the key for number n into key[len]; ACL_ERROR_INVALID_PARAM if it does not fit.
inline int32_t format_key(const char *kind, uint64_t n, char *key, size_t len) {
  if (key == nullptr) return ACL_ERROR_INVALID_PARAM;
  char buf[64];
  const int w = std::snprintf(buf, sizeof(buf), "npusim-%s-%llx", kind, static_cast<unsigned long long>(n));
  if (w < 0 || static_cast<size_t>(w) + 1 > len) return ACL_ERROR_INVALID_PARAM;
  std::memcpy(key, buf, static_cast<size_t>(w) + 1);
  return ACL_SUCCESS;
}

// The number in a key of this kind, or 0 if key is not one.
inline uint64_t parse_key(const char *kind, const char *key) {
  if (key == nullptr) return 0;
  char prefix[32];
  std::snprintf(prefix, sizeof(prefix), "npusim-%s-", kind);
  const size_t n = std::strlen(prefix);
  if (std::strncmp(key, prefix, n) != 0 || key[n] == '\0') return 0;
  char *end = nullptr;
  const unsigned long long v = std::strtoull(key + n, &end, 16);
  return end != nullptr && *end == '\0' ? v : 0;
}

// Whitelists pid[0..num) for share number n (op: IpcSetPids, ShareSetPids or NotifySetPids), one
// request per pid; the daemon refuses a row this process did not export.
inline int32_t set_pids(proto::Op op, uint64_t n, const int32_t *pid, size_t num) {
  if (pid == nullptr || num == 0) return ACL_ERROR_INVALID_PARAM;
  for (size_t i = 0; i < num; ++i) {
    if (pid[i] <= 0) return ACL_ERROR_INVALID_PARAM;
    proto::Request rq = wire::request(op);
    rq.value[0] = n;
    rq.value[1] = static_cast<uint64_t>(pid[i]);
    if (int32_t rc = runtime().pool.call(rq); rc != ACL_SUCCESS) return rc;
  }
  return ACL_SUCCESS;
}

// At Lock of an exporter: ACL_SUCCESS unless other processes still import what it shares of
// kind (ShareImporters' flags: 1 memory, 2 notify, 3 event); then *why names them. Their use of
// it after this checkpoint would be lost, so they are to be checkpointed first.
inline int32_t check_importers(uint32_t kind, const char *what, std::string *why) {
  proto::Request rq = wire::request(proto::Op::ShareImporters);
  rq.flags = kind;
  proto::Reply rp{};
  if (runtime().pool.call(rq, &rp) != ACL_SUCCESS) return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
  if (rp.value[0] == 0) return ACL_SUCCESS;
  *why = std::string(what) + " exported to " + std::to_string(rp.value[0]) + " import(s) by running processes (pid " +
         std::to_string(rp.value[1]) + "): checkpoint the importers first";
  return ACL_ERROR_SNAPSHOT_LOCK_FAILED;
}

}  // namespace npusim::rt

// Device state as a list of resource kinds. Each kind saves itself in Backup and re-creates
// itself in Restore behind the handles the application already holds; a kind the snapshot
// cannot carry refuses at Lock, so the workload runs on instead of being restored wrong.
//
// A kind lives in the file that implements its API and registers itself at load time
// (NPUSIM_RESOURCE_KIND), so adding a kind touches no shared list.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace npusim::rt {

struct SnapshotPass {
  // The direct path: the daemon exports/imports allocation data itself, so Backup saves only
  // what re-creates the allocations and Restore leaves them to be imported.
  bool external = false;
};

struct ResourceKind {
  const char *name;  // as npusimSnapshotInfo and `npusnap inspect` show it
  int order;         // Backup and Restore run kinds by ascending order (memory before what uses it)
  // At Lock, once the process is quiet: ACL_SUCCESS, or CANN's snapshot code with *why naming
  // the resource that cannot be carried (the Lock then fails and the process runs on). May be null.
  int32_t (*check)(std::string *why);
  // Saves what Restore needs while the daemon is still connected. May be null.
  int32_t (*backup)(const SnapshotPass &pass);
  // Re-creates the kind on the daemon now connected (maybe a new one). May be null.
  int32_t (*restore)(const SnapshotPass &pass);
  // Frees what backup saved (after a restore, or a backup that failed). May be null.
  void (*drop)();
  // How many live resources of this kind the process holds (for npusimSnapshotInfo); called with
  // runtime().mu held, unlike the others.
  size_t (*count)();
};

void register_kind(const ResourceKind *kind);
// Every registered kind, by ascending order.
const std::vector<const ResourceKind *> &resource_kinds();

}  // namespace npusim::rt

#define NPUSIM_RESOURCE_KIND_CAT2(a, b) a##b
#define NPUSIM_RESOURCE_KIND_CAT(a, b) NPUSIM_RESOURCE_KIND_CAT2(a, b)
// NPUSIM_RESOURCE_KIND(kMyKind); at namespace scope, after `static const ResourceKind kMyKind{...}`.
#define NPUSIM_RESOURCE_KIND(kind)                                                    \
  [[maybe_unused]] static const bool NPUSIM_RESOURCE_KIND_CAT(kind_registered_, __LINE__) = \
      (::npusim::rt::register_kind(&(kind)), true)

// Client-side virtual memory state (vmm_api.cpp), shared with IPC (ipc_api.cpp). All of it is
// guarded by runtime().mu.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <vector>

namespace npusim::rt {

// What an aclrtDrvMemHandle points to.
struct PhysObj {
  uint64_t addr = 0;        // own: the daemon allocation backing it (an address the application never sees)
  uint64_t size = 0;
  int32_t device = 0;
  uint64_t imported = 0;    // the shareable handle it was imported from (0: allocated here)
  uint64_t exported = 0;    // the shareable handle this process exported it as (0: none)
  bool export_any_pid = false;        // exported with the pid check disabled
  std::vector<int32_t> export_pids;   // whitelisted: published again with the export on restore
  int maps = 0;             // live mappings of it
  void *backup = nullptr;   // host copy taken by Backup
};

struct Reservation {
  uint64_t size;
  int32_t device;
};

struct Mapping {
  uint64_t size;
  PhysObj *phys;
  uint64_t offset;
  uint64_t access;  // aclrtMemAccessFlags granted by aclrtMemSetAccess
};

struct VmmState {
  std::set<PhysObj *> phys;
  std::map<uint64_t, Reservation> reservations;  // by start address
  std::map<uint64_t, Mapping> mappings;          // by start address
};

VmmState &vmm();

// The granularity of physical allocations, reservations and mappings.
constexpr uint64_t kVmmGranularity = 2ULL << 20;

}  // namespace npusim::rt

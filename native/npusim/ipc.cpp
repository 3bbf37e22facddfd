// Sharing between client processes: physical memory (shareable handles), IPC memory keys and
// IPC notify keys. An export is a row of a daemon-wide table: what is shared, who exported it,
// and the pids allowed to import it (CANN's whitelist; "any pid" when the exporter disabled the
// check). An import only ever gains what the exporter shared: an alias of that memory, or the
// same notify object. Each row counts its importers, so a checkpoint of the exporter can refuse
// while one still runs; rows are numbered at random, and a restored exporter publishes its rows
// again under their old numbers, which its restored importers then import again.
#include <random>
#include <set>

#include "acl/acl_base.h"
#include "device_state.h"
#include "va.h"

namespace npusim {
namespace {

using proto::Op;

struct Share {
  pid_t owner = 0;
  bool any_pid = false;
  std::set<pid_t> pids;
  std::shared_ptr<Buffer> buf;  // memory: the buffer, and the shared range of it
  uint64_t offset = 0, size = 0;
  std::shared_ptr<Notify> notify;
  std::shared_ptr<SharedEvent> event;
  std::multiset<pid_t> importers;  // one entry per live import
};

std::mutex g_mu;  // never held while taking the daemon's mutex
std::map<uint64_t, Share> g_shares;  // shareable handles, IPC memory keys and notify keys: one numbering
// Publishes sh under a new random number, or under `wanted` (a restored exporter); 0 if wanted is
// taken.
uint64_t publish(Share sh, uint64_t wanted = 0) {
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard<std::mutex> g(g_mu);
  uint64_t key = wanted;
  if (key != 0 && g_shares.count(key) != 0) return 0;
  while (key == 0 || g_shares.count(key) != 0) key = rng() >> 16;  // 48 bits: short keys
  g_shares[key] = std::move(sh);
  return key;
}

void add_importer(uint64_t key, pid_t pid) {
  std::lock_guard<std::mutex> g(g_mu);
  if (auto it = g_shares.find(key); it != g_shares.end()) it->second.importers.insert(pid);
}

void drop_importer(uint64_t key, pid_t pid) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_shares.find(key);
  if (it == g_shares.end()) return;
  auto one = it->second.importers.find(pid);
  if (one != it->second.importers.end()) it->second.importers.erase(one);
}

// What a share holds: 1 memory, 2 a notify, 3 an event (ShareImporters' flags).
uint32_t kind_of(const Share &sh) { return sh.buf ? 1 : sh.notify ? 2 : 3; }

// Imports by other processes of what owner shared (of one kind, or any for 0): how many, and one
// of their pids.
std::pair<uint64_t, pid_t> importers_of(pid_t owner, uint32_t kind) {
  std::lock_guard<std::mutex> g(g_mu);
  uint64_t n = 0;
  pid_t one = 0;
  for (auto &[key, sh] : g_shares) {
    if (sh.owner != owner || (kind != 0 && kind_of(sh) != kind)) continue;
    for (pid_t p : sh.importers)
      if (p != owner) {
        ++n;
        one = p;
      }
  }
  return {n, one};
}

int32_t whitelist(pid_t caller, uint64_t key, uint64_t pid) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_shares.find(key);
  if (it == g_shares.end() || it->second.owner != caller) return ACL_ERROR_INVALID_PARAM;
  if (pid == 0 || pid > 0x7fffffff) return ACL_ERROR_INVALID_PARAM;
  it->second.pids.insert(static_cast<pid_t>(pid));
  return ACL_SUCCESS;
}

// The share an importer may use: it must exist and name the importer (or any pid).
int32_t admit(pid_t caller, uint64_t key, Share *out) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_shares.find(key);
  if (it == g_shares.end()) return ACL_ERROR_INVALID_PARAM;
  const Share &sh = it->second;
  if (sh.owner != caller && !sh.any_pid && sh.pids.count(caller) == 0) return ACL_ERROR_RT_NO_PERMISSION;
  *out = sh;
  return ACL_SUCCESS;
}

int32_t withdraw(pid_t caller, uint64_t key) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_shares.find(key);
  if (it == g_shares.end() || it->second.owner != caller) return ACL_ERROR_INVALID_PARAM;
  g_shares.erase(it);
  return ACL_SUCCESS;
}

bool owns(pid_t caller, uint64_t key) {
  std::lock_guard<std::mutex> g(g_mu);
  auto it = g_shares.find(key);
  return it != g_shares.end() && it->second.owner == caller;
}

}  // namespace

namespace ipc {
void drop_event_import(pid_t importer, const std::shared_ptr<SharedEvent> &event) {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto &[key, sh] : g_shares) {
    if (sh.event != event) continue;
    auto one = sh.importers.find(importer);
    if (one != sh.importers.end()) sh.importers.erase(one);
    return;
  }
}

void forget(pid_t owner) {
  std::lock_guard<std::mutex> g(g_mu);
  for (auto it = g_shares.begin(); it != g_shares.end();) {
    if (it->second.owner == owner) {
      it = g_shares.erase(it);
      continue;
    }
    it->second.importers.erase(owner);  // its imports end with it
    ++it;
  }
}
}  // namespace ipc

int32_t DeviceState::handle_vmm_ipc(Session &s, const proto::Request &rq, proto::Reply &rp) {
  const uint64_t key = rq.value[0];
  switch (rq.op) {
    case Op::Reserve:
      return reserve(s, static_cast<uint32_t>(rq.device), rq.size, rq.value[0], 0, &rp.value[0]);
    case Op::ReserveAt:
      return reserve(s, static_cast<uint32_t>(rq.device), rq.size, 1, rq.addr, &rp.value[0]);
    case Op::Unreserve: return unreserve(s, rq.addr);
    case Op::Map: {
      std::shared_ptr<Buffer> phys;
      if (rq.flags == 1) {
        std::lock_guard<std::mutex> g(mu_);
        auto it = s.imports.find(key);
        if (it != s.imports.end()) phys = it->second;
      } else {
        phys = allocation_at(s, key);
      }
      return map(s, rq.addr, rq.size, phys, rq.value[1]);
    }
    case Op::Unmap: return unmap(s, rq.addr);
    case Op::ShareExport: {
      Share sh;
      sh.buf = allocation_at(s, rq.addr);
      if (!sh.buf) return ACL_ERROR_INVALID_PARAM;
      sh.owner = s.pid;
      sh.any_pid = rq.flags == 1;
      sh.size = sh.buf->size;
      rp.value[0] = publish(std::move(sh), rq.value[1]);
      return rp.value[0] != 0 ? ACL_SUCCESS : ACL_ERROR_SNAPSHOT_RESTORE_FAILED;  // its number is taken
    }
    case Op::ShareSetPids:
    case Op::IpcSetPids:
    case Op::NotifySetPids: return whitelist(s.pid, key, rq.value[1]);
    case Op::ShareImport: {
      Share sh;
      if (int32_t rc = admit(s.pid, key, &sh); rc != ACL_SUCCESS) return rc;
      if (!sh.buf) return ACL_ERROR_INVALID_PARAM;
      add_importer(key, s.pid);
      std::lock_guard<std::mutex> g(mu_);
      s.imports[key] = sh.buf;
      rp.value[0] = sh.size;
      rp.value[1] = sh.buf->device;
      return ACL_SUCCESS;
    }
    case Op::ShareRelease: {
      if (owns(s.pid, key)) return withdraw(s.pid, key);
      std::lock_guard<std::mutex> g(mu_);
      if (s.imports.erase(key) == 0) return ACL_ERROR_INVALID_PARAM;
      drop_importer(key, s.pid);
      return ACL_SUCCESS;
    }
    case Op::IpcExport: {
      Share sh;
      sh.buf = containing(s, rq.addr, rq.size, &sh.offset);
      if (!sh.buf || rq.size == 0) return ACL_ERROR_INVALID_PARAM;
      sh.owner = s.pid;
      sh.any_pid = rq.flags == 1;
      sh.size = rq.size;
      rp.value[0] = publish(std::move(sh), rq.value[1]);
      return rp.value[0] != 0 ? ACL_SUCCESS : ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    case Op::IpcImport: {
      Share sh;
      if (int32_t rc = admit(s.pid, key, &sh); rc != ACL_SUCCESS) return rc;
      if (!sh.buf) return ACL_ERROR_INVALID_PARAM;
      uint64_t va = 0;  // value[1]: a restored importer's old address
      if (int32_t rc = reserve(s, sh.buf->device, sh.size, va::kAlign, rq.value[1], &va); rc != ACL_SUCCESS) return rc;
      if (int32_t rc = map(s, va, sh.size, sh.buf, sh.offset); rc != ACL_SUCCESS) {
        unreserve(s, va);
        return rc;
      }
      add_importer(key, s.pid);
      rp.value[0] = va;
      rp.value[1] = sh.size;
      return ACL_SUCCESS;
    }
    case Op::IpcClose:
      if (rq.addr == 0) return withdraw(s.pid, key);  // the exporter
      if (int32_t rc = unmap(s, rq.addr); rc != ACL_SUCCESS) return rc;
      drop_importer(key, s.pid);
      return unreserve(s, rq.addr);
    case Op::ShareImporters: {
      auto [n, one] = importers_of(s.pid, rq.flags);
      rp.value[0] = n;
      rp.value[1] = static_cast<uint64_t>(one);
      return ACL_SUCCESS;
    }
    case Op::NotifyCreate: rp.value[0] = notify::create(s, rq.value[0] != 0); return ACL_SUCCESS;
    case Op::NotifyDestroy:
      if (rq.value[0] != 0) drop_importer(rq.value[0], s.pid);  // an imported notify: its key
      return notify::destroy(s, rq.event);
    case Op::NotifyQuery:
    case Op::NotifyReset: {
      auto n = notify::find(s, rq.event);
      if (!n) return ACL_ERROR_INVALID_PARAM;
      rp.value[0] = rq.op == Op::NotifyReset ? n->set.exchange(false) : n->set.load();
      if (rq.op == Op::NotifyReset) {
        std::lock_guard<std::mutex> g(s.mu);
        s.cv.notify_all();
      }
      return ACL_SUCCESS;
    }
    case Op::NotifyExport: {
      Share sh;
      sh.notify = notify::find(s, rq.event);
      if (!sh.notify) return ACL_ERROR_INVALID_PARAM;
      sh.owner = s.pid;
      sh.any_pid = rq.flags == 1;
      rp.value[0] = publish(std::move(sh), rq.value[1]);
      return rp.value[0] != 0 ? ACL_SUCCESS : ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    case Op::NotifyImport: {
      Share sh;
      if (int32_t rc = admit(s.pid, key, &sh); rc != ACL_SUCCESS) return rc;
      if (!sh.notify) return ACL_ERROR_INVALID_PARAM;
      add_importer(key, s.pid);
      rp.value[0] = notify::adopt(s, sh.notify);
      return ACL_SUCCESS;
    }
    case Op::EventExport: {
      Share sh;
      {
        std::lock_guard<std::mutex> g(s.mu);
        auto it = s.events.find(rq.event);
        if (it == s.events.end()) return ACL_ERROR_INVALID_PARAM;
        Event &e = it->second;
        if (!e.ipc) {
          e.ipc = std::make_shared<SharedEvent>();
          e.ipc->completed = e.completed;
          e.ipc->timestamp_ns = e.timestamp_ns;
        }
        sh.event = e.ipc;
      }
      sh.owner = s.pid;
      sh.any_pid = true;  // CANN's IPC event handle has no whitelist
      rp.value[0] = publish(std::move(sh), rq.value[1]);
      return rp.value[0] != 0 ? ACL_SUCCESS : ACL_ERROR_SNAPSHOT_RESTORE_FAILED;
    }
    case Op::EventImport: {
      Share sh;
      if (int32_t rc = admit(s.pid, key, &sh); rc != ACL_SUCCESS) return rc;
      if (!sh.event) return ACL_ERROR_INVALID_PARAM;
      add_importer(key, s.pid);
      std::lock_guard<std::mutex> g(s.mu);
      uint32_t id = s.next_id++;
      s.events[id] = Event{0, 0, sh.event};
      rp.value[0] = id;
      rp.value[1] = sh.event->completed;
      return ACL_SUCCESS;
    }
    default: return ACL_ERROR_INVALID_PARAM;
  }
}

}  // namespace npusim

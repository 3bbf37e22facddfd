// One connection: read a request, act, reply; repeat until the client hangs up.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>

#include "acl/acl_base.h"
#include "access.h"
#include "device_state.h"
#include "export.h"
#include "hccl_daemon.h"
#include "kernel_host.h"
#include "wire.h"

namespace npusim {
namespace {

using proto::Op;

pid_t peer_pid(int fd) {
  pid_t pid = 0;
  return wire::peer_cred(fd, &pid, nullptr, nullptr) ? pid : 0;
}

// A sync request's limit in ms (cann-rest's timed waits), -1: none.
int64_t sync_timeout(const proto::Request &rq) {
  return (rq.flags & proto::kSyncTimed) != 0 && rq.timeout_ms >= 0 ? rq.timeout_ms : -1;
}

// Handles one request of a joined session.
int32_t handle(DeviceState &state, Session &s, const proto::Request &rq, proto::Reply &rp) {
  switch (rq.op) {
    case Op::Malloc: return state.malloc(s, static_cast<uint32_t>(rq.device), rq.size, &rp.value[0]);
    case Op::MallocAt:
      return state.malloc_at(s, static_cast<uint32_t>(rq.device), rq.addr, rq.size, nullptr,
                             (rq.flags & proto::kMallocForImport) == 0);
    case Op::Free: return state.free(s, rq.addr);
    case Op::HostRegister: return host_mem::lend(state, s, rq, &rp.value[0]);
    case Op::MemInfo: return state.mem_info(static_cast<uint32_t>(rq.device), &rp.value[0], &rp.value[1]);
    case Op::Exec: {
      Work w;
      int32_t rc = state.resolve(s, rq.task, 0, false, w);
      return rc != ACL_SUCCESS ? rc : run_work(w);
    }
    case Op::StreamCreate:
      if (rq.device < 0 || static_cast<uint32_t>(rq.device) >= state.device_count()) return ACL_ERROR_RT_INVALID_DEVICEID;
      rp.value[0] = streams::create(s, static_cast<uint32_t>(rq.device));
      return ACL_SUCCESS;
    case Op::StreamDestroy: return streams::destroy(s, rq.stream, rq.flags != 0);
    case Op::StreamAbort: return streams::abort(s, rq.stream, rq.flags == 1 ? ACL_ERROR_RT_STREAM_ABORT : ACL_SUCCESS);
    case Op::Enqueue: {
      uint32_t device = 0;
      if (!streams::device_of(s, rq.stream, &device)) return ACL_ERROR_INVALID_PARAM;
      Work w;
      int32_t rc = state.resolve(s, rq.task, device, true, w);
      return rc != ACL_SUCCESS ? rc : streams::enqueue(s, rq.stream, std::move(w), &rp.value[0]);
    }
    case Op::StreamSync: return streams::sync(s, rq.stream, sync_timeout(rq), &rp.value[0]);
    case Op::DeviceSync: return streams::sync_device(s, static_cast<uint32_t>(rq.device), sync_timeout(rq));
    case Op::Drain: {
      int32_t rc = streams::drain(s, rq.timeout_ms);
      if (rc == ACL_SUCCESS) xfer::mark_drained(s);  // Lock's drain: the client is locked
      return rc;
    }
    case Op::Quiesce: {
      // A live checkpoint's restore that took all of its memory back has its data in place; an
      // Unlock ends any keeping (a rolled back live checkpoint's export asked for one).
      // Memory an import ahead filled becomes the session's base, as an import's would.
      uint64_t base_id = 0, base_epoch = 0;
      const bool in_place = rq.flags == proto::kQuiesceAwaitingImport && state.took_back(s, &base_id, &base_epoch);
      if (rq.flags == proto::kQuiesceUnlocking) state.took_back(s);
      if (base_id != 0) xfer::adopt_base(s, base_id, base_epoch);
      return xfer::quiesce(s, in_place ? proto::kQuiesceLocked : rq.flags);
    }
    case Op::Release:
      hccl::release(s);  // hccl: first, or a stream worker in a collective would hold up the release
      state.release(s);
      return ACL_SUCCESS;
    case Op::EventCreate:
      rp.value[0] = streams::event_create(s, rq.value[0], rq.value[1]);
      return ACL_SUCCESS;
    case Op::EventDestroy: return streams::event_destroy(s, rq.event);
    case Op::EventQuery: {
      Event e;
      int32_t rc = streams::event_query(s, rq.event, &e);
      rp.value[0] = e.completed;
      rp.value[1] = e.timestamp_ns;
      return rc;
    }
    case Op::EventSync: return streams::event_sync(s, rq.event, rq.value[0], sync_timeout(rq));
    case Op::StreamFailureMode: return streams::set_failure_mode(s, rq.stream, rq.flags == 1);
    case Op::EventSignal: return streams::event_signal(s, rq.event);
    case Op::StreamError: return streams::pending_error(s, rq.stream, rq.flags == 1, &rp.value[0], rq.value[0]);
    default:
      // Virtual memory, IPC, notify and IPC events (cann-ipc-vmm): Reserve .. ShareImporters.
      if (rq.op >= Op::Reserve && rq.op <= Op::ShareImporters) return state.handle_vmm_ipc(s, rq, rp);
      return ACL_ERROR_INVALID_PARAM;
  }
}

}  // namespace

bool serve_connection(DeviceState &state, int fd) {
  std::shared_ptr<Session> session;
  bool shutdown = false;
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string why;
  const bool known = wire::peer_cred(fd, &pid, &uid, &gid);
  const bool allowed = known && access::may_connect(pid, uid, gid, &why);
  if (!allowed) std::fprintf(stderr, "npusimd: %s\n", known ? why.c_str() : "refused a peer without credentials");
  const bool admin = allowed && access::is_admin(uid);
  proto::Request rq{};
  while (!shutdown && wire::recv_all(fd, &rq, sizeof(rq))) {
    proto::Reply rp{};
    std::string payload;
    if (!allowed) {
      // Every request, Hello included: aclInit fails with a CANN code; the trailing bytes of a
      // transfer request are never read, so the connection ends here.
      rp.code = ACL_ERROR_RT_NO_PERMISSION;
      wire::send_all(fd, &rp, sizeof(rp));
      break;
    } else if (rq.magic != proto::kMagic) {
      rp.code = ACL_ERROR_RT_DRV_INTERNAL_ERROR;  // a runtime from another npusim version
    } else if (rq.op == Op::Hello) {
      if (!session) session = state.join(peer_pid(fd));
      rp.value[0] = static_cast<uint64_t>(::getpid());
      rp.value[1] = state.device_count();
      rp.value[2] = state.memory();
    } else if (rq.op == Op::Status) {
      payload = state.status_json(admin);
    } else if (rq.op == Op::Shutdown && !admin) {
      rp.code = ACL_ERROR_RT_NO_PERMISSION;
    } else if (rq.op == Op::Shutdown) {
      ::unlink(state.socket_path().c_str());  // gone before the ack: the caller may start a new daemon
      shutdown = true;
    } else if (rq.op == Op::Export || rq.op == Op::Import || rq.op == Op::ExportDevices || rq.op == Op::LazyStatus) {
      if (!xfer::serve(state, fd, peer_pid(fd), rq, rp, &payload)) break;  // reads its own trailing bytes
    } else if (!session) {
      rp.code = ACL_ERROR_UNINITIALIZE;
    } else if (rq.op == Op::BinaryLoad || rq.op == Op::BinaryUnload || rq.op == Op::FunctionLookup ||
               rq.op == Op::LaunchKernel) {
      if (!kernels::serve(state, *session, fd, uid, rq, rp)) break;  // reads its own trailing bytes
    } else if (rq.op >= Op::HcclRootInfo && rq.op <= Op::HcclLockQuery) {  // hccl
      if (!hccl::serve(state, *session, fd, rq, rp)) break;  // reads its own trailing bytes
    } else {
      rp.code = handle(state, *session, rq, rp);
    }
    rp.payload_len = static_cast<uint32_t>(payload.size());
    if (!wire::send_all(fd, &rp, sizeof(rp)) || !wire::send_all(fd, payload.data(), payload.size())) break;
  }
  if (session) state.leave(session);
  ::close(fd);
  return shutdown;
}

}  // namespace npusim

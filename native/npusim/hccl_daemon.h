// The daemon's side of HCCL (hccl_wire.h describes the transport): the root's listener and
// communicators (hccl_root.cpp), and the members that this daemon's clients hold (hccl_member.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "device_state.h"

namespace npusim::hccl {

// npusimd --hccl-listen ADDR[:PORT]: the address (IPv4, network byte order) the listener binds;
// a non-zero port binds it now. false (with *why) if it cannot listen there.
bool configure(uint32_t ipv4, uint16_t port, std::string *why);
// Accepts on a listener configure() bound (called once the daemon runs in its final process).
void start();
// Starts the listener if it is not running yet: on want_port (0: any free port) and the configured
// address. Reports where it listens; HCCL_E_PARA if it already listens on another port than want_port.
int32_t listen_once(uint16_t want_port, uint32_t *ipv4, uint16_t *port);
// Registers a communicator this daemon is the root of (replaces one of that id nobody is in; waits,
// 10 s at most, for the ranks of one that were locking to be seen leaving: a restore re-forms it).
void register_comm(uint64_t id, const uint8_t secret[32]);
// Serves one HCCL request (Op::HcclRootInfo .. Op::HcclLockQuery) of a joined session; reads its
// own trailing bytes. false: the connection is unusable.
bool serve(DeviceState &state, Session &s, int fd, const proto::Request &rq, proto::Reply &rp);
// Closes every member of the session (Op::Release: aclFinalize), so that its stream workers
// blocked in a collective return and its peers see it leave.
void release(Session &s);
// Runs a TaskKind::HcclCollective on its stream's worker; returns an aclError.
int32_t run(Work &w);
// The bytes a rank sends to the root and receives back for one collective step (hccl_member.cpp).
void step_bytes(uint64_t kind, uint64_t count, uint64_t esize, uint32_t nranks, bool is_root, uint64_t *in,
                uint64_t *out);

}  // namespace npusim::hccl

/*
 * npusnap/sockets.h: the abstract Unix socket names of the pieces that listen inside a process.
 * Abstract names: sun_path[0] is NUL, then the name, with no terminating NUL (the address length
 * ends it). Python writes them with a leading "\0".
 */
#ifndef NPUSNAP_SOCKETS_H
#define NPUSNAP_SOCKETS_H

/* The agent: prefix + pid ("npusnap-agent-1234"); when another process squats that name,
 * prefix + pid + "-" + NPUSNAP_AGENT_SOCKET_SUFFIX_HEX random lowercase hex digits. */
#define NPUSNAP_AGENT_SOCKET_PREFIX "npusnap-agent-"
#define NPUSNAP_AGENT_SOCKET_SUFFIX_HEX 16

/* npusim's by-pid control listener (ctl.h): prefix + pid. */
#define NPUSNAP_CTL_SOCKET_PREFIX "npusim-ctl-"

#endif

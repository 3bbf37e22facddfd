/*
 * npusnap/ctl.h: npusim's by-pid control listener (native/npusim/ctl.cpp), the software NPU's
 * counterpart of the threads the NVIDIA driver runs in every CUDA process; its client is the
 * test-only CUDA shim (native/cudashim/cudashim.c).
 *
 * One request line per connection on the abstract socket NPUSNAP_CTL_SOCKET_PREFIX<pid>
 * (sockets.h), one reply line back: "<code> <state>\n", state one of RUNNING, LOCKED,
 * CHECKPOINTED, FAILED (states.h). <code> is NPUSNAP_CTL_OK, an aclError of the runtime's own
 * snapshot call, or one of the NPUSNAP_CTL_E_* codes.
 */
#ifndef NPUSNAP_CTL_H
#define NPUSNAP_CTL_H

#include "npusnap/sockets.h"
#include "npusnap/states.h"

/* Requests. */
#define NPUSNAP_CTL_CMD_STATE "state"
#define NPUSNAP_CTL_CMD_LOCK "lock"             /* lock <timeout_ms>, 0: no timeout */
#define NPUSNAP_CTL_CMD_CHECKPOINT "checkpoint"
#define NPUSNAP_CTL_CMD_RESTORE "restore"       /* restore [<old>:<new>,...] */
#define NPUSNAP_CTL_CMD_UNLOCK "unlock"

/* Reply codes besides the runtime's own aclError values. */
#define NPUSNAP_CTL_OK 0
#define NPUSNAP_CTL_E_REQUEST (-1)     /* malformed request */
#define NPUSNAP_CTL_E_STATE (-2)       /* not allowed in the current state */
#define NPUSNAP_CTL_E_UNSUPPORTED (-3) /* a device remapping the software NPU cannot do */
#define NPUSNAP_CTL_E_FAILED (-4)      /* the process is FAILED */
#define NPUSNAP_CTL_E_DENIED (-101)    /* the peer is neither the process's uid nor root */

#endif

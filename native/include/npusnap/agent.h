/*
 * npusnap/agent.h: the agent <-> CLI protocol (native/agent/agent.c, npusnap_cli/agent.py).
 *
 * One request line per connection on the agent's abstract socket (sockets.h), one JSON object on
 * one line back, then the agent closes. See native/README.md, "agent <-> CLI".
 */
#ifndef NPUSNAP_AGENT_H
#define NPUSNAP_AGENT_H

#include "npusnap/sockets.h"
#include "npusnap/states.h"

/* Requests. */
#define NPUSNAP_AGENT_CMD_PING "ping"
#define NPUSNAP_AGENT_CMD_STATUS "status"
#define NPUSNAP_AGENT_CMD_LOCK "lock"       /* lock <timeout_ms> [<lease_ms>] */
#define NPUSNAP_AGENT_CMD_RENEW "renew"     /* renew <lease_ms> */
#define NPUSNAP_AGENT_CMD_BACKUP "backup"   /* backup [external] */
#define NPUSNAP_AGENT_CMD_RESTORE "restore" /* restore [external] */
#define NPUSNAP_AGENT_CMD_UNLOCK "unlock"
/* hccl <key> <value>: a setting for the runtime's next lock or restore (npusimHcclSnapshotOption):
 * `hccl rendezvous <dir>` where the ranks of a restored set meet, `hccl alone 1` the next lock
 * does not wait for the communicators' other ranks to lock (checkpoint --force), `hccl socket <path>`
 * the daemon the next restore reconnects to (npusimSnapShotUseDaemon; a restore on another host). */
#define NPUSNAP_AGENT_CMD_HCCL "hccl"
#define NPUSNAP_AGENT_HCCL_VALUE_MAX 512 /* bytes of <value>, with its NUL */
/* The modifier of backup/restore that takes npusim's direct data path. */
#define NPUSNAP_AGENT_ARG_EXTERNAL "external"

/* Reply fields. */
#define NPUSNAP_AGENT_REPLY_OK "ok"                       /* bool */
#define NPUSNAP_AGENT_REPLY_CODE "code"                   /* 0, an aclError or NPUSNAP_AGENT_E_* */
#define NPUSNAP_AGENT_REPLY_STATE "state"                 /* states.h; null in a refusal */
#define NPUSNAP_AGENT_REPLY_ERROR "error"                 /* null when ok */
#define NPUSNAP_AGENT_REPLY_ELAPSED_MS "elapsed_ms"       /* float */
#define NPUSNAP_AGENT_REPLY_PID "pid"
#define NPUSNAP_AGENT_REPLY_RUNTIME "runtime"             /* path of the runtime library, or null */
#define NPUSNAP_AGENT_REPLY_LEASE_MS_LEFT "lease_ms_left" /* run time left on the lease, or null */
#define NPUSNAP_AGENT_REPLY_LEASE_LOST "lease_lost"       /* present (true) once a lease ran out */
/* Present while a lease is armed: the address of the agent's lease-lost flag (a C int, non-zero
 * once the lease ran out), read by the CLI from the memory of the process once CRIU has it
 * frozen and the agent cannot answer: did the lease run out before the freeze? */
#define NPUSNAP_AGENT_REPLY_LEASE_LOST_AT "lease_lost_at"
#define NPUSNAP_AGENT_REPLY_DEVICE "device"               /* npusimSnapshotInfo's object, or null */

/* Reply codes besides the runtime's own aclError values. */
#define NPUSNAP_AGENT_OK 0
#define NPUSNAP_AGENT_LOCK_TIMEOUT 507905 /* ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT: the lock did not finish in time */
/* The agent's own refusals (never passed to the runtime). */
#define NPUSNAP_AGENT_E_REQUEST (-1)     /* malformed or unknown request */
#define NPUSNAP_AGENT_E_NO_RUNTIME (-2)  /* no device runtime loaded */
#define NPUSNAP_AGENT_E_STATE (-3)       /* wrong order for the current state */
#define NPUSNAP_AGENT_E_BUSY (-4)        /* an abandoned lock is still inside the runtime */
#define NPUSNAP_AGENT_E_DENIED (-5)      /* peer uid is neither the target's nor root */
#define NPUSNAP_AGENT_E_INTERNAL (-6)    /* resource failure inside the agent */
#define NPUSNAP_AGENT_E_UNSUPPORTED (-7) /* the runtime lacks what the request needs (direct path) */
#define NPUSNAP_AGENT_E_LEASE_LOST (-8)  /* renew after the lease ran out: the CLI no longer owns the lock */

#endif

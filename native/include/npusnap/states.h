/*
 * npusnap/states.h: the words every piece uses for a process's snapshot state.
 *
 * The agent's replies ("state"), npusimSnapshotInfo's "state", the by-pid control listener's
 * replies (ctl.h) and the CLI's pipeline all speak these. CHECKPOINTED is CUDA's word (and the
 * control listener's) for BACKED_UP; FAILED exists only there: the driver cannot recover the
 * process in place.
 *
 * Every NPUSNAP_* constant in this directory is also Python's: npusnap_cli/_protocol.py is
 * generated from these headers at build time (scripts/gen_protocol.py), without the prefix.
 * Constants here are single literals: an integer, a parenthesized negative integer, or a string.
 */
#ifndef NPUSNAP_STATES_H
#define NPUSNAP_STATES_H

#define NPUSNAP_STATE_RUNNING "RUNNING"           /* device calls flow */
#define NPUSNAP_STATE_LOCKED "LOCKED"             /* device work drained, new calls held back */
#define NPUSNAP_STATE_BACKED_UP "BACKED_UP"       /* device state off the device: CRIU may dump */
#define NPUSNAP_STATE_CHECKPOINTED "CHECKPOINTED" /* ctl.h and CUDA: BACKED_UP */
#define NPUSNAP_STATE_FAILED "FAILED"             /* ctl.h and CUDA: unrecoverable in place */

#endif

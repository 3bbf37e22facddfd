/*
 * npusnap/inject.h: the exit statuses of npusnap-inject (native/agent/inject.c), which the CLI
 * (npusnap_cli/agent.py) turns into its errors.
 */
#ifndef NPUSNAP_INJECT_H
#define NPUSNAP_INJECT_H

#define NPUSNAP_INJECT_OK 0            /* the library is loaded */
#define NPUSNAP_INJECT_USAGE 2         /* bad arguments, library missing or not absolute */
#define NPUSNAP_INJECT_NO_PROCESS 3    /* no such process, or it exited */
#define NPUSNAP_INJECT_PERMISSION 4    /* ptrace not permitted */
#define NPUSNAP_INJECT_DLOPEN_FAILED 5 /* the target ran dlopen and it failed (dlerror's message) */
#define NPUSNAP_INJECT_FAILED 6        /* any other failure; the target was left running as it was */
#define NPUSNAP_INJECT_DAMAGED 7       /* the target could not be put back cleanly */

#endif

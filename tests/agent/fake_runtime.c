/* A stand-in device runtime for the agent tests: CANN's snapshot state machine
 * with a lock that can be slowed down (FAKE_LOCK_DELAY_MS) and call counters,
 * reported through npusimSnapshotInfo. Loaded RTLD_LOCAL by ctypes, so the
 * agent has to find it through dl_iterate_phdr. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { RUNNING, LOCKED, BACKED_UP };
static volatile int state, locks, backups, restores, unlocks;
static const char *names[] = {"RUNNING", "LOCKED", "BACKED_UP"};
#define BAD_STATE 107000

int aclrtSnapShotProcessLock(int pid, void *r)
{
    (void)r;
    const char *d = getenv("FAKE_LOCK_DELAY_MS");
    if (d)
        usleep((useconds_t)atoi(d) * 1000);
    if (pid != getpid() || state != RUNNING)
        return BAD_STATE;
    locks++;
    state = LOCKED;
    return 0;
}

int aclrtSnapShotProcessBackup(int pid, void *r)
{
    (void)r;
    if (pid != getpid() || state != LOCKED)
        return BAD_STATE;
    backups++;
    state = BACKED_UP;
    return 0;
}

int aclrtSnapShotProcessRestore(int pid, void *r)
{
    (void)r;
    if (pid != getpid() || state != BACKED_UP)
        return BAD_STATE;
    restores++;
    state = LOCKED;
    return 0;
}

int aclrtSnapShotProcessUnlock(int pid, void *r)
{
    (void)r;
    if (pid != getpid() || state == RUNNING)
        return BAD_STATE;
    unlocks++;
    state = RUNNING;
    return 0;
}

int npusimSnapshotInfo(char *buf, size_t len)
{
    return snprintf(buf, len,
                    "{\"state\": \"%s\", \"locks\": %d, \"backups\": %d, \"restores\": %d, "
                    "\"unlocks\": %d}\n",
                    names[state], locks, backups, restores, unlocks);
}

/*
 * TEST-ONLY libcuda.so.1 stand-in (see README.md): the by-pid checkpoint subset of NVIDIA's driver
 * API, backed by the software NPU. Never installed where a real driver is looked for; npusnap
 * loads it only when NPUSNAP_LIBCUDA points at it.
 *
 * The real driver serves cuCheckpointProcess*(pid, ...) through its own threads inside the target
 * process. Here the npusim client runtime in the target plays that part: it listens on the
 * abstract socket @npusim-ctl-<pid> (native/npusim/ctl.cpp, protocol in npusnap/ctl.h) and runs its own
 * Lock/Backup/Restore/Unlock. Each call below is one request line and one reply line on a fresh
 * connection. Devices are the npusim daemon's (asked through the runtime's npusimDaemonStatus on
 * $NPUSIM_SOCKET); their UUIDs are fixed: bytes "NPUSIM" 0x00.. then the device index.
 *
 * The types below are written from the layouts NVIDIA documents for cuda.h (r555+); only what
 * this subset needs.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "acl/error_codes/rt_error_codes.h" /* the aclError codes the runtime's snapshot calls return */
#include "npusnap/ctl.h"                    /* the control listener's requests, codes and states */

#define EXPORT __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef struct { char bytes[16]; } CUuuid;
typedef struct { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct { unsigned int timeoutMs; unsigned int reserved0; uint64_t reserved1[7]; } CUcheckpointLockArgs;
typedef struct { uint64_t reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct { uint64_t reserved[8]; } CUcheckpointUnlockArgs;
typedef struct {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    uint64_t reserved1;
} CUcheckpointRestoreArgs;
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs is 64 bytes");
_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs is 64 bytes");

/* CUprocessState */
enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3,
};

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_OPERATING_SYSTEM = 304,
    CUDA_ERROR_ILLEGAL_STATE = 401,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_TIMEOUT = 909,
    CUDA_ERROR_UNKNOWN = 999,
};

static int g_initialized;

/* Marks this library as the test shim (npusnap's cuda backend then also treats processes that
 * map the npusim runtime as CUDA candidates). A real libcuda has no such symbol. */
EXPORT const char *npusnapCudaShimMarker(void) { return "libascendcl.so"; }

EXPORT CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    g_initialized = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    const char *v = getenv("NPUSNAP_CUDASHIM_VERSION"); /* tests: pretend an older driver */
    *version = v && *v ? atoi(v) : 12080;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ devices */

static int device_count(void)
{
    Dl_info info;
    if (!dladdr((void *)cuInit, &info) || !info.dli_fname)
        return -1;
    char self[PATH_MAX], lib[PATH_MAX + 64];
    snprintf(self, sizeof self, "%s", info.dli_fname);
    snprintf(lib, sizeof lib, "%s/../toolkit/lib64/libascendcl.so", dirname(self));
    void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return -1;
    int (*status)(const char *, char *, size_t, size_t *) =
        (int (*)(const char *, char *, size_t, size_t *))dlsym(h, "npusimDaemonStatus");
    const char *sock = getenv("NPUSIM_SOCKET");
    if (!sock || !*sock)
        sock = "/tmp/npusim/daemon.sock";
    static char json[1 << 16];
    size_t needed = 0;
    if (!status || status(sock, json, sizeof json, &needed) != 0)
        return -1;
    /* {"pid": N, "socket": "...", "devices": [{"id": 0, ...}, ...], "clients": [...]} */
    char *p = strstr(json, "\"devices\"");
    char *end = p ? strstr(p, "\"clients\"") : NULL;
    int n = 0;
    for (char *q = p; q && (!end || q < end) && (q = strstr(q, "\"id\"")) && (!end || q < end); q += 4)
        n++;
    return n;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    int n = device_count();
    *count = n < 0 ? 0 : n;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    int n = device_count();
    if (n <= 0)
        return CUDA_ERROR_NO_DEVICE;
    if (ordinal < 0 || ordinal >= n)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

static void sim_uuid(CUuuid *u, int index)
{
    memset(u, 0, sizeof *u);
    memcpy(u->bytes, "NPUSIM", 6);
    u->bytes[15] = (char)index;
}

/* The device index of a sim UUID, or -1. */
static int sim_index(const CUuuid *u)
{
    static const char zeros[9];
    if (memcmp(u->bytes, "NPUSIM", 6) || memcmp(u->bytes + 6, zeros, 9))
        return -1;
    return (unsigned char)u->bytes[15];
}

EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    int n = device_count();
    if (dev < 0 || dev >= n)
        return CUDA_ERROR_INVALID_DEVICE;
    sim_uuid(uuid, dev);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) { return cuDeviceGetUuid(uuid, dev); }

/* ------------------------------------------------------------------ checkpoint */

/* The control listener's state word as a CUprocessState. */
static int process_state(const char *name)
{
    if (!strcmp(name, NPUSNAP_STATE_RUNNING))
        return CU_PROCESS_STATE_RUNNING;
    if (!strcmp(name, NPUSNAP_STATE_LOCKED))
        return CU_PROCESS_STATE_LOCKED;
    if (!strcmp(name, NPUSNAP_STATE_CHECKPOINTED))
        return CU_PROCESS_STATE_CHECKPOINTED;
    return CU_PROCESS_STATE_FAILED;
}

/* The one translation of the control listener's codes into the driver's. */
static CUresult cuda_result(int ctl_code)
{
    switch (ctl_code) {
    case NPUSNAP_CTL_OK: return CUDA_SUCCESS;
    case NPUSNAP_CTL_E_REQUEST: return CUDA_ERROR_INVALID_VALUE;
    case NPUSNAP_CTL_E_STATE: return CUDA_ERROR_ILLEGAL_STATE;
    case NPUSNAP_CTL_E_UNSUPPORTED: return CUDA_ERROR_NOT_SUPPORTED;
    case NPUSNAP_CTL_E_FAILED: return CUDA_ERROR_ILLEGAL_STATE; /* FAILED: GetState says so */
    case NPUSNAP_CTL_E_DENIED: return CUDA_ERROR_NOT_PERMITTED;
    case ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT: return CUDA_ERROR_TIMEOUT;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

/* One request to the target's control listener; *state gets the state it reports. */
static CUresult ctl(int pid, const char *request, int *state)
{
    if (!g_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pid <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int len = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1, NPUSNAP_CTL_SOCKET_PREFIX "%d", pid);
    socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
    if (connect(fd, (struct sockaddr *)&sa, salen) < 0) {
        close(fd);
        return CUDA_ERROR_NOT_FOUND; /* no CUDA (npusim) context in that process */
    }
    char line[320];
    int n = snprintf(line, sizeof line, "%s\n", request);
    if (send(fd, line, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    /* No receive timeout: like the driver, a call lasts as long as the operation does. */
    size_t got = 0;
    while (got < sizeof line - 1) {
        ssize_t r = recv(fd, line + got, sizeof line - 1 - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
        if (memchr(line, '\n', got))
            break;
    }
    close(fd);
    line[got] = '\0';
    int code;
    char name[32];
    if (sscanf(line, "%d %31s", &code, name) != 2)
        return CUDA_ERROR_OPERATING_SYSTEM;
    if (state)
        *state = process_state(name);
    return cuda_result(code);
}

EXPORT CUresult cuCheckpointProcessGetState(int pid, int *state)
{
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    return ctl(pid, NPUSNAP_CTL_CMD_STATE, state);
}

EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    char rq[32];
    snprintf(rq, sizeof rq, NPUSNAP_CTL_CMD_LOCK " %u", args ? args->timeoutMs : 0u);
    return ctl(pid, rq, NULL);
}

EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    (void)args;
    return ctl(pid, NPUSNAP_CTL_CMD_CHECKPOINT, NULL);
}

EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    char rq[300] = NPUSNAP_CTL_CMD_RESTORE;
    if (args && args->gpuPairsCount) {
        if (!args->gpuPairs || args->gpuPairsCount > 32)
            return CUDA_ERROR_INVALID_VALUE;
        size_t off = strlen(rq);
        for (unsigned i = 0; i < args->gpuPairsCount; i++) {
            int a = sim_index(&args->gpuPairs[i].oldUuid), b = sim_index(&args->gpuPairs[i].newUuid);
            if (a < 0 || b < 0)
                return CUDA_ERROR_INVALID_VALUE;
            off += (size_t)snprintf(rq + off, sizeof rq - off, "%c%d:%d", i ? ',' : ' ', a, b);
        }
    }
    return ctl(pid, rq, NULL);
}

EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    (void)args;
    return ctl(pid, NPUSNAP_CTL_CMD_UNLOCK, NULL);
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **name)
{
    if (!name)
        return CUDA_ERROR_INVALID_VALUE;
    switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *name = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
    case CUDA_ERROR_OPERATING_SYSTEM: *name = "CUDA_ERROR_OPERATING_SYSTEM"; break;
    case CUDA_ERROR_ILLEGAL_STATE: *name = "CUDA_ERROR_ILLEGAL_STATE"; break;
    case CUDA_ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_NOT_PERMITTED: *name = "CUDA_ERROR_NOT_PERMITTED"; break;
    case CUDA_ERROR_NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    case CUDA_ERROR_TIMEOUT: *name = "CUDA_ERROR_TIMEOUT"; break;
    case CUDA_ERROR_UNKNOWN: *name = "CUDA_ERROR_UNKNOWN"; break;
    default: *name = NULL; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Memory shared between two processes across their checkpoints (tests/cann/test_ipc_carry.py).
 *
 * Exporter A shares half of an aclrtMalloc buffer with importer B by IPC key (whitelisted to B's
 * pid) and a physical allocation by shareable handle. Each step, each side adds the step number
 * to every word of the memory it owns the use of (A: its half; B: the other half, through the
 * import, and the physical memory, through a mapping of it) and prints a checksum, so a restored
 * side whose data was lost or re-mapped wrong prints something else. B also records A's IPC
 * notify at even steps and waits for it (5 s at most) at odd ones, so the notify's state, which
 * A's checkpoint saves after B's, must come back; and B waits for A's IPC event, which A records
 * every step. The handshake runs over the
 * FIFOs a2b and b2a in DIR (closed before the loop); at the end B creates DIR/b.done and A waits
 * for it (however long) before withdrawing its exports.
 *
 * Usage: ipc_carry a|b DIR STEPS SLEEP_MS */
#include <acl/acl.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../workloads/step_gate.h"

static char role = '?';

#define CHECK(x)                                                                  \
    do {                                                                          \
        aclError rc_ = (x);                                                       \
        if (rc_ != ACL_SUCCESS) {                                                 \
            printf("%c ERR line %d: %s = %d\n", role, __LINE__, #x, rc_);         \
            fflush(stdout);                                                       \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

enum { kWords = 16384 };  /* one half: 64 KiB */

struct Keys {
    char mem[65], notify[65];
    uint64_t shareable;
    aclrtIpcEventHandle event;
};

static int fifo(const char *dir, const char *name, int flags) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, flags);
    if (fd < 0) exit(2);
    return fd;
}
static void put(int fd, const void *p, size_t n) {
    if (write(fd, p, n) != (ssize_t)n) exit(3);
}
static void get(int fd, void *p, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) exit(4);
        got += (size_t)r;
    }
}
static void nap(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Adds step to every word at dev (kWords of them) and returns a checksum of the result. */
static uint64_t accumulate(void *dev, uint32_t step) {
    static uint32_t host[kWords];
    CHECK(aclrtMemcpy(host, sizeof(host), dev, sizeof(host), ACL_MEMCPY_DEVICE_TO_HOST));
    uint64_t h = 1469598103934665603ULL;
    for (uint32_t i = 0; i < kWords; i++) {
        host[i] += step * (i % 7 + 1);
        h = (h ^ host[i]) * 1099511628211ULL;
    }
    CHECK(aclrtMemcpy(dev, sizeof(host), host, sizeof(host), ACL_MEMCPY_HOST_TO_DEVICE));
    return h;
}

static aclrtPhysicalMemProp device_prop(void) {
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    return prop;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: ipc_carry a|b DIR STEPS SLEEP_MS\n");
        return 2;
    }
    role = argv[1][0] == 'b' ? 'B' : 'A';
    const char *dir = argv[2];
    const int steps = atoi(argv[3]), sleep_ms = atoi(argv[4]);
    char done_path[4096];
    snprintf(done_path, sizeof(done_path), "%s/b.done", dir);
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    aclrtPhysicalMemProp prop = device_prop();
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    struct Keys k;
    memset(&k, 0, sizeof(k));

    if (role == 'A') {
        int to_b = fifo(dir, "a2b", O_WRONLY), from_b = fifo(dir, "b2a", O_RDONLY);
        char *mem;
        CHECK(aclrtMalloc((void **)&mem, 2 * kWords * 4, ACL_MEM_MALLOC_HUGE_FIRST));
        CHECK(aclrtMemset(mem, 2 * kWords * 4, 0, 2 * kWords * 4));
        aclrtDrvMemHandle phys;
        CHECK(aclrtMallocPhysical(&phys, g, &prop, 0));
        char *va;  /* A zeroes the physical memory through a mapping of its own */
        CHECK(aclrtReserveMemAddress((void **)&va, g, 0, NULL, 0));
        CHECK(aclrtMapMem(va, g, 0, phys, 0));
        CHECK(aclrtMemset(va, g, 0, g));
        int32_t bpid = 0;
        get(from_b, &bpid, sizeof(bpid));
        CHECK(aclrtIpcMemGetExportKey(mem + kWords * 4, kWords * 4, k.mem, sizeof(k.mem), 0));
        CHECK(aclrtIpcMemSetImportPid(k.mem, &bpid, 1));
        CHECK(aclrtMemExportToShareableHandle(phys, ACL_MEM_HANDLE_TYPE_NONE, 0, &k.shareable));
        CHECK(aclrtMemSetPidToShareableHandle(k.shareable, &bpid, 1));
        aclrtNotify n;
        CHECK(aclrtCreateNotify(&n, 0));
        CHECK(aclrtNotifyGetExportKey(n, k.notify, sizeof(k.notify), 0));
        CHECK(aclrtNotifySetImportPid(n, &bpid, 1));
        aclrtEvent ev;
        CHECK(aclrtCreateEventExWithFlag(&ev, ACL_EVENT_IPC));
        CHECK(aclrtRecordEvent(ev, NULL));
        CHECK(aclrtIpcGetEventHandle(ev, &k.event));
        put(to_b, &k, sizeof(k));
        char ok = 0;
        get(from_b, &ok, 1);  /* B has imported both */
        close(to_b);
        close(from_b);
        printf("ready pid %d\n", (int)getpid());
        for (int step = 0; step < steps; step++) {
            printf("A step %d %016llx\n", step, (unsigned long long)accumulate(mem, (uint32_t)step));
            CHECK(aclrtRecordEvent(ev, NULL));
            nap(sleep_ms);
        }
        struct stat st;
        while (stat(done_path, &st) != 0) nap(50);  /* B may be checkpointed meanwhile: no time limit */
        /* What B left in the shared memory, seen by the owner. */
        printf("A sees B's half %016llx\n", (unsigned long long)accumulate(mem + kWords * 4, 0));
        printf("A sees B's physical %016llx\n", (unsigned long long)accumulate(va + g - kWords * 4, 0));
        CHECK(aclrtIpcMemClose(k.mem));
        CHECK(aclrtDestroyNotify(n));
        CHECK(aclrtDestroyEvent(ev));
        CHECK(aclrtUnmapMem(va));
        CHECK(aclrtReleaseMemAddress(va));
        CHECK(aclrtFreePhysical(phys));
        CHECK(aclrtFree(mem));
    } else {
        int from_a = fifo(dir, "a2b", O_RDONLY), to_a = fifo(dir, "b2a", O_WRONLY);
        int32_t pid = 0;
        CHECK(aclrtDeviceGetBareTgid(&pid));
        put(to_a, &pid, sizeof(pid));
        get(from_a, &k, sizeof(k));
        void *half;
        CHECK(aclrtIpcMemImportByKey(&half, k.mem, 0));
        aclrtDrvMemHandle phys;
        CHECK(aclrtMemImportFromShareableHandle(k.shareable, 0, &phys));
        char *va;
        CHECK(aclrtReserveMemAddress((void **)&va, g, 0, NULL, 0));
        CHECK(aclrtMapMem(va, g, 0, phys, 0));
        aclrtNotify n;
        CHECK(aclrtNotifyImportByKey(&n, k.notify, 0));
        aclrtEvent ev;
        CHECK(aclrtIpcOpenEventHandle(k.event, &ev));
        aclrtStream s;
        CHECK(aclrtCreateStream(&s));
        char ok = 1;
        put(to_a, &ok, 1);
        close(to_a);
        close(from_a);
        printf("ready pid %d\n", (int)getpid());
        for (int step = 0; step < steps; step++) {
            uint64_t h1 = accumulate(half, (uint32_t)step), h2 = accumulate(va + g - kWords * 4, (uint32_t)step);
            if (step % 2 == 0) CHECK(aclrtRecordNotify(n, s));
            else CHECK(aclrtWaitAndResetNotify(n, s, 5000));
            CHECK(aclrtStreamWaitEvent(s, ev));
            CHECK(aclrtSynchronizeStream(s));
            printf("B step %d %016llx %016llx\n", step, (unsigned long long)h1, (unsigned long long)h2);
            nap(sleep_ms);
            step_gate(step);  /* the importer: checkpointed before it ends, however slow the machine */
        }
        CHECK(aclrtUnmapMem(va));
        CHECK(aclrtReleaseMemAddress(va));
        CHECK(aclrtFreePhysical(phys));
        CHECK(aclrtIpcMemClose(k.mem));
        CHECK(aclrtDestroyNotify(n));
        CHECK(aclrtDestroyEvent(ev));
        CHECK(aclrtDestroyStream(s));
        FILE *f = fopen(done_path, "w");
        if (f != NULL) fclose(f);
    }
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    printf("%c done\n", role);
    return 0;
}

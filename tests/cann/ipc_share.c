/* Sharing between processes (tests/cann/test_ipc_share.py): exporter A, importer B (whitelisted)
 * and outsider C (not whitelisted), three separate programs talking over the FIFOs a2b, b2a, a2c
 * and c2a in DIR (made by the caller; each side opens them in that order).
 *
 * A shares an aclrtMalloc range by IPC key (whitelisted to B, and once more with pid validation
 * disabled), a physical allocation by shareable handle (whitelisted to B) and a notify (IPC
 * notify, whitelisted to B) and an event (IPC event). B reads and writes through its imports,
 * waits for A's notify, and orders a read after A's event;
 * C is refused whatever names B only. Then A and B hold their shares (a checkpoint of A is refused
 * meanwhile: its importer runs) until the file RELEASE exists (at most a minute), release them,
 * and exit.
 *
 * Usage: ipc_share a|b|c DIR [RELEASE]. Every line starts with the process's role. */
#include <acl/acl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
#define SAY(...)                  \
    do {                          \
        printf("%c ", role);      \
        printf(__VA_ARGS__);      \
        printf("\n");             \
        fflush(stdout);           \
    } while (0)

struct Keys {
    char mem[65], open_mem[65], notify[65];
    uint64_t shareable;
    aclrtIpcEventHandle event;
};

static void put(int fd, const void *p, size_t n) {
    if (write(fd, p, n) != (ssize_t)n) exit(2);
}
static void get(int fd, void *p, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0) exit(3);
        got += (size_t)r;
    }
}
static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const size_t kBytes = 1 << 20;

static void fill(uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint32_t)i * 2654435761u ^ seed;
}
static int same(const uint32_t *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ((uint32_t)i * 2654435761u ^ seed)) return 0;
    return 1;
}

static void setup(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
}

static aclrtPhysicalMemProp device_prop(void) {
    aclrtPhysicalMemProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.handleType = ACL_MEM_HANDLE_TYPE_NONE;
    prop.allocationType = ACL_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = ACL_MEM_LOCATION_TYPE_DEVICE;
    prop.memAttr = ACL_HBM_MEM_NORMAL;
    return prop;
}

/* C: names nobody whitelisted. */
static int outsider(int from_a, int to_a) {
    role = 'C';
    setup();
    struct Keys k;
    get(from_a, &k, sizeof(k));
    void *p = NULL;
    SAY("import by key %d", aclrtIpcMemImportByKey(&p, k.mem, 0));
    aclrtDrvMemHandle h = NULL;
    SAY("import shareable %d", aclrtMemImportFromShareableHandle(k.shareable, 0, &h));
    aclrtNotify n = NULL;
    SAY("import notify %d", aclrtNotifyImportByKey(&n, k.notify, 0));
    /* Without pid validation anyone may import. */
    CHECK(aclrtIpcMemImportByKey(&p, k.open_mem, 0));
    uint32_t *host = malloc(kBytes);
    CHECK(aclrtMemcpy(host, kBytes, p, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
    SAY("open key read %s", same(host, kBytes / 4, 123) ? "ok" : "BAD");
    CHECK(aclrtIpcMemClose(k.open_mem));
    char done = 1;
    put(to_a, &done, 1);
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    return 0;
}

/* B: whitelisted by A. */
static int importer(int from_a, int to_a) {
    role = 'B';
    setup();
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    int32_t pid = 0;
    CHECK(aclrtDeviceGetBareTgid(&pid));
    put(to_a, &pid, sizeof(pid));
    struct Keys k;
    get(from_a, &k, sizeof(k));

    uint32_t *host = malloc(kBytes);
    void *mem = NULL;
    CHECK(aclrtIpcMemImportByKey(&mem, k.mem, 0));
    CHECK(aclrtMemcpy(host, kBytes, mem, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
    SAY("ipc memory read %s", same(host, kBytes / 4, 123) ? "ok" : "BAD");

    aclrtPhysicalMemProp prop = device_prop();
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    aclrtDrvMemHandle phys = NULL;
    CHECK(aclrtMemImportFromShareableHandle(k.shareable, 0, &phys));
    char *va = NULL;
    CHECK(aclrtReserveMemAddress((void **)&va, g, 0, NULL, 0));
    CHECK(aclrtMapMem(va, g, 0, phys, 0));
    CHECK(aclrtMemcpy(host, kBytes, va, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
    SAY("physical memory read %s", same(host, kBytes / 4, 456) ? "ok" : "BAD");

    aclrtNotify n = NULL;
    CHECK(aclrtNotifyImportByKey(&n, k.notify, 0));
    char go = 1;
    put(to_a, &go, 1);  /* A records the notify now */
    CHECK(aclrtWaitAndResetNotify(n, s, 20000));
    CHECK(aclrtSynchronizeStream(s));
    SAY("notify from A seen");
    /* A's event is recorded only after A has written 321 to the start of the shared memory. */
    aclrtEvent ev = NULL;
    CHECK(aclrtIpcOpenEventHandle(k.event, &ev));
    uint32_t first = 0;
    CHECK(aclrtStreamWaitEvent(s, ev));
    CHECK(aclrtMemcpyAsync(&first, 4, mem, 4, ACL_MEMCPY_DEVICE_TO_HOST, s));
    put(to_a, &go, 1);
    CHECK(aclrtSynchronizeStream(s));
    SAY("read after A's event %u", first);
    /* Write back through both imports; A reads what B wrote. */
    fill(host, kBytes / 4, 789);
    CHECK(aclrtMemcpy(mem, kBytes, host, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    fill(host, kBytes / 4, 1011);
    CHECK(aclrtMemcpy(va, kBytes, host, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    put(to_a, &go, 1);

    /* An importer may be checkpointed (before its exporter): Lock passes; unlocked at once. */
    SAY("lock %d", aclrtSnapShotProcessLock(getpid(), NULL));
    SAY("unlock %d", aclrtSnapShotProcessUnlock(getpid(), NULL));
    SAY("holding pid %d", (int)getpid());
    get(from_a, &go, 1);  /* A is done holding */
    CHECK(aclrtUnmapMem(va));
    CHECK(aclrtReleaseMemAddress(va));
    CHECK(aclrtFreePhysical(phys));
    CHECK(aclrtIpcMemClose(k.mem));
    CHECK(aclrtDestroyNotify(n));
    CHECK(aclrtDestroyEvent(ev));
    SAY("closed %d", aclrtIpcMemClose(k.mem));  /* already closed */
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    put(to_a, &go, 1);
    return 0;
}

static int fifo(const char *dir, const char *name, int flags) {
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, flags);
    if (fd < 0) {
        perror(path);
        exit(2);
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: ipc_share a|b|c DIR [RELEASE]\n");
        return 2;
    }
    const char *dir = argv[2], *release = argc > 3 ? argv[3] : NULL;
    if (argv[1][0] == 'b') {
        int from_a = fifo(dir, "a2b", O_RDONLY), to_a = fifo(dir, "b2a", O_WRONLY);
        return importer(from_a, to_a);
    }
    if (argv[1][0] == 'c') {
        int from_a = fifo(dir, "a2c", O_RDONLY), to_a = fifo(dir, "c2a", O_WRONLY);
        return outsider(from_a, to_a);
    }
    int a2b[2], b2a[2], a2c[2], c2a[2];
    a2b[1] = fifo(dir, "a2b", O_WRONLY);
    b2a[0] = fifo(dir, "b2a", O_RDONLY);
    a2c[1] = fifo(dir, "a2c", O_WRONLY);
    c2a[0] = fifo(dir, "c2a", O_RDONLY);
    role = 'A';
    setup();
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    int32_t bpid = 0;
    get(b2a[0], &bpid, sizeof(bpid));

    uint32_t *host = malloc(kBytes);
    void *mem = NULL, *open_mem = NULL;
    CHECK(aclrtMalloc(&mem, kBytes, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&open_mem, kBytes, ACL_MEM_MALLOC_HUGE_FIRST));
    fill(host, kBytes / 4, 123);
    CHECK(aclrtMemcpy(mem, kBytes, host, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(open_mem, kBytes, host, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    struct Keys k;
    memset(&k, 0, sizeof(k));
    char tiny[4];
    SAY("key too short %d", aclrtIpcMemGetExportKey(mem, kBytes, tiny, sizeof(tiny), 0));
    CHECK(aclrtIpcMemGetExportKey(mem, kBytes, k.mem, sizeof(k.mem), 0));
    CHECK(aclrtIpcMemSetImportPid(k.mem, &bpid, 1));
    CHECK(aclrtIpcMemGetExportKey(open_mem, kBytes, k.open_mem, sizeof(k.open_mem),
                                  ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION));

    aclrtPhysicalMemProp prop = device_prop();
    size_t g = 0;
    CHECK(aclrtMemGetAllocationGranularity(&prop, ACL_RT_MEM_ALLOC_GRANULARITY_MINIMUM, &g));
    aclrtDrvMemHandle phys = NULL;
    CHECK(aclrtMallocPhysical(&phys, g, &prop, 0));
    char *va = NULL;
    CHECK(aclrtReserveMemAddress((void **)&va, g, 0, NULL, 0));
    CHECK(aclrtMapMem(va, g, 0, phys, 0));
    fill(host, kBytes / 4, 456);
    CHECK(aclrtMemcpy(va, kBytes, host, kBytes, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemExportToShareableHandle(phys, ACL_MEM_HANDLE_TYPE_NONE, 0, &k.shareable));
    CHECK(aclrtMemSetPidToShareableHandle(k.shareable, &bpid, 1));

    aclrtNotify n = NULL;
    CHECK(aclrtCreateNotify(&n, ACL_NOTIFY_DEFAULT));
    CHECK(aclrtNotifyGetExportKey(n, k.notify, sizeof(k.notify), 0));
    CHECK(aclrtNotifySetImportPid(n, &bpid, 1));
    /* The event is recorded on s2 once the word at flag is 1. */
    aclrtStream s2;
    CHECK(aclrtCreateStream(&s2));
    void *flag = NULL;
    CHECK(aclrtMalloc(&flag, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(flag, 64, 0, 64));
    aclrtEvent ev = NULL;
    CHECK(aclrtCreateEventExWithFlag(&ev, ACL_EVENT_IPC));
    CHECK(aclrtValueWait(flag, 1, ACL_STREAM_WAIT_VALUE_EQ, s2));
    CHECK(aclrtRecordEvent(ev, s2));
    CHECK(aclrtIpcGetEventHandle(ev, &k.event));
    put(a2b[1], &k, sizeof(k));
    put(a2c[1], &k, sizeof(k));

    char go;
    get(b2a[0], &go, 1);
    CHECK(aclrtRecordNotify(n, s));
    CHECK(aclrtSynchronizeStream(s));
    get(b2a[0], &go, 1);  /* B waits for the event */
    uint32_t first = 321;
    CHECK(aclrtMemcpy(mem, 4, &first, 4, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtValueWrite(flag, 1, 0, s));
    CHECK(aclrtSynchronizeStream(s));
    CHECK(aclrtSynchronizeEvent(ev));
    get(b2a[0], &go, 1);
    CHECK(aclrtMemcpy(host, kBytes, mem, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
    SAY("ipc memory written by B %s", same(host, kBytes / 4, 789) ? "ok" : "BAD");
    CHECK(aclrtMemcpy(host, kBytes, va, kBytes, ACL_MEMCPY_DEVICE_TO_HOST));
    SAY("physical memory written by B %s", same(host, kBytes / 4, 1011) ? "ok" : "BAD");
    get(c2a[0], &go, 1);

    /* An exporter whose importer runs cannot be carried: Lock refuses, and the process runs on. */
    SAY("lock %d", aclrtSnapShotProcessLock(getpid(), NULL));
    SAY("holding pid %d", (int)getpid());
    struct stat st;
    for (int t = 0; release != NULL && t < 1200 && stat(release, &st) != 0; t++) {
        CHECK(aclrtMemcpy(host, 4, mem, 4, ACL_MEMCPY_DEVICE_TO_HOST));  /* the device keeps working */
        sleep_ms(50);
    }
    put(a2b[1], &go, 1);
    get(b2a[0], &go, 1);  /* B has closed its imports */
    CHECK(aclrtIpcMemClose(k.mem));
    CHECK(aclrtIpcMemClose(k.open_mem));
    CHECK(aclrtUnmapMem(va));
    CHECK(aclrtReleaseMemAddress(va));
    CHECK(aclrtFreePhysical(phys));
    CHECK(aclrtDestroyNotify(n));
    CHECK(aclrtDestroyEvent(ev));
    CHECK(aclrtDestroyStream(s2));
    CHECK(aclrtFree(flag));
    CHECK(aclrtFree(mem));
    CHECK(aclrtFree(open_mem));
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    SAY("done");
    return 0;
}

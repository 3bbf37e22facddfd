"""The CANN-shaped C API, compiled against the installed headers and library, on a real daemon."""

from __future__ import annotations

from pathlib import Path

from npusim_helpers import build_and_run

MEMORY = r"""
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131 + seed * 7 + (i >> 9));
}

int main(void) {
    CHECK(aclInit(NULL));
    EXPECT(aclInit(NULL), ACL_ERROR_REPEAT_INITIALIZE);
    uint32_t count = 0;
    CHECK(aclrtGetDeviceCount(&count));
    ASSERT(count == 2);
    int32_t dev = -1;
    EXPECT(aclrtGetDevice(&dev), ACL_ERROR_RT_CONTEXT_NULL);
    EXPECT(aclrtSetDevice(2), ACL_ERROR_RT_INVALID_DEVICEID);
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtGetDevice(&dev));
    ASSERT(dev == 0);

    size_t free0, free1, total;
    CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free0, &total));
    ASSERT(total == (size_t)1 << 30 && free0 == total);
    void *small;
    CHECK(aclrtMalloc(&small, 1000, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtGetMemInfo(ACL_HBM_MEM, &free1, &total));
    ASSERT(free0 - free1 == 1024);  /* rounded up to 32 bytes */
    void *huge;
    EXPECT(aclrtMalloc(&huge, (size_t)2 << 30, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_RT_MEMORY_ALLOCATION);
    EXPECT(aclrtMalloc(&huge, 0, ACL_MEM_MALLOC_HUGE_FIRST), ACL_ERROR_INVALID_PARAM);

    /* A device address faults when the CPU dereferences it. */
    pid_t child = fork();
    if (child == 0) {
        volatile char c = *(volatile char *)small;
        (void)c;
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT(WIFSIGNALED(status) && (WTERMSIG(status) == SIGSEGV || WTERMSIG(status) == SIGBUS));

    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    size_t sizes[] = {1, 33, 1000, 4096 + 7, (3u << 20) + 5, 16u << 20};
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t n = sizes[i];
        unsigned char *src = malloc(n), *dst = malloc(n), *dst2;
        CHECK(aclrtMallocHost((void **)&dst2, n));
        void *a, *b;
        CHECK(aclrtMalloc(&a, n, ACL_MEM_MALLOC_HUGE_FIRST));
        CHECK(aclrtMalloc(&b, n, ACL_MEM_MALLOC_NORMAL_ONLY));
        pattern(src, n, i);
        CHECK(aclrtMemcpy(a, n, src, n, ACL_MEMCPY_HOST_TO_DEVICE));
        CHECK(aclrtMemcpy(b, n, a, n, ACL_MEMCPY_DEVICE_TO_DEVICE));
        memset(dst, 0, n);
        CHECK(aclrtMemcpy(dst, n, b, n, ACL_MEMCPY_DEVICE_TO_HOST));
        ASSERT(memcmp(src, dst, n) == 0);
        /* The same through a stream: queued, ordered, visible after synchronize. */
        pattern(src, n, i + 100);
        CHECK(aclrtMemcpyAsync(a, n, src, n, ACL_MEMCPY_HOST_TO_DEVICE, stream));
        CHECK(aclrtMemcpyAsync(b, n, a, n, ACL_MEMCPY_DEVICE_TO_DEVICE, stream));
        CHECK(aclrtMemcpyAsync(dst2, n, b, n, ACL_MEMCPY_DEVICE_TO_HOST, stream));
        CHECK(aclrtSynchronizeStream(stream));
        ASSERT(memcmp(src, dst2, n) == 0);
        CHECK(aclrtMemset(a, n, 0xAB, n));
        CHECK(aclrtMemcpy(dst, n, a, n, ACL_MEMCPY_DEFAULT));
        for (size_t k = 0; k < n; k++) ASSERT(dst[k] == 0xAB);
        CHECK(aclrtMemsetAsync(a, n, 0x5C, n, stream));
        CHECK(aclrtMemcpyAsync(dst2, n, a, n, ACL_MEMCPY_DEVICE_TO_HOST, stream));
        CHECK(aclrtSynchronizeStream(stream));
        for (size_t k = 0; k < n; k++) ASSERT(dst2[k] == 0x5C);
        CHECK(aclrtFree(a));
        CHECK(aclrtFree(b));
        CHECK(aclrtFreeHost(dst2));
        free(src);
        free(dst);
    }

    /* Argument checks. */
    unsigned char host[4096], host2[4096];
    void *a, *b;
    CHECK(aclrtMalloc(&a, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&b, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT(aclrtMemcpy(a, 10, host, 11, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);   /* destMax */
    EXPECT(aclrtMemcpy(host, 64, a, 64, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM);   /* wrong kind */
    EXPECT(aclrtMemcpy(a, 8192, host, 8192, ACL_MEMCPY_HOST_TO_DEVICE), ACL_ERROR_INVALID_PARAM); /* past the end */
    EXPECT(aclrtMemcpy((char *)a + 32, 64, b, 64, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_ADDR_UNALIGNED);
    CHECK(aclrtMemcpy((char *)a + 64, 64, b, 64, ACL_MEMCPY_DEVICE_TO_DEVICE));
    memset(host, 7, sizeof(host));
    CHECK(aclrtMemcpy(host2, sizeof(host2), host, sizeof(host), ACL_MEMCPY_HOST_TO_HOST));
    ASSERT(memcmp(host, host2, sizeof(host)) == 0);
    EXPECT(aclrtMemcpyAsync(host2, 64, host, 64, ACL_MEMCPY_HOST_TO_HOST, stream), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtFree((void *)host), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtFreeHost(host), ACL_ERROR_INVALID_PARAM);

    CHECK(aclrtDestroyStream(stream));
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    EXPECT(aclFinalize(), ACL_ERROR_REPEAT_FINALIZE);
    printf("OK\n");
    return 0;
}
"""

STREAMS = r"""
#include <time.h>

static void d2h(float *dst, void *src, size_t n) {
    CHECK(aclrtMemcpy(dst, n * sizeof(float), src, n * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST));
}

int main(void) {
    enum { N = 4096 };
    static float h[N];
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    void *x, *y, *z, *w;
    CHECK(aclrtMalloc(&x, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&y, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&z, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&w, N * 4, ACL_MEM_MALLOC_HUGE_FIRST));

    /* FIFO within a stream: every step depends on the previous one. */
    aclrtStream s1, s2;
    CHECK(aclrtCreateStream(&s1));
    CHECK(aclrtCreateStream(&s2));
    CHECK(npusimLaunchFill(x, N, 1.0f, s1));
    CHECK(npusimLaunchFill(y, N, 2.0f, s1));
    CHECK(npusimLaunchAxpy(N, 3.0f, x, y, s1));
    for (int i = 0; i < 100; i++) CHECK(npusimLaunchAxpy(N, 1.0f, x, y, s1));
    CHECK(npusimLaunchCopy(z, y, N * 4, s1));
    CHECK(aclrtSynchronizeStream(s1));
    d2h(h, z, N);
    for (int i = 0; i < N; i++) ASSERT(h[i] == 105.0f);

    /* Matmul against the CPU (small integers: exact in float32). */
    enum { M = 7, K = 5, P = 6 };
    float A[M * K], B[K * P], C[M * P], R[M * P];
    for (int i = 0; i < M * K; i++) A[i] = (float)(i % 5 - 2);
    for (int i = 0; i < K * P; i++) B[i] = (float)(i % 7 - 3);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < P; j++) {
            float acc = 0;
            for (int k = 0; k < K; k++) acc += A[i * K + k] * B[k * P + j];
            R[i * P + j] = acc;
        }
    CHECK(aclrtMemcpyAsync(x, sizeof(A), A, sizeof(A), ACL_MEMCPY_HOST_TO_DEVICE, s1));
    CHECK(aclrtMemcpyAsync(y, sizeof(B), B, sizeof(B), ACL_MEMCPY_HOST_TO_DEVICE, s1));
    CHECK(npusimLaunchMatmul(M, P, K, x, y, z, s1));
    CHECK(aclrtMemcpyAsync(C, sizeof(C), z, sizeof(C), ACL_MEMCPY_DEVICE_TO_HOST, s1));
    CHECK(aclrtSynchronizeStream(s1));
    ASSERT(memcmp(C, R, sizeof(C)) == 0);

    /* Streams run concurrently: s1 waits on an event that s2 records later. */
    aclrtEvent e;
    CHECK(aclrtCreateEvent(&e));
    CHECK(npusimLaunchFill(z, N, 0.0f, s1));
    CHECK(aclrtStreamWaitEvent(s1, e));
    CHECK(npusimLaunchFill(z, N, 7.0f, s1));
    CHECK(npusimLaunchFill(w, N, 3.0f, s2));
    CHECK(aclrtSynchronizeStream(s2));  /* s2 is not held up by s1 */
    d2h(h, w, N);
    ASSERT(h[0] == 3.0f && h[N - 1] == 3.0f);
    d2h(h, z, N);
    ASSERT(h[0] == 0.0f);  /* s1 is still waiting */
    CHECK(aclrtRecordEvent(e, s2));
    CHECK(aclrtSynchronizeStream(s1));
    d2h(h, z, N);
    ASSERT(h[0] == 7.0f && h[N - 1] == 7.0f);
    CHECK(aclrtSynchronizeEvent(e));

    /* Event timing. */
    aclrtEvent t0, t1, never;
    CHECK(aclrtCreateEvent(&t0));
    CHECK(aclrtCreateEvent(&t1));
    CHECK(aclrtCreateEvent(&never));
    void *big;
    CHECK(aclrtMalloc(&big, 3 * 256 * 256 * 4, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtRecordEvent(t0, s1));
    CHECK(npusimLaunchMatmul(256, 256, 256, big, (char *)big + 256 * 256 * 4, (char *)big + 2 * 256 * 256 * 4, s1));
    CHECK(aclrtRecordEvent(t1, s1));
    CHECK(aclrtSynchronizeEvent(t1));
    float ms = -1;
    CHECK(aclrtEventElapsedTime(&ms, t0, t1));
    ASSERT(ms > 0.0f);
    EXPECT(aclrtEventElapsedTime(&ms, t0, never), ACL_ERROR_RT_EVENT_NOT_COMPLETE);

    /* Kernels only touch their stream's device. */
    CHECK(aclrtSetDevice(1));
    void *other;
    CHECK(aclrtMalloc(&other, 4096, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtSetDevice(0));
    EXPECT(npusimLaunchFill(other, 16, 1.0f, s1), ACL_ERROR_INVALID_PARAM);

    /* A stream stuck on an event that is never recorded can still be force-destroyed. */
    aclrtStream stuck;
    CHECK(aclrtCreateStream(&stuck));
    CHECK(aclrtStreamWaitEvent(stuck, never));
    CHECK(npusimLaunchFill(w, N, 9.0f, stuck));
    CHECK(aclrtDestroyStreamForce(stuck));
    d2h(h, w, N);
    ASSERT(h[0] == 3.0f);
    EXPECT(aclrtSynchronizeStream(stuck), ACL_ERROR_INVALID_PARAM);

    CHECK(aclrtSynchronizeDevice());
    CHECK(aclrtDestroyEvent(e));
    CHECK(aclrtDestroyStream(s1));
    CHECK(aclrtDestroyStream(s2));
    CHECK(aclFinalize());
    printf("OK\n");
    return 0;
}
"""

PEER = r"""
int main(void) {
    enum { N = 1 << 20 };
    static unsigned char src[N], dst[N];
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 13 + 1);
    CHECK(aclInit(NULL));
    void *a0, *a1;
    CHECK(aclrtSetDevice(1));
    CHECK(aclrtMalloc(&a1, N, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtMalloc(&a0, N, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(a0, N, src, N, ACL_MEMCPY_HOST_TO_DEVICE));

    int32_t can = 0;
    CHECK(aclrtDeviceCanAccessPeer(&can, 0, 1));
    ASSERT(can == 1);
    EXPECT(aclrtDeviceCanAccessPeer(&can, 0, 0), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtDeviceCanAccessPeer(&can, 0, 2), ACL_ERROR_RT_INVALID_DEVICEID);

    /* Across devices only with peer access. */
    EXPECT(aclrtMemcpy(a1, N, a0, N, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    EXPECT(aclrtDeviceEnablePeerAccess(1, 1), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtDeviceEnablePeerAccess(0, 0), ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtDeviceEnablePeerAccess(1, 0));
    CHECK(aclrtMemcpy(a1, N, a0, N, ACL_MEMCPY_DEVICE_TO_DEVICE));
    CHECK(aclrtMemcpy(dst, N, a1, N, ACL_MEMCPY_DEVICE_TO_HOST));
    ASSERT(memcmp(src, dst, N) == 0);
    CHECK(aclrtMemset(a0, N, 0, N));
    CHECK(aclrtMemcpyAsync(a0, N, a1, N, ACL_MEMCPY_DEVICE_TO_DEVICE, NULL));
    CHECK(aclrtSynchronizeStream(NULL));
    memset(dst, 0, N);
    CHECK(aclrtMemcpy(dst, N, a0, N, ACL_MEMCPY_DEVICE_TO_HOST));
    ASSERT(memcmp(src, dst, N) == 0);
    CHECK(aclrtDeviceDisablePeerAccess(1));
    EXPECT(aclrtDeviceDisablePeerAccess(1), ACL_ERROR_INVALID_PARAM);
    EXPECT(aclrtMemcpy(a1, N, a0, N, ACL_MEMCPY_DEVICE_TO_DEVICE), ACL_ERROR_RT_FEATURE_NOT_SUPPORT);
    CHECK(aclFinalize());
    printf("OK\n");
    return 0;
}
"""

CALLBACKS = r"""
#include <unistd.h>

static int calls[6];
static int devices_seen;
static uint32_t count_cb(int32_t deviceId, void *args) {
    calls[(intptr_t)args]++;
    devices_seen |= 1 << deviceId;
    return 0;
}
static uint32_t failing_cb(int32_t deviceId, void *args) {
    (void)deviceId;
    (void)args;
    return 1;
}

int main(void) {
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtSetDevice(1));
    for (intptr_t s = ACL_RT_SNAPSHOT_LOCK_PRE; s <= ACL_RT_SNAPSHOT_UNLOCK_POST; s++)
        CHECK(aclrtSnapShotCallbackRegister((aclrtSnapShotStage)s, count_cb, (void *)s));
    EXPECT(aclrtSnapShotCallbackRegister(ACL_RT_SNAPSHOT_LOCK_PRE, count_cb, NULL),
           ACL_ERROR_SNAPSHOT_REGISTER_CALLBACK_FAILED);
    EXPECT(aclrtSnapShotCallbackRegister((aclrtSnapShotStage)6, count_cb, NULL), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT(aclrtSnapShotCallbackRegister(ACL_RT_SNAPSHOT_LOCK_PRE, NULL, NULL), ACL_ERROR_RT_PARAM_INVALID);
    EXPECT(aclrtSnapShotCallbackUnregister(ACL_RT_SNAPSHOT_LOCK_PRE, failing_cb), ACL_ERROR_RT_PARAM_INVALID);

    int pid = getpid();
    CHECK(aclrtSnapShotProcessLock(pid, NULL));
    CHECK(aclrtSnapShotProcessBackup(pid, NULL));
    CHECK(aclrtSnapShotProcessRestore(pid, NULL));
    CHECK(aclrtSnapShotProcessUnlock(pid, NULL));
    for (int s = 0; s < 6; s++) ASSERT(calls[s] == 2);  /* once per open device */
    ASSERT(devices_seen == 3);

    /* A failing LOCK_PRE callback fails the lock and leaves the process running. */
    CHECK(aclrtSnapShotCallbackRegister(ACL_RT_SNAPSHOT_LOCK_PRE, failing_cb, NULL));
    EXPECT(aclrtSnapShotProcessLock(pid, NULL), ACL_ERROR_SNAPSHOT_CALLBACK_FAILED);
    void *p;
    CHECK(aclrtMalloc(&p, 64, ACL_MEM_MALLOC_HUGE_FIRST));
    EXPECT(aclrtSnapShotProcessUnlock(pid, NULL), ACL_ERROR_SNAPSHOT_UNLOCK_FAILED);
    CHECK(aclrtSnapShotCallbackUnregister(ACL_RT_SNAPSHOT_LOCK_PRE, failing_cb));
    CHECK(aclrtSnapShotProcessLock(pid, NULL));
    aclrtSnapShotBackupArgs args;
    memset(&args, 0, sizeof(args));
    args.backupFlags = 5;
    EXPECT(aclrtSnapShotProcessBackup(pid, &args), ACL_ERROR_INVALID_PARAM);
    CHECK(aclrtSnapShotProcessUnlock(pid, NULL));
    CHECK(aclFinalize());
    printf("OK\n");
    return 0;
}
"""


HOST_MEMSET = r"""
int main(void) {
    enum { N = (3 << 20) + 77 };
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    /* CANN: host or device, decided by the address; malloc'd and aclrtMallocHost memory alike. */
    unsigned char *plain = malloc(N), *pinned;
    CHECK(aclrtMallocHost((void **)&pinned, N));
    memset(plain, 1, N);
    CHECK(aclrtMemset(plain, N, 0xAB, N));
    for (size_t k = 0; k < N; k++) ASSERT(plain[k] == 0xAB);
    CHECK(aclrtMemset(pinned + 3, N - 3, 0x11, N - 3));
    for (size_t k = 3; k < N; k++) ASSERT(pinned[k] == 0x11);
    EXPECT(aclrtMemset(plain, 10, 0, 11), ACL_ERROR_INVALID_PARAM);   /* maxCount still counts */
    EXPECT(aclrtMemset(NULL, 10, 0, 10), ACL_ERROR_INVALID_PARAM);
    /* Async on host memory runs in stream order: after the D2H copy queued before it. */
    aclrtStream stream;
    CHECK(aclrtCreateStream(&stream));
    void *dev;
    CHECK(aclrtMalloc(&dev, N, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemset(dev, N, 0x22, N));
    CHECK(aclrtMemcpyAsync(pinned, N, dev, N, ACL_MEMCPY_DEVICE_TO_HOST, stream));
    CHECK(aclrtMemsetAsync(pinned, N / 2, 0x33, N / 2, stream));
    CHECK(aclrtSynchronizeStream(stream));
    for (size_t k = 0; k < N; k++) ASSERT(pinned[k] == (k < N / 2 ? 0x33 : 0x22));
    CHECK(aclrtFree(dev));
    CHECK(aclrtFreeHost(pinned));
    free(plain);
    CHECK(aclrtDestroyStream(stream));
    CHECK(aclFinalize());
    printf("OK\n");
    return 0;
}
"""

PEER_AFTER_RESET = r"""
int main(void) {
    enum { N = 4096 };
    static unsigned char src[N], dst[N];
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i * 7 + 3);
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(1));
    CHECK(aclrtSetDevice(0));
    CHECK(aclrtDeviceEnablePeerAccess(1, 0));
    /* Resetting the peer frees its resources, not the link the driver holds for device 0. */
    CHECK(aclrtResetDeviceForce(1));
    CHECK(aclrtDeviceDisablePeerAccess(1));
    EXPECT(aclrtDeviceDisablePeerAccess(1), ACL_ERROR_INVALID_PARAM);
    /* And a link kept over the reset still carries copies once device 1 is set again. */
    CHECK(aclrtDeviceEnablePeerAccess(1, 0));
    CHECK(aclrtResetDevice(1));
    CHECK(aclrtSetDevice(1));
    void *a1;
    CHECK(aclrtMalloc(&a1, N, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtSetDevice(0));
    void *a0;
    CHECK(aclrtMalloc(&a0, N, ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMemcpy(a0, N, src, N, ACL_MEMCPY_HOST_TO_DEVICE));
    CHECK(aclrtMemcpy(a1, N, a0, N, ACL_MEMCPY_DEVICE_TO_DEVICE));
    CHECK(aclrtMemcpy(dst, N, a1, N, ACL_MEMCPY_DEVICE_TO_HOST));
    ASSERT(memcmp(src, dst, N) == 0);
    CHECK(aclrtDeviceDisablePeerAccess(1));
    CHECK(aclFinalize());
    printf("OK\n");
    return 0;
}
"""


def test_memory_round_trips_and_argument_checks(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(MEMORY, npusim_daemon, tmp_path) == "OK\n"


def test_streams_events_and_kernels(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(STREAMS, npusim_daemon, tmp_path) == "OK\n"


def test_peer_access(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(PEER, npusim_daemon, tmp_path) == "OK\n"


def test_snapshot_callbacks(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(CALLBACKS, npusim_daemon, tmp_path) == "OK\n"


def test_memset_on_host_memory(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(HOST_MEMSET, npusim_daemon, tmp_path) == "OK\n"


def test_peer_access_survives_a_reset_of_the_peer(npusim_daemon, tmp_path: Path) -> None:
    assert build_and_run(PEER_AFTER_RESET, npusim_daemon, tmp_path) == "OK\n"

/*
 * A multi-threaded AscendCL program for the pipeline tests (tests/pipeline/), written against the
 * CANN-shaped headers only (acl/acl.h, plus npusim's kernel launches from acl/npusim.h).
 *
 *     acl_threads STEPS SLEEP_MS THREADS
 *
 * Every thread has its own stream and its own device buffers. Each step a thread queues an async
 * host-to-device copy, kernels (axpy, copy, two matmuls, fill) and async device-to-host copies on
 * its stream, then sleeps SLEEP_MS with that work queued and unsynchronized (in flight), and only
 * then synchronizes the stream and digests what came back. A barrier keeps the threads in step,
 * and thread 0 prints one line per step with every thread's digest, so the output does not depend
 * on scheduling:
 *
 *     ready pid N threads T
 *     step S t0=XXXXXXXXXXXXXXXX t1=... ...
 *     done t0=... t1=...        (a digest of each thread's whole device memory)
 *
 * The output depends only on STEPS and THREADS, never on SLEEP_MS. Any device byte lost or
 * changed across a checkpoint/restore shows up as a different digest. Exit 0 on success; any
 * failing call prints the call and its aclError on stderr (= stdout here) and exits 3.
 */
#include <acl/acl.h>
#include <acl/npusim.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "step_gate.h"

#define CHECK(x) do { aclError rc_ = (x); if (rc_ != ACL_SUCCESS) { \
    fprintf(stderr, "acl_threads: line %d: %s = %d\n", __LINE__, #x, rc_); fflush(stderr); exit(3); } } while (0)

enum { N = 1 << 17, M = 320, MAX_THREADS = 16 };  /* N floats per vector buffer; M x M matmuls */

static int steps, sleep_ms, nthreads;
static pthread_barrier_t barrier;
static uint64_t *digests;  /* [step * nthreads + thread] */
static uint64_t final_digest[MAX_THREADS];

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) { h ^= b[i]; h *= 1099511628211ULL; }
    return h;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    CHECK(aclrtSetDevice(0));  /* the current device is per thread */
    aclrtStream s;
    CHECK(aclrtCreateStream(&s));
    void *a, *b, *ma, *mb, *mc, *md;
    CHECK(aclrtMalloc(&a, N * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&b, N * sizeof(float), ACL_MEM_MALLOC_HUGE_FIRST));
    CHECK(aclrtMalloc(&ma, M * M * sizeof(float), ACL_MEM_MALLOC_NORMAL_ONLY));
    CHECK(aclrtMalloc(&mb, M * M * sizeof(float), ACL_MEM_MALLOC_NORMAL_ONLY));
    CHECK(aclrtMalloc(&mc, M * M * sizeof(float), ACL_MEM_MALLOC_NORMAL_ONLY));
    CHECK(aclrtMalloc(&md, M * M * sizeof(float), ACL_MEM_MALLOC_NORMAL_ONLY));
    float *in, *out;
    size_t out_bytes = (N + 2 * M * M) * sizeof(float);
    CHECK(aclrtMallocHost((void **)&in, N * sizeof(float)));
    CHECK(aclrtMallocHost((void **)&out, out_bytes));

    CHECK(npusimLaunchFill(a, N, 0.25f * (float)(id + 1), s));
    CHECK(npusimLaunchFill(mb, M * M, 1.0f / M, s));  /* c = a . mb: row means of a */
    CHECK(aclrtSynchronizeStream(s));
    pthread_barrier_wait(&barrier);

    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < N; i++) in[i] = (float)((i * 7 + step * 13 + id * 31) % 1000) / 256.0f;
        CHECK(aclrtMemcpyAsync(b, N * sizeof(float), in, N * sizeof(float), ACL_MEMCPY_HOST_TO_DEVICE, s));
        CHECK(npusimLaunchAxpy(N, 0.5f, b, a, s));                      /* a += b / 2 */
        CHECK(npusimLaunchCopy(ma, a, M * M * sizeof(float), s));       /* ma = a[0 : M*M] */
        CHECK(npusimLaunchMatmul(M, M, M, ma, mb, mc, s));              /* mc = ma . mb */
        CHECK(npusimLaunchMatmul(M, M, M, mc, ma, md, s));              /* md = mc . ma */
        CHECK(npusimLaunchAxpy(M * M, -0.75f, mc, a, s));               /* a[0 : M*M] -= 3/4 mc */
        CHECK(npusimLaunchFill(mc, M * M, (float)step, s));
        CHECK(aclrtMemcpyAsync(out, N * sizeof(float), a, N * sizeof(float), ACL_MEMCPY_DEVICE_TO_HOST, s));
        CHECK(aclrtMemcpyAsync(out + N, M * M * sizeof(float), md, M * M * sizeof(float),
                               ACL_MEMCPY_DEVICE_TO_HOST, s));
        CHECK(aclrtMemcpyAsync(out + N + M * M, M * M * sizeof(float), mc, M * M * sizeof(float),
                               ACL_MEMCPY_DEVICE_TO_HOST, s));
        if (sleep_ms) usleep((useconds_t)sleep_ms * 1000);  /* the work above is in flight meanwhile */
        step_gate(step);  /* every thread, its work still in flight */
        CHECK(aclrtSynchronizeStream(s));
        digests[step * nthreads + id] = fnv1a(14695981039346656037ULL, out, out_bytes);
        pthread_barrier_wait(&barrier);
        if (id == 0) {
            printf("step %d", step);
            for (int t = 0; t < nthreads; t++) printf(" t%d=%016llx", t, (unsigned long long)digests[step * nthreads + t]);
            printf("\n");
            fflush(stdout);
        }
    }

    /* Digest every device byte of this thread (synchronous copies on the default stream). */
    void *bufs[] = {a, b, ma, mb, mc, md};
    size_t sizes[] = {N * sizeof(float), N * sizeof(float), M * M * sizeof(float), M * M * sizeof(float),
                      M * M * sizeof(float), M * M * sizeof(float)};
    uint64_t h = 14695981039346656037ULL;
    for (int k = 0; k < 6; k++) {
        CHECK(aclrtMemcpy(out, out_bytes, bufs[k], sizes[k], ACL_MEMCPY_DEVICE_TO_HOST));
        h = fnv1a(h, out, sizes[k]);
        CHECK(aclrtFree(bufs[k]));
    }
    final_digest[id] = h;
    CHECK(aclrtDestroyStream(s));
    CHECK(aclrtFreeHost(in));
    CHECK(aclrtFreeHost(out));
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s STEPS SLEEP_MS THREADS\n", argv[0]);
        return 2;
    }
    steps = atoi(argv[1]);
    sleep_ms = atoi(argv[2]);
    nthreads = atoi(argv[3]);
    if (steps < 0 || sleep_ms < 0 || nthreads < 1 || nthreads > MAX_THREADS) return 2;
    digests = calloc((size_t)steps * nthreads + 1, sizeof(*digests));
    CHECK(aclInit(NULL));
    CHECK(aclrtSetDevice(0));
    printf("ready pid %d threads %d\n", (int)getpid(), nthreads);
    fflush(stdout);
    pthread_barrier_init(&barrier, NULL, (unsigned)nthreads);
    pthread_t th[MAX_THREADS];
    for (int t = 0; t < nthreads; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    for (int t = 0; t < nthreads; t++) pthread_join(th[t], NULL);
    printf("done");
    for (int t = 0; t < nthreads; t++) printf(" t%d=%016llx", t, (unsigned long long)final_digest[t]);
    printf("\n");
    fflush(stdout);
    CHECK(aclrtResetDevice(0));
    CHECK(aclFinalize());
    return 0;
}

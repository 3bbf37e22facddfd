/*
 * libnpusnap_agent.so: the agent npusnap puts inside a target process.
 *
 * It arrives by LD_PRELOAD (npusnap run) or by a ptrace-driven dlopen
 * (npusnap attach, see inject.c). The constructor only starts one detached
 * control thread, with every signal blocked; everything else happens there.
 *
 * Protocol (native/README.md, "agent <-> CLI"; its names and codes are defined once, in
 * native/include/npusnap/agent.h, and Python's come from there): abstract Unix socket
 * "@npusnap-agent-<pid>" (or "@npusnap-agent-<pid>-<random hex>" when someone
 * squats that name), peers must be this process's uid or root (SO_PEERCRED); one request line per connection, one JSON line back, then
 * the agent closes. Requests: ping, status, lock <timeout_ms> [<lease_ms>],
 * renew <lease_ms>, backup, restore, unlock. Device commands call
 * aclrtSnapShotProcess*(getpid(), NULL) of the runtime, found lazily at the
 * first command that needs it. `backup external` / `restore external` take
 * npusim's direct path (npusimSnapshotSetDataPath: metadata only, the daemon
 * exports/imports the data); refused with NPUSNAP_AGENT_E_UNSUPPORTED elsewhere.
 *
 * Lease: `lock T L` (L > 0) holds the lock on a lease of L ms; `renew L`
 * extends it; `unlock` ends it. If the lease runs out while the process is
 * LOCKED the agent unlocks by itself; while BACKED_UP it restores the device
 * and unlocks. So a CLI that dies half-way never leaves the workload locked.
 * The lease counts time the process actually ran: a ticker thread wakes every
 * LEASE_TICK_MS and counts the time since its last wakeup capped at
 * LEASE_MAX_STEP_MS, so a CRIU freeze or a SIGSTOP (the dump leaves the tree
 * stopped) does not eat the lease, and neither does a long backup or restore
 * (the ticker waits for the mutex the command holds).
 *
 * Fencing: once a lease has run out, `renew` answers NPUSNAP_AGENT_E_LEASE_LOST
 * (until the next lock), so a CLI that was stopped past its lease learns that
 * it no longer owns the next step. After an external (direct-path) backup the
 * device data lives only in files the agent cannot read: expiry then leaves
 * the process BACKED_UP (restoring without the data would strand it LOCKED,
 * awaiting an import) for the CLI's rollback or `npusnap recover`.
 *
 * Reply "code" is the runtime's aclError, 507905 for a lock timeout, or one
 * of the agent's own negative codes (NPUSNAP_AGENT_E_*, npusnap/agent.h) for requests the agent
 * refused without calling the runtime.
 *
 * Nothing is exported: every symbol is static and the library is built with
 * hidden visibility and -z nodelete (the control thread runs our code, so it
 * must never be unloaded).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "acl/npusim.h"      /* NPUSIM_DATA_PATH_* (the agent links no runtime: dlsym) */
#include "npusnap/agent.h"   /* the protocol: requests, reply fields, codes, states, socket name */

_Static_assert(NPUSNAP_AGENT_LOCK_TIMEOUT == ACL_ERROR_SNAPSHOT_LOCK_TIMEOUT,
               "the agent reports CANN's own lock timeout code");

#define IO_TIMEOUT_S 5          /* per-connection read/write bound */
#define DEFAULT_LOCK_MS 30000   /* "lock" without an argument */
#define MAX_LOCK_MS 86400000L   /* one day */
#define DEVICE_INFO_MAX 4096
#define LOCK_REASON_GRACE_MS 500 /* see do_lock */
#define LEASE_TICK_MS 50        /* the lease ticker's period */
#define LEASE_MAX_STEP_MS 100   /* most run time one tick may count (frozen time does not) */
#define LEASE_RETRY_MS 1000     /* after a failed expiry action, retry this much later */

typedef int (*snap_fn)(int pid, void *reserved);
typedef int (*info_fn)(char *buf, size_t len);
typedef const char *(*recent_error_fn)(void);
typedef int (*lock_timeout_fn)(int pid, int32_t timeout_ms);
typedef int (*set_path_fn)(int external);
typedef int (*get_path_fn)(void);
typedef int (*option_fn)(const char *key, const char *value);

enum state { ST_RUNNING, ST_LOCKED, ST_BACKED_UP };
static const char *const state_names[] = {NPUSNAP_STATE_RUNNING, NPUSNAP_STATE_LOCKED, NPUSNAP_STATE_BACKED_UP};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC, set up by the control thread */
    int listen_fd;
    enum state state;
    /* runtime, resolved lazily and kept once found */
    snap_fn lock, backup, restore, unlock;
    info_fn info;
    lock_timeout_fn lock_timeout; /* npusim: a lock bounded by the caller's timeout; CANN lacks it */
    long lock_timeout_ms;
    /* npusim's direct path (optional): `backup external` / `restore external` */
    set_path_fn set_data_path;
    get_path_fn get_data_path;
    option_fn hccl_option; /* npusim: npusimHcclSnapshotOption (`hccl KEY VALUE`), optional */
    recent_error_fn recent_error; /* aclGetRecentErrMsg: why the calling thread's last call failed */
    char runtime[PATH_MAX];
    /* lock worker: pending while a worker is inside the runtime's lock call */
    int lock_pending, lock_done, lock_rc, lock_abandoned;
    char lock_error[320]; /* the runtime's reason for a refused lock, or empty */
    /* lease on the lock (lease_armed: lease_left_ms counts down in run time) */
    int lease_armed;
    int lease_lost; /* the last lease ran out: renew is refused until the next lock */
    double lease_left_ms;
    pthread_cond_t lease_cv; /* wakes the ticker when a lease is armed */
    char log_path[PATH_MAX];
} g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .listen_fd = -1,
    .state = ST_RUNNING,
};

/* ---------------------------------------------------------------- helpers */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Appends one line to $NPUSNAP_AGENT_LOG; opened and closed each time so no
 * descriptor of ours stays open across a checkpoint. */
__attribute__((format(printf, 1, 2))) static void log_line(const char *fmt, ...)
{
    if (!g.log_path[0])
        return;
    char line[1024];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - (size_t)n, ".%03ld npusnap-agent[%d] ",
                  ts.tv_nsec / 1000000L, (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof line)
        n += vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof line - 2)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    int fd = open(g.log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return;
    ssize_t w = write(fd, line, (size_t)n);
    (void)w;
    close(fd);
}

struct buf {
    char *p;
    size_t len, cap;
};

static void buf_add(struct buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap)
        n = b->cap - b->len - 1; /* truncate rather than overflow */
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

__attribute__((format(printf, 2, 3))) static void buf_printf(struct buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        buf_add(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void buf_json_str(struct buf *b, const char *s)
{
    if (!s) {
        buf_add(b, "null", 4);
        return;
    }
    buf_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            buf_add(b, e, 2);
        } else if (c < 0x20) {
            buf_printf(b, "\\u%04x", c);
        } else {
            buf_add(b, (const char *)&c, 1);
        }
    }
    buf_add(b, "\"", 1);
}

/* ---------------------------------------------------------------- runtime */

struct names {
    char **v;
    size_t n, cap;
};

static int collect_object(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    struct names *nm = data;
    if (!info->dlpi_name || !info->dlpi_name[0])
        return 0; /* the main program, or an anonymous object */
    if (nm->n == nm->cap) {
        size_t cap = nm->cap ? nm->cap * 2 : 64;
        char **v = realloc(nm->v, cap * sizeof *v);
        if (!v)
            return 1;
        nm->v = v;
        nm->cap = cap;
    }
    char *s = strdup(info->dlpi_name);
    if (s)
        nm->v[nm->n++] = s;
    return 0;
}

/* A handle on which dlsym finds the snapshot API, or NULL. RTLD_DEFAULT first;
 * then every loaded object, because a runtime that a Python extension pulled
 * in is RTLD_LOCAL and invisible to RTLD_DEFAULT. The names are collected
 * first and opened after dl_iterate_phdr returns (no loader calls while the
 * loader's list lock is held). */
static void *find_runtime_handle(void)
{
    if (dlsym(RTLD_DEFAULT, "aclrtSnapShotProcessLock"))
        return dlopen(NULL, RTLD_LAZY); /* the global scope; RTLD_DEFAULT is NULL in glibc */
    struct names nm = {0};
    dl_iterate_phdr(collect_object, &nm);
    void *found = NULL;
    for (size_t i = 0; i < nm.n; i++) {
        if (!found) {
            void *h = dlopen(nm.v[i], RTLD_NOLOAD | RTLD_LAZY);
            if (h && dlsym(h, "aclrtSnapShotProcessLock"))
                found = h; /* keep the reference: the runtime never unloads under us */
            else if (h)
                dlclose(h);
        }
        free(nm.v[i]);
    }
    free(nm.v);
    return found;
}

/* Returns NULL when the runtime is usable, else a message. Called under g.mu. */
static const char *resolve_runtime(void)
{
    if (g.lock)
        return NULL;
    void *h = find_runtime_handle();
    if (!h)
        return "no device runtime loaded in this process";
    snap_fn l = (snap_fn)dlsym(h, "aclrtSnapShotProcessLock");
    snap_fn b = (snap_fn)dlsym(h, "aclrtSnapShotProcessBackup");
    snap_fn r = (snap_fn)dlsym(h, "aclrtSnapShotProcessRestore");
    snap_fn u = (snap_fn)dlsym(h, "aclrtSnapShotProcessUnlock");
    if (!l || !b || !r || !u)
        return "the loaded device runtime lacks part of the aclrtSnapShotProcess* API";
    Dl_info di;
    if (dladdr((void *)l, &di) && di.dli_fname)
        snprintf(g.runtime, sizeof g.runtime, "%s", di.dli_fname);
    g.info = (info_fn)dlsym(h, "npusimSnapshotInfo");
    g.recent_error = (recent_error_fn)dlsym(h, "aclGetRecentErrMsg");
    g.lock_timeout = (lock_timeout_fn)dlsym(h, "npusimSnapShotProcessLockTimeout");
    g.set_data_path = (set_path_fn)dlsym(h, "npusimSnapshotSetDataPath");
    g.get_data_path = (get_path_fn)dlsym(h, "npusimSnapshotGetDataPath");
    g.hccl_option = (option_fn)dlsym(h, "npusimHcclSnapshotOption");
    if (!g.get_data_path)
        g.set_data_path = NULL;
    g.backup = b;
    g.restore = r;
    g.unlock = u;
    g.lock = l; /* last: g.lock != NULL means "resolved" */
    return NULL;
}

/* Fills out (a JSON object on one line) from npusimSnapshotInfo; empty when
 * the runtime lacks it or it fails. */
static void device_info(char *out, size_t len)
{
    out[0] = '\0';
    if (!g.info)
        return;
    int n = g.info(out, len);
    if (n <= 0 || (size_t)n >= len) {
        out[0] = '\0';
        return;
    }
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
        out[--n] = '\0';
    for (int i = 0; i < n; i++)
        if (out[i] == '\n' || out[i] == '\r')
            out[i] = ' ';
    if (out[0] != '{' || n == 0 || out[n - 1] != '}')
        out[0] = '\0';
}

/* The runtime is authoritative about its state when it can tell us. */
static void sync_state(const char *info)
{
    const char *p = info[0] ? strstr(info, "\"state\"") : NULL;
    if (!p)
        return;
    p += 7;
    while (*p == ' ' || *p == ':')
        p++;
    for (int s = ST_RUNNING; s <= ST_BACKED_UP; s++) {
        size_t n = strlen(state_names[s]);
        if (*p == '"' && strncmp(p + 1, state_names[s], n) == 0 && p[1 + n] == '"') {
            g.state = (enum state)s;
            return;
        }
    }
}

/* Under g.mu: the backup held now was taken on npusim's direct path (its data is in files). */
static int backup_is_external(void)
{
    return g.get_data_path && (g.get_data_path() & NPUSIM_DATA_PATH_HELD_EXTERNAL);
}

/* ---------------------------------------------------------------- lock */

static void *lock_worker(void *arg)
{
    (void)arg;
    /* Where the runtime lets us, its own wait is bounded by the caller's timeout, so a caller
     * who gives up does not leave the workload's device calls gated for CANN's full 60 s. */
    int rc = g.lock_timeout ? g.lock_timeout(getpid(), (int32_t)g.lock_timeout_ms) : g.lock(getpid(), NULL);
    /* The reason is per thread in the runtime: read it on the thread that called. */
    const char *why = rc != 0 && g.recent_error ? g.recent_error() : NULL;
    pthread_mutex_lock(&g.mu);
    snprintf(g.lock_error, sizeof g.lock_error, "the runtime refused to lock%s%s", why && why[0] ? ": " : "",
             why ? why : "");
    int abandoned = g.lock_abandoned;
    if (!abandoned) {
        g.lock_done = 1;
        g.lock_rc = rc;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
        return NULL;
    }
    pthread_mutex_unlock(&g.mu);
    /* The caller gave up: never leave the workload locked behind its back. */
    int urc = rc == 0 ? g.unlock(getpid(), NULL) : 0;
    log_line("abandoned lock returned %d after the caller's timeout%s (unlock rc %d)", rc,
             rc == 0 ? "; unlocked at once" : "", urc);
    pthread_mutex_lock(&g.mu);
    g.lock_pending = 0;
    g.lock_abandoned = 0;
    g.state = ST_RUNNING;
    pthread_mutex_unlock(&g.mu);
    return NULL;
}

/* Called under g.mu with the runtime resolved and state RUNNING. */
static int do_lock(long timeout_ms, const char **err)
{
    g.lock_timeout_ms = timeout_ms > 0 && timeout_ms < INT32_MAX ? timeout_ms : INT32_MAX;
    g.lock_pending = 1;
    g.lock_done = 0;
    g.lock_abandoned = 0;
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    int e = pthread_create(&t, &a, lock_worker, NULL);
    pthread_attr_destroy(&a);
    if (e) {
        g.lock_pending = 0;
        *err = "could not start the lock worker thread";
        return NPUSNAP_AGENT_E_INTERNAL;
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    /* A runtime whose own wait is bounded by timeout_ms answers just after it, with its reason
     * (e.g. which HCCL peer is not locking): worth a moment more than the bare timeout. */
    long wait_ms = timeout_ms + (g.lock_timeout ? LOCK_REASON_GRACE_MS : 0);
    dl.tv_sec += wait_ms / 1000;
    dl.tv_nsec += (wait_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    while (!g.lock_done) {
        if (pthread_cond_timedwait(&g.cv, &g.mu, &dl) == ETIMEDOUT && !g.lock_done) {
            g.lock_abandoned = 1; /* the worker undoes the lock if it ever succeeds */
            *err = "lock did not complete within the timeout; the agent will unlock if the "
                   "runtime's lock returns later";
            return NPUSNAP_AGENT_LOCK_TIMEOUT;
        }
    }
    g.lock_pending = 0;
    if (g.lock_rc == 0)
        g.state = ST_LOCKED;
    else
        *err = g.lock_error;
    return g.lock_rc;
}

/* ---------------------------------------------------------------- lease */

/* Called under g.mu. */
static void lease_arm(long ms)
{
    g.lease_armed = 1;
    g.lease_left_ms = (double)ms;
    pthread_cond_broadcast(&g.lease_cv);
}

static void lease_disarm(void) { g.lease_armed = 0; g.lease_left_ms = 0; }

/* The lease ran out (called under g.mu, runtime resolved): put the process
 * back to RUNNING as the CLI's undo would have. On failure retry later; the
 * process stays locked meanwhile (its device calls could not work anyway). */
static void lease_expire(void)
{
    char info[DEVICE_INFO_MAX];
    device_info(info, sizeof info);
    sync_state(info);
    enum state st = g.state;
    g.lease_lost = 1;
    if (st == ST_RUNNING) {
        lease_disarm();
        return;
    }
    if (st == ST_BACKED_UP && backup_is_external()) {
        lease_disarm();
        log_line("lease expired while BACKED_UP externally: the device data is in files; "
                 "left for the CLI or `npusnap recover --device-images`");
        return;
    }
    if (st == ST_BACKED_UP) {
        int rc = g.restore(getpid(), NULL);
        if (rc != 0) {
            log_line("lease expired while BACKED_UP; restore failed rc %d, retrying in %d ms", rc,
                     LEASE_RETRY_MS);
            g.lease_left_ms = LEASE_RETRY_MS;
            return;
        }
        g.state = ST_LOCKED;
        log_line("lease expired while BACKED_UP: device state restored");
    }
    int rc = g.unlock(getpid(), NULL);
    if (rc != 0) {
        log_line("lease expired; unlock failed rc %d, retrying in %d ms", rc, LEASE_RETRY_MS);
        g.lease_left_ms = LEASE_RETRY_MS;
        return;
    }
    g.state = ST_RUNNING;
    lease_disarm();
    log_line("lease expired while %s: unlocked by the agent", state_names[st]);
}

static void *lease_ticker(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "npusnap-lease");
    pthread_mutex_lock(&g.mu);
    for (;;) {
        while (!g.lease_armed)
            pthread_cond_wait(&g.lease_cv, &g.mu);
        double last = now_ms();
        while (g.lease_armed) {
            pthread_mutex_unlock(&g.mu);
            struct timespec ts = {0, LEASE_TICK_MS * 1000000L};
            while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
            pthread_mutex_lock(&g.mu);
            double now = now_ms();
            double step = now - last;
            last = now;
            if (step > LEASE_MAX_STEP_MS)
                step = LEASE_MAX_STEP_MS; /* frozen, stopped or waiting for a command */
            if (step < 0)
                step = 0;
            if (!g.lease_armed || g.lock_pending || !g.lock)
                continue;
            g.lease_left_ms -= step;
            if (g.lease_left_ms <= 0)
                lease_expire();
        }
    }
    return NULL;
}

static void start_lease_ticker(void)
{
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 256 * 1024);
    if (pthread_create(&t, &a, lease_ticker, NULL))
        log_line("could not start the lease ticker; leases will not expire");
    pthread_attr_destroy(&a);
}

/* ---------------------------------------------------------------- replies */

/* One reply, whoever writes it: a command's outcome or the refusal of a peer. */
struct reply {
    int ok;
    int code;
    const char *state;   /* NULL: null */
    const char *error;   /* NULL: null */
    double elapsed_ms;
    const char *runtime; /* NULL: null */
    long lease_ms_left;  /* < 0: null (no lease armed) */
    int lease_lost;      /* the field appears only when set */
    const int *lease_lost_at; /* NULL: the field does not appear (no lease armed) */
    const char *device;  /* a JSON object; NULL or empty: null */
};

/* `"key": ` with the separator the previous field needs. */
static void json_key(struct buf *b, const char *key)
{
    if (b->len > 0 && b->p[b->len - 1] != '{')
        buf_add(b, ", ", 2);
    buf_json_str(b, key);
    buf_add(b, ": ", 2);
}

/* The reply as one JSON line (native/include/npusnap/agent.h names the fields). */
static void write_reply(struct buf *out, const struct reply *r)
{
    buf_add(out, "{", 1);
    json_key(out, NPUSNAP_AGENT_REPLY_OK);
    buf_add(out, r->ok ? "true" : "false", r->ok ? 4 : 5);
    json_key(out, NPUSNAP_AGENT_REPLY_CODE);
    buf_printf(out, "%d", r->code);
    json_key(out, NPUSNAP_AGENT_REPLY_STATE);
    buf_json_str(out, r->state);
    json_key(out, NPUSNAP_AGENT_REPLY_ERROR);
    buf_json_str(out, r->error);
    json_key(out, NPUSNAP_AGENT_REPLY_ELAPSED_MS);
    buf_printf(out, "%.3f", r->elapsed_ms);
    json_key(out, NPUSNAP_AGENT_REPLY_PID);
    buf_printf(out, "%d", (int)getpid());
    json_key(out, NPUSNAP_AGENT_REPLY_RUNTIME);
    buf_json_str(out, r->runtime);
    json_key(out, NPUSNAP_AGENT_REPLY_LEASE_MS_LEFT);
    if (r->lease_ms_left >= 0)
        buf_printf(out, "%ld", r->lease_ms_left);
    else
        buf_add(out, "null", 4);
    if (r->lease_lost) {
        json_key(out, NPUSNAP_AGENT_REPLY_LEASE_LOST);
        buf_add(out, "true", 4);
    }
    if (r->lease_lost_at) {
        json_key(out, NPUSNAP_AGENT_REPLY_LEASE_LOST_AT);
        buf_printf(out, "%lu", (unsigned long)(uintptr_t)r->lease_lost_at);
    }
    json_key(out, NPUSNAP_AGENT_REPLY_DEVICE);
    if (r->device && r->device[0])
        buf_add(out, r->device, strlen(r->device));
    else
        buf_add(out, "null", 4);
    buf_add(out, "}\n", 2);
}

/* ---------------------------------------------------------------- requests */

struct request {
    char cmd[16];
    long arg, arg2;
    int nargs;    /* numeric arguments given: 0, 1 or 2 */
    int external; /* `backup external` / `restore external`: npusim's direct path */
    char key[32], value[NPUSNAP_AGENT_HCCL_VALUE_MAX]; /* `hccl KEY VALUE` */
};

static int parse_number(const char *s, long *out)
{
    char *end;
    errno = 0;
    *out = strtol(s, &end, 10);
    return errno || *end || *out < 0 ? -1 : 0;
}

static int parse_request(const char *line, struct request *rq)
{
    memset(rq, 0, sizeof *rq);
    /* The direct path's modifier (the device data is moved by the daemon itself, not through
     * this process); then the request is parsed as the plain backup/restore. */
    if (!strcmp(line, NPUSNAP_AGENT_CMD_BACKUP " " NPUSNAP_AGENT_ARG_EXTERNAL) ||
        !strcmp(line, NPUSNAP_AGENT_CMD_RESTORE " " NPUSNAP_AGENT_ARG_EXTERNAL)) {
        rq->external = 1;
        snprintf(rq->cmd, sizeof rq->cmd, "%.*s", (int)strcspn(line, " "), line);
        return 0;
    }
    /* `hccl KEY VALUE`: a setting for the runtime's next lock or restore (VALUE: a path). */
    if (!strncmp(line, NPUSNAP_AGENT_CMD_HCCL " ", sizeof NPUSNAP_AGENT_CMD_HCCL)) {
        char fmt[32], more[2];
        snprintf(fmt, sizeof fmt, "%%*s %%31s %%%ds %%1s", NPUSNAP_AGENT_HCCL_VALUE_MAX - 1);
        if (sscanf(line, fmt, rq->key, rq->value, more) != 2)
            return -1;
        snprintf(rq->cmd, sizeof rq->cmd, "%s", NPUSNAP_AGENT_CMD_HCCL);
        return 0;
    }
    char extra[2];
    char argbuf[32] = "", arg2buf[32] = "";
    int n = sscanf(line, "%15s %31s %31s %1s", rq->cmd, argbuf, arg2buf, extra);
    if (n < 1 || n > 3)
        return -1;
    if (n >= 2 && parse_number(argbuf, &rq->arg) < 0)
        return -1;
    if (n == 3 && parse_number(arg2buf, &rq->arg2) < 0)
        return -1;
    rq->nargs = n - 1;
    return 0;
}

/* ---------------------------------------------------------------- commands */

/* What a command did: 0 and no error, or a code and a message. */
struct outcome {
    int code;
    const char *err;
    char info[DEVICE_INFO_MAX]; /* the device's view (npusimSnapshotInfo), "" when unknown */
};

static void refuse(struct outcome *o, int code, const char *err)
{
    o->code = code;
    o->err = err;
}

static void cmd_ping(const struct request *rq, struct outcome *o)
{
    (void)rq;
    (void)o;
}

static void cmd_status(const struct request *rq, struct outcome *o)
{
    (void)rq;
    (void)o;
    resolve_runtime(); /* status reports the runtime when there is one */
}

static void cmd_renew(const struct request *rq, struct outcome *o)
{
    if (rq->nargs < 1 || rq->arg <= 0)
        refuse(o, NPUSNAP_AGENT_E_REQUEST, "renew takes one argument: lease_ms > 0");
    else if (g.lease_lost)
        refuse(o, NPUSNAP_AGENT_E_LEASE_LOST,
               "renew refused: the lease ran out; the agent took the process back");
    else if (!g.lease_armed)
        refuse(o, NPUSNAP_AGENT_E_STATE,
               "renew refused: no lease is armed (lock with a lease first)");
    else
        g.lease_left_ms = (double)(rq->arg > MAX_LOCK_MS ? MAX_LOCK_MS : rq->arg);
}

static void cmd_lock(const struct request *rq, struct outcome *o)
{
    long ms = rq->nargs >= 1 ? rq->arg : DEFAULT_LOCK_MS;
    long lease = rq->nargs >= 2 ? rq->arg2 : 0;
    if (ms > MAX_LOCK_MS)
        ms = MAX_LOCK_MS;
    if (lease > MAX_LOCK_MS)
        lease = MAX_LOCK_MS;
    if (g.state != ST_RUNNING) {
        refuse(o, NPUSNAP_AGENT_E_STATE, "lock refused: the process is already locked");
        return;
    }
    o->code = do_lock(ms, &o->err);
    if (o->code == 0)
        g.lease_lost = 0;
    if (o->code == 0 && lease > 0)
        lease_arm(lease);
    else
        lease_disarm();
}

static void cmd_backup(const struct request *rq, struct outcome *o)
{
    if (g.state != ST_LOCKED) {
        refuse(o, NPUSNAP_AGENT_E_STATE, g.state == ST_RUNNING
                                             ? "backup refused: lock the process first"
                                             : "backup refused: already backed up (restore first)");
        return;
    }
    if (rq->external && !g.set_data_path) {
        refuse(o, NPUSNAP_AGENT_E_UNSUPPORTED,
               "backup external refused: this device runtime has no direct data path "
               "(npusimSnapshotSetDataPath); it only offers the in-process backup");
        return;
    }
    if (g.set_data_path)
        g.set_data_path(rq->external); /* one backup; plain `backup` resets it */
    if ((o->code = g.backup(getpid(), NULL)) == 0) {
        g.state = ST_BACKED_UP;
        return;
    }
    if (g.set_data_path)
        g.set_data_path(0);
    o->err = "the runtime's backup failed";
}

static void cmd_restore(const struct request *rq, struct outcome *o)
{
    if (g.state != ST_BACKED_UP)
        refuse(o, NPUSNAP_AGENT_E_STATE, "restore refused: nothing is backed up (backup first)");
    else if (rq->external && !g.set_data_path)
        refuse(o, NPUSNAP_AGENT_E_UNSUPPORTED,
               "restore external refused: this device runtime has no direct data path "
               "(npusimSnapshotSetDataPath); it only offers the in-process restore");
    else if (rq->external != backup_is_external())
        refuse(o, NPUSNAP_AGENT_E_STATE,
               rq->external ? "restore external refused: the device was backed up in-process "
                              "(use restore)"
                            : "restore refused: the device was backed up externally (its data "
                              "is in files): use restore external, then import the data");
    else if ((o->code = g.restore(getpid(), NULL)) == 0)
        g.state = ST_LOCKED;
    else
        o->err = "the runtime's restore failed";
}

static void cmd_hccl(const struct request *rq, struct outcome *o)
{
    if (!g.hccl_option)
        refuse(o, NPUSNAP_AGENT_E_UNSUPPORTED,
               "hccl refused: this device runtime has no HCCL snapshot settings "
               "(npusimHcclSnapshotOption)");
    else if ((o->code = g.hccl_option(rq->key, rq->value)) != 0)
        o->err = "the runtime refused the HCCL setting";
}

/* From LOCKED or BACKED_UP, as in CANN. */
static void cmd_unlock(const struct request *rq, struct outcome *o)
{
    (void)rq;
    if (g.state == ST_RUNNING) {
        refuse(o, NPUSNAP_AGENT_E_STATE, "unlock refused: the process is not locked");
    } else if ((o->code = g.unlock(getpid(), NULL)) == 0) {
        g.state = ST_RUNNING;
        lease_disarm();
    } else {
        o->err = "the runtime's unlock failed";
    }
}

static const struct command {
    const char *name;
    int max_args; /* numeric arguments it takes */
    int device;   /* calls the runtime: it must be resolved, free, and its state read first */
    void (*run)(const struct request *, struct outcome *);
} commands[] = {
    {NPUSNAP_AGENT_CMD_PING, 0, 0, cmd_ping},
    {NPUSNAP_AGENT_CMD_STATUS, 0, 0, cmd_status},
    {NPUSNAP_AGENT_CMD_RENEW, 1, 0, cmd_renew},
    {NPUSNAP_AGENT_CMD_LOCK, 2, 1, cmd_lock},
    {NPUSNAP_AGENT_CMD_BACKUP, 0, 1, cmd_backup},
    {NPUSNAP_AGENT_CMD_RESTORE, 0, 1, cmd_restore},
    {NPUSNAP_AGENT_CMD_UNLOCK, 0, 1, cmd_unlock},
    {NPUSNAP_AGENT_CMD_HCCL, 0, 1, cmd_hccl},
};

#define EXPECTED_REQUESTS                                                                          \
    "expected one of: ping, status, lock <timeout_ms> [<lease_ms>], renew <lease_ms>, backup, "    \
    "restore, unlock, hccl <key> <value>"

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

/* Under g.mu: the request's shape and the runtime's readiness; 0 when the command may run. */
static int admit(const struct request *rq, const struct command *c, struct outcome *o)
{
    const char *why;
    if (rq->nargs > 1 && (!c || c->max_args < 2))
        refuse(o, NPUSNAP_AGENT_E_REQUEST, "too many arguments");
    else if (!c)
        refuse(o, NPUSNAP_AGENT_E_REQUEST, "unknown request; " EXPECTED_REQUESTS);
    else if (rq->nargs > c->max_args)
        refuse(o, NPUSNAP_AGENT_E_REQUEST, "this request takes no argument");
    else if (c->device && (why = resolve_runtime()) != NULL)
        refuse(o, NPUSNAP_AGENT_E_NO_RUNTIME, why);
    else if (c->device && g.lock_pending)
        refuse(o, NPUSNAP_AGENT_E_BUSY,
               "an earlier lock that timed out is still inside the runtime; retry shortly "
               "(the agent unlocks it when it returns)");
    else
        return 0;
    return -1;
}

/* Executes one request; writes the JSON reply into out. */
static void execute(const char *line, struct buf *out)
{
    double t0 = now_ms();
    struct request rq;
    struct outcome o = {0};

    pthread_mutex_lock(&g.mu);
    if (parse_request(line, &rq) < 0) {
        refuse(&o, NPUSNAP_AGENT_E_REQUEST, "malformed request; " EXPECTED_REQUESTS);
    } else {
        const struct command *c = find_command(rq.cmd);
        if (admit(&rq, c, &o) == 0) {
            if (c->device) { /* the runtime is authoritative about its state */
                device_info(o.info, sizeof o.info);
                sync_state(o.info);
            }
            c->run(&rq, &o);
        }
    }
    /* Fresh device view after the command (state may have moved). Skipped while
     * an abandoned lock is inside the runtime: the info call might wait for it. */
    if (g.lock && !g.lock_pending)
        device_info(o.info, sizeof o.info);
    if (o.code == 0)
        sync_state(o.info);
    if (g.state == ST_RUNNING && g.lease_armed)
        lease_disarm(); /* nothing left to guard */

    long lease_left = g.lease_left_ms > 0 ? (long)(g.lease_left_ms + 0.5) : 0L;
    struct reply r = {
        .ok = o.code == 0 && !o.err,
        .code = o.code,
        .state = state_names[g.state],
        .elapsed_ms = now_ms() - t0,
        .runtime = g.runtime[0] ? g.runtime : NULL,
        .lease_ms_left = g.lease_armed ? lease_left : -1,
        .lease_lost = g.lease_lost,
        .lease_lost_at = g.lease_armed ? &g.lease_lost : NULL,
        .device = o.info,
    };
    r.error = r.ok ? NULL : o.err;
    write_reply(out, &r);
    pthread_mutex_unlock(&g.mu);

    log_line("%.40s -> ok=%d code=%d state=%s elapsed_ms=%.3f%s%s", line, r.ok, r.code, r.state,
             r.elapsed_ms, r.ok ? "" : " error=", r.ok ? "" : r.error);
}

static void write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

static void serve(int c)
{
    struct timeval tv = {.tv_sec = IO_TIMEOUT_S};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);

    char reply_mem[DEVICE_INFO_MAX + 2 * PATH_MAX + 512];
    struct buf out = {reply_mem, 0, sizeof reply_mem};
    reply_mem[0] = '\0';

    struct ucred cr;
    socklen_t crlen = sizeof cr;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) < 0 ||
        (cr.uid != 0 && cr.uid != getuid() && cr.uid != geteuid())) {
        /* Take the request line off the socket first (briefly) so that the
         * client's write does not race our close, then refuse. */
        struct timeval brief = {.tv_usec = 200 * 1000};
        char sink[128];
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof brief);
        ssize_t r = recv(c, sink, sizeof sink, 0);
        (void)r;
        char msg[128];
        snprintf(msg, sizeof msg, "permission denied: only uid %u or root may control process %d",
                 (unsigned)getuid(), (int)getpid());
        struct reply denied = {.code = NPUSNAP_AGENT_E_DENIED, .error = msg, .lease_ms_left = -1};
        write_reply(&out, &denied);
        write_all(c, out.p, out.len);
        log_line("refused a peer with uid %d", crlen == sizeof cr ? (int)cr.uid : -1);
        return;
    }

    char line[64 + NPUSNAP_AGENT_HCCL_VALUE_MAX];
    size_t n = 0;
    while (n < sizeof line - 1) {
        ssize_t r = recv(c, line + n, sizeof line - 1 - n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
        if (memchr(line, '\n', n))
            break;
    }
    line[n] = '\0';
    char *nl = strpbrk(line, "\r\n");
    if (nl)
        *nl = '\0';
    else if (n == 0)
        return; /* peer went away (or a bare connect to probe us) */
    execute(line, &out);
    write_all(c, out.p, out.len);
}

/* ---------------------------------------------------------------- thread */

/* True when the socket bound at sa is this very process's (another copy of the
 * agent, loaded under another path): then we must not start a second one. */
static int held_by_us(const struct sockaddr_un *sa, socklen_t salen)
{
    /* Non-blocking: a squatter that never accepts (full backlog) must not hang us here. */
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0)
        return 0;
    struct ucred cr = {0};
    socklen_t crlen = sizeof cr;
    int ours = connect(c, (const struct sockaddr *)sa, salen) == 0 &&
               getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) == 0 && cr.pid == getpid();
    close(c);
    return ours;
}

/* Binds and listens on the agent's name (npusnap/sockets.h); the socket, or -1 when the agent
 * must not start (logged). The plain name first. Anyone may bind any abstract name, so when
 * another process squats ours take a random suffix instead: the CLI finds us through this
 * process's own descriptors (/proc/PID/fd + /proc/PID/net/unix) and checks SO_PEERCRED, never by
 * name alone. */
static int listen_on_agent_name(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        log_line("socket: %s; agent not started", strerror(errno));
        return -1;
    }
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    socklen_t salen = 0;
    int bound = 0, e = 0;
    for (int attempt = 0; attempt < 8 && !bound; attempt++) {
        char suffix[24] = "";
        if (attempt > 0) {
            uint64_t r = 0;
            if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
                r = ((uint64_t)now_ms() << 20) ^ (uint64_t)getpid() ^ ((uint64_t)attempt << 56);
            snprintf(suffix, sizeof suffix, "-%0*llx", NPUSNAP_AGENT_SOCKET_SUFFIX_HEX,
                     (unsigned long long)r);
        }
        int len = snprintf(sa.sun_path + 1, sizeof sa.sun_path - 1,
                           NPUSNAP_AGENT_SOCKET_PREFIX "%d%s", (int)getpid(), suffix);
        salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
        if (bind(fd, (struct sockaddr *)&sa, salen) == 0) {
            bound = 1;
            break;
        }
        e = errno;
        if (e != EADDRINUSE)
            break;
        if (attempt == 0 && held_by_us(&sa, salen)) {
            log_line("@%s: another copy of the agent already serves this process; agent not started",
                     sa.sun_path + 1);
            close(fd);
            return -1;
        }
        log_line("@%s is taken by another process%s", sa.sun_path + 1,
                 attempt == 0 ? "; binding a random name instead" : "; trying another");
    }
    if (!bound || listen(fd, 8) < 0) {
        log_line("bind/listen @%s: %s; agent not started", sa.sun_path + 1, strerror(bound ? errno : e));
        close(fd);
        return -1;
    }
    log_line("listening on @%s", sa.sun_path + 1);
    return fd;
}

static void *control_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "npusnap-agent");
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g.cv, &ca);
    pthread_cond_init(&g.lease_cv, &ca);
    pthread_condattr_destroy(&ca);
    start_lease_ticker(); /* inherits our all-blocked signal mask */

    int fd = listen_on_agent_name();
    if (fd < 0)
        return NULL;
    g.listen_fd = fd;
    for (;;) {
        int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            /* EMFILE and friends: back off instead of spinning. */
            struct timespec ts = {0, 100 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        serve(c);
        close(c);
    }
    return NULL;
}

static void start_control_thread(void)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited by the control thread */
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&a, 512 * 1024);
    pthread_create(&t, &a, control_main, NULL);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* A forked child inherits our memory but not the control thread: drop the
 * parent's listening socket (clients of the parent must never reach a process
 * that cannot answer), reset what the parent's threads may have held, and
 * serve the child under its own pid, as an exec'd child with LD_PRELOAD is. */
static void atfork_child(void)
{
    if (g.listen_fd >= 0) {
        close(g.listen_fd);
        g.listen_fd = -1;
    }
    pthread_mutex_init(&g.mu, NULL);
    g.state = ST_RUNNING;
    g.lock_pending = g.lock_done = g.lock_abandoned = 0;
    lease_disarm(); /* the child was never locked by anyone */
    g.lease_lost = 0;
    start_control_thread();
}

__attribute__((constructor)) static void npusnap_agent_init(void)
{
    static atomic_int started;
    if (atomic_exchange(&started, 1))
        return;
    const char *lp = getenv("NPUSNAP_AGENT_LOG");
    if (lp && lp[0])
        snprintf(g.log_path, sizeof g.log_path, "%s", lp);
    pthread_atfork(NULL, NULL, atfork_child);
    start_control_thread();
}

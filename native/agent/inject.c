/*
 * npusnap-inject PID /abs/path/lib.so: make a running process dlopen a library.
 *
 *   1. find dlopen/dlerror in the target: the offset of the symbol in our own
 *      libc, added to the base of the same file (same device and inode) in the
 *      target's /proc/PID/maps (glibc >= 2.34 has dlopen in libc.so.6; older
 *      glibc is served through libdl.so.2 or __libc_dlopen_mode);
 *   2. PTRACE_SEIZE + PTRACE_INTERRUPT the main thread only; the other threads
 *      keep running. Stopping all of them would risk a deadlock: dlopen takes
 *      the loader lock and malloc's locks, which a stopped thread might hold.
 *      dlopen is thread-safe, so one hijacked thread is enough;
 *   3. save its general and extended (XSAVE) registers, write the path below
 *      the red zone of its stack, push a zero return address and resume it at
 *      dlopen(path, RTLD_NOW); the return to address 0 faults, and that
 *      SIGSEGV stop (rip == 0) hands control back to us with the handle in rax
 *      (on failure dlerror() is called the same way for the message);
 *   4. put every register back exactly as it was, orig_rax included, and
 *      detach without delivering the SIGSEGV. A thread interrupted inside a
 *      blocking syscall (nanosleep, read, ...) was stopped with rax holding
 *      -ERESTART*; while we run code in it orig_rax is -1 so the kernel does
 *      not "restart" into dlopen, and once the original registers are back the
 *      kernel's own restart logic runs on the way out of the final stop: the
 *      syscall restarts as if nothing had happened (or is handled as usual if
 *      a signal is delivered).
 *
 * Every step after attaching runs with cleanup armed: on any failure the
 * target's registers are restored (if they were changed) and it is detached,
 * so it is never left stopped. Termination signals are blocked while we hold
 * the target. All waits are bounded.
 *
 * main() runs these as stages: resolve (1), attach (2), call (3), detach (4).
 *
 * Exit status (native/include/npusnap/inject.h): 0 loaded; 2 usage; 3 no such
 * process; 4 permission denied; 5 the target ran dlopen and it failed (message
 * from dlerror); 6 other failure, target left running as it was; 7 the target
 * may be damaged.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "npusnap-inject supports x86_64 only"
#endif

#include "npusnap/inject.h" /* the exit statuses, shared with the CLI */

#define RED_ZONE 128
#define XSAVE_MAX (64 * 1024)

static pid_t pid;
static int attached;   /* PTRACE_SEIZE succeeded */
static int stopped;    /* the thread sits in a ptrace-stop we know of */
static int sigstop_kind; /* the current stop is a signal-delivery-stop */
static int regs_dirty; /* registers differ from saved ones */
static int pending_sig; /* a signal we intercepted and must hand back */
static struct user_regs_struct saved;
static unsigned char xsave[XSAVE_MAX];
static size_t xsave_len;
static struct user_fpregs_struct fpsaved;
static int fp_kind; /* 1 XSTATE, 2 FPREGS */
static int verbose;

/* ------------------------------------------------------------------ util */

static long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static int restore_and_detach(void);

__attribute__((noreturn, format(printf, 2, 3))) static void die(int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (attached && restore_and_detach() < 0) {
        fprintf(stderr,
                "npusnap-inject: %s; moreover the target could not be restored cleanly "
                "(hint: check process %d, it may need a restart)\n",
                msg, (int)pid);
        exit(NPUSNAP_INJECT_DAMAGED);
    }
    fprintf(stderr, "npusnap-inject: %s\n", msg);
    exit(code);
}

static void debug(const char *fmt, ...)
{
    if (!verbose)
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "npusnap-inject: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Process state letter from /proc/PID/stat, 0 if the process is gone. */
static char proc_state(pid_t p)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')'); /* comm may contain spaces and parentheses */
    return rp && rp[1] == ' ' ? rp[2] : 0;
}

static int tracer_pid(pid_t p)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)p);
    FILE *f = fopen(path, "re");
    int t = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "TracerPid: %d", &t) == 1)
            break;
    fclose(f);
    return t;
}

/* ------------------------------------------------------------ symbol maps */

struct mapping {
    uintptr_t start, end, offset;
    unsigned dev_major, dev_minor;
    unsigned long inode;
    char path[512];
};

/* Calls fn for each line of /proc/<who>/maps until it returns nonzero. */
static int each_mapping(const char *who, int (*fn)(const struct mapping *, void *), void *data)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%s/maps", who);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int r = 0;
    while (!r && fgets(line, sizeof line, f)) {
        struct mapping m = {0};
        char perms[8];
        int pos = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s %" SCNxPTR " %x:%x %lu %n", &m.start,
                   &m.end, perms, &m.offset, &m.dev_major, &m.dev_minor, &m.inode, &pos) < 7)
            continue;
        snprintf(m.path, sizeof m.path, "%s", line + pos);
        m.path[strcspn(m.path, "\n")] = '\0';
        r = fn(&m, data);
    }
    fclose(f);
    return r;
}

struct find_addr {
    uintptr_t addr;
    struct mapping hit;
};

static int match_addr(const struct mapping *m, void *data)
{
    struct find_addr *fa = data;
    if (fa->addr >= m->start && fa->addr < m->end) {
        fa->hit = *m;
        return 1;
    }
    return 0;
}

struct find_file {
    const struct mapping *want; /* match by device + inode */
    uintptr_t base;
    int found;
    char other_libc[448]; /* a libc of another file, for the error message */
};

static int match_file(const struct mapping *m, void *data)
{
    struct find_file *ff = data;
    if (m->inode == ff->want->inode && m->dev_major == ff->want->dev_major &&
        m->dev_minor == ff->want->dev_minor && m->inode != 0) {
        if (!ff->found || m->start - m->offset < ff->base)
            ff->base = m->start - m->offset;
        ff->found = 1;
    } else if (!ff->other_libc[0] && strstr(m->path, "/libc.so.6")) {
        snprintf(ff->other_libc, sizeof ff->other_libc, "%.400s (inode %lu)", m->path, m->inode);
    }
    return 0;
}

/* Where our function `local` lives in the target: same file, same offset. */
static int remote_address(void *local, uintptr_t *remote, struct mapping *lib, char *why,
                          size_t whylen)
{
    struct find_addr fa = {.addr = (uintptr_t)local};
    if (each_mapping("self", match_addr, &fa) <= 0 || fa.hit.inode == 0) {
        snprintf(why, whylen, "cannot find the object holding our own dlopen");
        return -1;
    }
    uintptr_t local_base = fa.hit.start - fa.hit.offset;
    /* the object's first mapping (offset 0) gives its load base */
    struct find_file self = {.want = &fa.hit};
    each_mapping("self", match_file, &self);
    if (self.found)
        local_base = self.base;
    *lib = fa.hit;

    char who[32];
    snprintf(who, sizeof who, "%d", (int)pid);
    struct find_file ff = {.want = &fa.hit};
    if (each_mapping(who, match_file, &ff) < 0) {
        snprintf(why, whylen, "cannot read /proc/%d/maps", (int)pid);
        return -1;
    }
    if (!ff.found) {
        if (ff.other_libc[0])
            snprintf(why, whylen,
                     "the target uses another libc than ours (%.400s, ours is %.400s inode %lu): a "
                     "container or another glibc (hint: run the injector inside the target's "
                     "root/mount namespace)",
                     ff.other_libc, fa.hit.path, fa.hit.inode);
        else
            snprintf(why, whylen,
                     "the target has no %s mapped (statically linked or not glibc?)",
                     fa.hit.path);
        return -1;
    }
    *remote = ff.base + ((uintptr_t)local - local_base);
    return 0;
}

/* ---------------------------------------------------------------- ptrace */

/* Waits for the next event of the thread for at most ms. Returns 1 stopped,
 * 0 timeout, -1 gone (exited or killed). */
static int wait_event(int *status, long ms)
{
    long deadline = mono_ms() + ms, nap = 1;
    for (;;) {
        pid_t r = waitpid(pid, status, __WALL | WNOHANG);
        if (r == pid) {
            if (WIFSTOPPED(*status))
                return 1;
            if (WIFEXITED(*status) || WIFSIGNALED(*status)) {
                attached = stopped = 0;
                return -1;
            }
            continue;
        }
        if (r < 0 && errno != EINTR) {
            if (errno == ECHILD) {
                attached = stopped = 0;
                return -1;
            }
            return 0;
        }
        if (mono_ms() >= deadline)
            return 0;
        sleep_ms(nap);
        if (nap < 10)
            nap++;
    }
}

static int is_event_stop(int status)
{
    return (status >> 16) == PTRACE_EVENT_STOP;
}

/* Brings a running tracee to a stop, for cleanup. Any stop will do. */
static int interrupt_and_wait(long ms)
{
    if (stopped)
        return 0;
    if (ptrace(PTRACE_INTERRUPT, pid, 0, 0) < 0)
        return -1;
    int st;
    if (wait_event(&st, ms) != 1)
        return -1;
    stopped = 1;
    sigstop_kind = !is_event_stop(st);
    if (sigstop_kind) {
        int s = WSTOPSIG(st);
        /* an unrelated signal caught on the way: hand it back at detach */
        if (s != SIGSEGV && s != SIGTRAP && !pending_sig)
            pending_sig = s;
    }
    return 0;
}

static int set_fp(void)
{
    if (fp_kind == 1) {
        struct iovec iov = {xsave, xsave_len};
        return (int)ptrace(PTRACE_SETREGSET, pid, (void *)NT_X86_XSTATE, &iov);
    }
    if (fp_kind == 2)
        return (int)ptrace(PTRACE_SETFPREGS, pid, 0, &fpsaved);
    return 0;
}

/* Puts the registers back and detaches. 0 on success, -1 if the target might
 * be left in a bad state. */
static int restore_and_detach(void)
{
    int ok = 0;
    if (!attached)
        return 0;
    if (!stopped && interrupt_and_wait(3000) < 0) {
        /* cannot stop it; exiting detaches it anyway (the kernel does that) */
        attached = 0;
        return regs_dirty ? -1 : 0;
    }
    if (regs_dirty) {
        if (ptrace(PTRACE_SETREGS, pid, 0, &saved) < 0 || set_fp() < 0)
            ok = -1;
        else
            regs_dirty = 0;
    }
    /* From a signal-delivery-stop the detach signal is delivered (0: the
     * SIGSEGV of our return to address 0 is swallowed); from other stops it
     * is ignored, so a held-back signal is re-sent after detaching. */
    int sig = sigstop_kind ? pending_sig : 0;
    if (ptrace(PTRACE_DETACH, pid, 0, (void *)(long)sig) < 0)
        ok = -1;
    else if (pending_sig && !sigstop_kind)
        syscall(SYS_tgkill, pid, pid, pending_sig);
    attached = stopped = 0;
    return ok;
}

static int poke(uintptr_t addr, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t off = 0; off < len; off += sizeof(long)) {
        long word = 0;
        size_t n = len - off < sizeof(long) ? len - off : sizeof(long);
        if (n < sizeof(long)) { /* keep the bytes after the end */
            errno = 0;
            word = ptrace(PTRACE_PEEKDATA, pid, (void *)(addr + off), 0);
            if (errno)
                return -1;
        }
        memcpy(&word, p + off, n);
        if (ptrace(PTRACE_POKEDATA, pid, (void *)(addr + off), (void *)word) < 0)
            return -1;
    }
    return 0;
}

static void peek_string(uintptr_t addr, char *out, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        errno = 0;
        long word = ptrace(PTRACE_PEEKDATA, pid, (void *)(addr + n), 0);
        if (errno)
            break;
        for (size_t i = 0; i < sizeof word && n + 1 < len; i++, n++) {
            out[n] = ((char *)&word)[i];
            if (!out[n]) {
                return;
            }
        }
    }
    out[n] = '\0';
}

/* Runs fn(a0, a1) in the stopped thread on a scratch stack below the red
 * zone; returns its rax. Dies (after restoring) on any problem. */
static uintptr_t remote_call(uintptr_t fn, uintptr_t sp_top, uintptr_t a0, uintptr_t a1,
                             long timeout_ms, const char *what)
{
    uintptr_t sp = (sp_top & ~(uintptr_t)15) - 8; /* rsp % 16 == 8 at function entry */
    const uintptr_t zero = 0;
    if (poke(sp, &zero, sizeof zero) < 0)
        die(NPUSNAP_INJECT_FAILED,
            "cannot write the return address on the target's stack at %#" PRIxPTR ": %s", sp,
            strerror(errno));
    struct user_regs_struct r = saved;
    r.rip = fn;
    r.rsp = sp;
    r.rdi = a0;
    r.rsi = a1;
    r.rax = 0;
    r.orig_rax = (unsigned long long)-1; /* no syscall restart into our call */
    r.eflags &= ~(0x400ULL | 0x100ULL); /* DF clear per the ABI, no single-step */
    regs_dirty = 1;
    if (ptrace(PTRACE_SETREGS, pid, 0, &r) < 0)
        die(NPUSNAP_INJECT_FAILED, "PTRACE_SETREGS: %s", strerror(errno));
    int deliver = 0;
    long deadline = mono_ms() + timeout_ms;
    for (;;) {
        if (ptrace(PTRACE_CONT, pid, 0, (void *)(long)deliver) < 0)
            die(NPUSNAP_INJECT_FAILED, "PTRACE_CONT: %s", strerror(errno));
        stopped = 0;
        deliver = 0;
        int st;
        long left = deadline - mono_ms();
        int w = wait_event(&st, left > 0 ? left : 0);
        if (w < 0)
            die(NPUSNAP_INJECT_DAMAGED, "the target exited while running %s", what);
        if (w == 0)
            die(NPUSNAP_INJECT_DAMAGED,
                "%s did not return within %ld ms (the interrupted thread may hold a lock "
                "dlopen needs); registers were put back, but the library may be half loaded",
                what, timeout_ms);
        stopped = 1;
        sigstop_kind = !is_event_stop(st);
        if (!sigstop_kind)
            continue; /* a stray interrupt or group-stop notification: keep going */
        int sig = WSTOPSIG(st);
        if (sig == SIGSEGV) {
            struct user_regs_struct now;
            if (ptrace(PTRACE_GETREGS, pid, 0, &now) < 0)
                die(NPUSNAP_INJECT_FAILED, "PTRACE_GETREGS: %s", strerror(errno));
            if (now.rip == 0)
                return (uintptr_t)now.rax;
            die(NPUSNAP_INJECT_FAILED,
                "the target crashed (SIGSEGV at %#llx) inside %s; registers were put back and the "
                "crash suppressed",
                now.rip, what);
        }
        if (sig == SIGBUS || sig == SIGILL || sig == SIGFPE)
            die(NPUSNAP_INJECT_FAILED, "the target got signal %d inside %s; registers were put back",
                sig, what);
        deliver = sig; /* an ordinary signal for the program: let its handler run */
    }
}

/* Saves the stopped thread's general and floating-point registers (restore_and_detach puts
 * them back). */
static void save_registers(void)
{
    if (ptrace(PTRACE_GETREGS, pid, 0, &saved) < 0)
        die(NPUSNAP_INJECT_FAILED, "PTRACE_GETREGS: %s", strerror(errno));
    if (saved.cs != 0x33)
        die(NPUSNAP_INJECT_FAILED, "process %d runs 32-bit code; only x86_64 targets are supported",
            (int)pid);
    struct iovec iov = {xsave, sizeof xsave};
    if (ptrace(PTRACE_GETREGSET, pid, (void *)NT_X86_XSTATE, &iov) == 0) {
        xsave_len = iov.iov_len;
        fp_kind = 1;
    } else if (ptrace(PTRACE_GETFPREGS, pid, 0, &fpsaved) == 0) {
        fp_kind = 2;
    } else {
        die(NPUSNAP_INJECT_FAILED, "cannot read the floating-point registers: %s", strerror(errno));
    }
    debug("stopped at rip %#llx rsp %#llx orig_rax %lld rax %lld", saved.rip, saved.rsp,
          (long long)saved.orig_rax, (long long)saved.rax);
}

/* ------------------------------------------------------------------ main */

__attribute__((noreturn)) static void die_permission(int e)
{
    int scope = -1;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = -1;
        fclose(f);
    }
    char yama[128] = "";
    if (scope >= 1)
        snprintf(yama, sizeof yama, "; Yama ptrace_scope is %d, 0 allows same-user attach",
                 scope);
    die(NPUSNAP_INJECT_PERMISSION,
        "ptrace not permitted on process %d: %s (hint: run as root or with CAP_SYS_PTRACE, "
        "or as the process's owner%s)",
        (int)pid, strerror(e), yama);
}

static void usage(void)
{
    fprintf(stderr, "usage: npusnap-inject [-v] [--timeout SECONDS] PID /absolute/path/lib.so\n");
    exit(NPUSNAP_INJECT_USAGE);
}

/* What main() works out before touching the target, and what the call needs. */
struct plan {
    const char *lib;
    size_t liblen;
    long timeout_ms;
    uintptr_t r_dlopen, r_dlerror; /* in the target; r_dlerror 0: no message on failure */
    int libc_mode;                 /* glibc < 2.34: __libc_dlopen_mode lives in libc.so.6 */
};

/* Sets pid, the library and the timeout from the command line; exits on bad usage. */
static void parse_args(int argc, char **argv, struct plan *p)
{
    p->timeout_ms = 20000;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "-v"))
            verbose = 1;
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            p->timeout_ms = (long)(atof(argv[++i]) * 1000);
        else
            usage();
    }
    if (argc - i != 2 || p->timeout_ms <= 0)
        usage();
    char *end;
    long lp = strtol(argv[i], &end, 10);
    if (*end || lp <= 0 || lp > INT32_MAX)
        usage();
    pid = (pid_t)lp;
    p->lib = argv[i + 1];
    struct stat sb;
    if (p->lib[0] != '/')
        die(NPUSNAP_INJECT_USAGE, "library path must be absolute: %s", p->lib);
    if (stat(p->lib, &sb) < 0)
        die(NPUSNAP_INJECT_USAGE, "library not found: %s: %s", p->lib, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        die(NPUSNAP_INJECT_USAGE, "library is not a regular file: %s", p->lib);
    p->liblen = strlen(p->lib);
    if (p->liblen > 4000)
        die(NPUSNAP_INJECT_USAGE, "library path too long");
}

/* The target exists, runs, is traced by nobody, and we may read its maps. */
static void check_target(void)
{
    char st = proc_state(pid);
    if (!st)
        die(NPUSNAP_INJECT_NO_PROCESS, "no such process %d (hint: check the pid with `ps -p %d`)",
            (int)pid, (int)pid);
    if (st == 'Z' || st == 'X')
        die(NPUSNAP_INJECT_NO_PROCESS, "process %d has exited (zombie)", (int)pid);
    if (st == 'T')
        die(NPUSNAP_INJECT_FAILED,
            "process %d is stopped (hint: resume it with `kill -CONT %d` first)", (int)pid, (int)pid);
    int tp = tracer_pid(pid);
    if (tp || st == 't')
        die(NPUSNAP_INJECT_FAILED, "process %d is already traced by process %d (hint: detach the "
                                   "debugger or strace first)",
            (int)pid, tp);

    /* Reading the maps needs the same rights as ptrace: a clear message first. */
    char maps_path[64];
    snprintf(maps_path, sizeof maps_path, "/proc/%d/maps", (int)pid);
    FILE *mf = fopen(maps_path, "re");
    if (!mf && (errno == EACCES || errno == EPERM))
        die_permission(errno);
    if (!mf)
        die(NPUSNAP_INJECT_NO_PROCESS, "no such process %d", (int)pid);
    fclose(mf);
}

/* Stage 1, resolve: dlopen (and dlerror) in the target, before touching it. */
static void resolve(struct plan *p)
{
    void *my_dlopen = dlsym(RTLD_DEFAULT, "dlopen");
    void *my_dlerror = dlsym(RTLD_DEFAULT, "dlerror");
    struct mapping obj;
    char why[1024];
    if (!my_dlopen || remote_address(my_dlopen, &p->r_dlopen, &obj, why, sizeof why) < 0) {
        void *alt = dlsym(RTLD_DEFAULT, "__libc_dlopen_mode");
        char why2[1024];
        if (!alt || remote_address(alt, &p->r_dlopen, &obj, why2, sizeof why2) < 0)
            die(NPUSNAP_INJECT_FAILED, "cannot locate dlopen in process %d: %s", (int)pid, why);
        p->libc_mode = 1;
    } else if (my_dlerror) {
        struct mapping o2;
        if (remote_address(my_dlerror, &p->r_dlerror, &o2, why, sizeof why) < 0)
            p->r_dlerror = 0;
    }
    debug("dlopen in %d at %#" PRIxPTR " (%s)", (int)pid, p->r_dlopen, obj.path);
}

/* Stage 2, attach: seize the main thread, stop it, save its registers. */
static void attach(void)
{
    if (ptrace(PTRACE_SEIZE, pid, 0, 0) < 0) {
        int e = errno;
        if (e == ESRCH)
            die(NPUSNAP_INJECT_NO_PROCESS, "no such process %d", (int)pid);
        if (e == EPERM || e == EACCES)
            die_permission(e);
        die(NPUSNAP_INJECT_FAILED, "PTRACE_SEIZE %d: %s", (int)pid, strerror(e));
    }
    attached = 1;

    if (ptrace(PTRACE_INTERRUPT, pid, 0, 0) < 0)
        die(NPUSNAP_INJECT_FAILED, "PTRACE_INTERRUPT: %s", strerror(errno));
    int status;
    int w = wait_event(&status, 5000);
    if (w < 0)
        die(NPUSNAP_INJECT_NO_PROCESS, "process %d exited while we attached", (int)pid);
    if (w == 0)
        die(NPUSNAP_INJECT_FAILED, "process %d did not stop within 5 s (hint: a thread in "
                                   "uninterruptible sleep, state D?)",
            (int)pid);
    stopped = 1;
    sigstop_kind = !is_event_stop(status);
    if (!sigstop_kind && WSTOPSIG(status) != SIGTRAP)
        die(NPUSNAP_INJECT_FAILED,
            "process %d is job-control stopped (hint: `kill -CONT %d` first)", (int)pid, (int)pid);
    if (sigstop_kind)
        pending_sig = WSTOPSIG(status); /* delivered when we detach */
    save_registers();
}

/* Stage 3, call: dlopen(lib) in the stopped thread; the handle, or 0 with dlerror's message in
 * err when it could be read. */
static uintptr_t call_dlopen(const struct plan *p, char *err, size_t errlen)
{
    /* Scratch area: below the red zone, the path string, then the call frame. */
    uintptr_t area = (uintptr_t)saved.rsp - RED_ZONE - 256;
    uintptr_t path_at = (area - (p->liblen + 1)) & ~(uintptr_t)15;
    if (poke(path_at, p->lib, p->liblen + 1) < 0)
        die(NPUSNAP_INJECT_FAILED, "cannot write to the target's stack at %#" PRIxPTR ": %s",
            path_at, strerror(errno));
    uintptr_t frame_top = path_at - 64;

    int mode = RTLD_NOW;
    uintptr_t handle = remote_call(p->r_dlopen, frame_top, path_at,
                                   p->libc_mode ? (uintptr_t)(mode | 0x80000000u) : (uintptr_t)mode,
                                   p->timeout_ms, "dlopen");
    err[0] = '\0';
    if (!handle && p->r_dlerror && !p->libc_mode) {
        uintptr_t msg = remote_call(p->r_dlerror, frame_top, 0, 0, 5000, "dlerror");
        if (msg)
            peek_string(msg, err, errlen);
    }
    return handle;
}

/* Stage 4, detach: put the registers back, let the target go, report. The exit status. */
static int detach(const struct plan *p, uintptr_t handle, const char *err)
{
    if (restore_and_detach() < 0) {
        fprintf(stderr,
                "npusnap-inject: could not restore process %d's registers after dlopen "
                "(hint: check the process, it may need a restart)\n",
                (int)pid);
        return NPUSNAP_INJECT_DAMAGED;
    }
    if (!handle) {
        fprintf(stderr, "npusnap-inject: process %d could not load %s: %s\n", (int)pid, p->lib,
                err[0] ? err : "dlopen returned NULL");
        return NPUSNAP_INJECT_DLOPEN_FAILED;
    }
    debug("loaded %s into %d (handle %#" PRIxPTR ")", p->lib, (int)pid, handle);
    return NPUSNAP_INJECT_OK;
}

int main(int argc, char **argv)
{
    struct plan plan = {0};
    parse_args(argc, argv, &plan);

    /* Keep Ctrl-C & co from killing us while the target is in our hands. */
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGQUIT);
    sigaddset(&block, SIGPIPE);
    sigprocmask(SIG_BLOCK, &block, NULL);

    check_target();
    resolve(&plan);
    attach();
    char err[512];
    uintptr_t handle = call_dlopen(&plan, err, sizeof err);
    return detach(&plan, handle, err);
}

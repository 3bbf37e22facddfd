/* The `npusnap` command. CPython's own start-up (the ~15 ms before npusnap_cli installs
 * its SIGINT handler) cannot be told what a Ctrl-C means: the signal kills it (exit -2)
 * or breaks its initialisation ("Fatal Python error"). So SIGINT is blocked here; a
 * blocked signal stays blocked, and pending, across exec, and npusnap_cli/__init__.py
 * unblocks it right after installing its handler. A Ctrl-C at any instant then ends
 * as npusnap's own one line (exit 130) or as the command's real outcome. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* On x86_64 the block is the program's very first instruction: the ELF entry point
 * (linked static, so no dynamic loader runs before it) blocks SIGINT with a raw
 * rt_sigprocmask, keeps the previous mask, and goes on to libc's _start with the
 * registers as the kernel left them. A Ctrl-C can then end the process only inside the
 * kernel's own execve; elsewhere main() blocks it, after the loader. */
#if defined(__x86_64__) && defined(NPUSNAP_EARLY_ENTRY)
unsigned long npusnap_mask_before[1];
__asm__(".text\n"
        ".globl npusnap_entry\n"
        ".type npusnap_entry,@function\n"
        "npusnap_entry:\n"
        "  movl $14, %eax\n"                         /* SYS_rt_sigprocmask */
        "  xorl %edi, %edi\n"                        /* SIG_BLOCK */
        "  leaq npusnap_sigint_only(%rip), %rsi\n"
        "  leaq npusnap_mask_before(%rip), %rdx\n"
        "  movl $8, %r10d\n"                          /* sizeof(kernel sigset_t) */
        "  syscall\n"
        "  xorl %eax, %eax\n"
        "  xorl %edi, %edi\n"
        "  xorl %esi, %esi\n"
        "  xorl %edx, %edx\n"                        /* _start's rtld_fini: none, as the kernel set it */
        "  xorl %r10d, %r10d\n"
        "  jmp _start\n"
        ".section .rodata\n"
        ".align 8\n"
        "npusnap_sigint_only: .quad 2\n"             /* bit SIGINT-1 */
        ".text\n");
#define EARLY_ENTRY 1
#else
#define EARLY_ENTRY 0
#endif

#ifndef NPUSNAP_PYTHON
#error "NPUSNAP_PYTHON (the interpreter the package is installed for) must be defined"
#endif

/* sys.path[0] is the working directory ('') under -c: drop it, as a console script's
 * (its own bin/ directory) would never shadow the installed package. One short line,
 * since `ps` shows it. */
static const char BOOT[] = "import sys;'' in sys.path and sys.path.remove('');sys.argv[0]='npusnap';"
                           "from npusnap_cli.cli import main;sys.exit(main())";

/* The interpreter to run. In a virtualenv (pyvenv.cfg above this launcher's directory)
 * its own python3, the one pip installed the package for; elsewhere the one the package
 * was built for, named by absolute path as pip's console scripts name theirs; failing
 * both, a python3 beside this launcher. */
static const char *find_python(char *buf, size_t len) {
    char dir[PATH_MAX], cfg[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof dir - 1);
    char *slash = n > 0 ? (dir[n] = '\0', strrchr(dir, '/')) : NULL;
    int sibling = 0;
    if (slash != NULL) {
        *slash = '\0';
        sibling = snprintf(buf, len, "%s/python3", dir) < (int)len && access(buf, X_OK) == 0;
        if (sibling && snprintf(cfg, sizeof cfg, "%s/../pyvenv.cfg", dir) < (int)sizeof cfg &&
            access(cfg, F_OK) == 0)
            return buf;
    }
    if (access(NPUSNAP_PYTHON, X_OK) == 0 || !sibling)
        return NPUSNAP_PYTHON;
    return buf;
}

int main(int argc, char **argv) {
    sigset_t sigint, before;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    int was_blocked;
#if EARLY_ENTRY
    was_blocked = (npusnap_mask_before[0] & (1UL << (SIGINT - 1))) != 0;
    (void)sigint;
    (void)before;
#else
    was_blocked = sigprocmask(SIG_BLOCK, &sigint, &before) != 0 || sigismember(&before, SIGINT);
#endif
    if (!was_blocked)
        setenv("NPUSNAP_UNBLOCK_SIGINT", "1", 1); /* ours to undo; a caller's block stays */

    char path[PATH_MAX];
    const char *python = find_python(path, sizeof path);
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (args == NULL) {
        fputs("npusnap: error: out of memory\n", stderr);
        return 3;
    }
    args[0] = (char *)python;
    args[1] = "-c";
    args[2] = (char *)BOOT;
    for (int i = 1; i < argc; i++)
        args[i + 2] = argv[i];
    execv(python, args);
    fprintf(stderr, "npusnap: error: cannot run the Python interpreter %s: %s\n", python, strerror(errno));
    return 6;
}

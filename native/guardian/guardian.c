/* npusnap-guardian PYTHON ARGS...: the waiting half of core/guardian.py's guardian.
 *
 * Every checkpoint and restore starts a guardian and waits for its exit at the end; the
 * guardian only reads what the CLI tells it until the pipe closes and, when the last word is
 * "done" (the usual end), exits. An interpreter started for that costs ~12 ms of CPU on every
 * command, on a machine whose other core runs CRIU. This reads instead, keeping every byte in a
 * memfd; when the CLI died (the pipe closed without "done") it execs PYTHON ARGS (the Python
 * guardian) with those bytes as its stdin, which then does what they say, as it always did. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    int keep = memfd_create("npusnap-guardian", 0);
    if (keep < 0) { /* nothing read yet: the Python guardian reads the pipe itself */
        execv(argv[1], argv + 1);
        return 127;
    }
    char buf[4096], tail[64]; /* the last bytes read, for the "done" check */
    memset(tail, ' ', sizeof tail); /* as if the input began with spaces */
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (write_all(keep, buf, (size_t)n) != 0)
            break; /* out of memory: act on what is kept */
        for (ssize_t i = 0; i < n; i++) {
            memmove(tail, tail + 1, sizeof tail - 1);
            tail[sizeof tail - 1] = buf[i];
        }
    }
    size_t end = sizeof tail;
    while (end > 0 && is_space(tail[end - 1]))
        end--;
    /* "done" as the last word (more trailing space than the tail holds: the Python guardian decides) */
    if (end >= 5 && memcmp(tail + end - 4, "done", 4) == 0 && is_space(tail[end - 5]))
        _exit(0);
    if (lseek(keep, 0, SEEK_SET) != 0 || dup2(keep, 0) < 0)
        return 1;
    close(keep);
    execv(argv[1], argv + 1);
    return 127;
}

/* Targets for the injector tests (built by conftest.py).
 * MODE_SLEEPER: prints 0, 1, 2, ... every 50 ms, sleeping in nanosleep; an
 *               interrupted sleep (EINTR) is printed, which a correct
 *               injection never causes.
 * MODE_READER:  blocks in read(0) and echoes "got <line>"; a failed read is
 *               printed. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready %d\n", (int)getpid());
#ifdef MODE_SLEEPER
    for (long i = 0;; i++) {
        struct timespec ts = {0, 50 * 1000000L};
        if (nanosleep(&ts, NULL) != 0)
            printf("EINTR %s\n", strerror(errno));
        printf("%ld\n", i);
    }
#else
    char buf[256];
    for (;;) {
        ssize_t n = read(0, buf, sizeof buf - 1);
        if (n < 0) {
            printf("read error %s\n", strerror(errno));
            continue;
        }
        if (n == 0) {
            printf("eof\n");
            return 0;
        }
        buf[n] = '\0';
        printf("got %s", buf);
    }
#endif
}

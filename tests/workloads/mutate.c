/* A CPU workload for checkpoint tests: each step mutates a 64 MiB buffer and
 * prints a digest of all of it, so a restore that lost or garbled any page
 * shows up as a different line.  usage: mutate STEPS SLEEP_MS [EXIT_CODE] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WORDS ((64u << 20) / sizeof(uint64_t))

int main(int argc, char **argv) {
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    long sleep_ms = argc > 2 ? atol(argv[2]) : 100;
    int code = argc > 3 ? atoi(argv[3]) : 0;
    uint64_t *buf = calloc(WORDS, sizeof *buf);
    uint64_t x = 88172645463325252ull;
    if (!buf) return 99;
    for (size_t i = 0; i < WORDS; i++) buf[i] = i * 0x9E3779B97F4A7C15ull; /* every page real */
    for (int step = 0; step < steps; step++) {
        for (int i = 0; i < 4096; i++) { /* xorshift: scattered writes over every page */
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            buf[x % WORDS] ^= x;
        }
        uint64_t h = 1469598103934665603ull;
        for (size_t i = 0; i < WORDS; i++) h = (h ^ buf[i]) * 1099511628211ull;
        printf("step %d digest %016llx\n", step, (unsigned long long)h);
        fflush(stdout);
        struct timespec ts = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    printf("done\n");
    return code;
}

/* Single-threaded memcpy bandwidth, the baseline of benchmarks/run.sh's same-host rows:
 * copies SIZE-byte messages between two 64 MiB buffers (past the caches), one offset after
 * the other, for SECONDS, and prints MiB/s. Usage: memcpy SIZE SECONDS */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: memcpy SIZE SECONDS\n");
        return 2;
    }
    size_t size = strtoul(argv[1], NULL, 0), span = 64u << 20;
    double secs = atof(argv[2]);
    if (size == 0 || size > span || secs <= 0) {
        fprintf(stderr, "memcpy: bad SIZE or SECONDS\n");
        return 2;
    }
    char *src = malloc(span), *dst = malloc(span);
    if (!src || !dst)
        return 1;
    memset(src, 1, span);
    memset(dst, 2, span);
    size_t slots = span / size, i = 0;
    unsigned long long bytes = 0;
    double start = now(), end = start;
    while (end - start < secs) {
        for (int k = 0; k < 64; k++, i = (i + 1) % slots) {
            memcpy(dst + i * size, src + i * size, size);
            /* Keep the copy: the compiler may not drop it. */
            __asm__ volatile("" : : "r"(dst) : "memory");
            bytes += size;
        }
        end = now();
    }
    printf("%.1f\n", bytes / (end - start) / (1 << 20));
    return 0;
}

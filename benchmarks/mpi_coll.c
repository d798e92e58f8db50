/* Point-to-point and collectives at every size, every result checked:
 *
 *   - a send/recv stream from rank 0 to rank 1 (the others wait) at 8 B, 64 B, ... up to
 *     MAX MiB (×8 each step, and MAX itself): each message stamps every 4 KiB page with
 *     its number, the receiver checks every stamp and, on the last message of each size,
 *     every byte;
 *   - MPI_Allreduce (MPI_SUM of doubles) and MPI_Alltoall (a block for every rank) of
 *     CHUNK MiB per call, TOTAL MiB in all: every element of the result checked against
 *     what each rank contributed.
 *
 * Rank 0 prints "sendrecv N B: X MiB/s, B bad", "allreduce C MiB: X MiB/s, B bad",
 * "alltoall C MiB: X MiB/s, B bad" (MiB of the buffer per call, per second), and last
 * "PASSED: 0 failures over R ranks" or "FAILED: ..."; the exit status is 1 on any wrong
 * result. Built and run by benchmarks/mpi.sh and crates/srdma-verbs/tests/ucx.rs.
 *
 * Usage: mpi_coll [MAX_MiB (64)] [CHUNK_MiB (16)] [TOTAL_MiB (256)] */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAGE 4096

static int rank, size;

/* The byte at offset i of a buffer that `from` sends to `to`. */
static unsigned char pattern(int from, int to, size_t i) {
    return (unsigned char)(i * 13 + (size_t)from * 31 + (size_t)to * 7 + 1);
}

/* Writes message m's stamp at the start of every page of buf[0..n) (n >= 8). */
static void stamp(unsigned char *buf, size_t n, uint64_t m) {
    for (size_t o = 0; o + 8 <= n; o += PAGE) memcpy(buf + o, &m, 8);
}

/* How many stamps of message m are wrong in buf[0..n). */
static long stamps_bad(const unsigned char *buf, size_t n, uint64_t m) {
    long bad = 0;
    for (size_t o = 0; o + 8 <= n; o += PAGE) {
        uint64_t v;
        memcpy(&v, buf + o, 8);
        bad += v != m;
    }
    return bad;
}

/* How many bytes of buf[0..n) outside the stamps differ from what `from` sends `to`. */
static long pattern_bad(const unsigned char *buf, size_t n, int from, int to) {
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        size_t page = i - i % PAGE;
        if (i % PAGE < 8 && page + 8 <= n) continue; /* a stamp */
        bad += buf[i] != pattern(from, to, i);
    }
    return bad;
}

static long sendrecv(size_t n, int msgs) {
    unsigned char *buf = malloc(n);
    long bad = 0;
    if (rank < 2) {
        int from = 0, to = 1;
        for (size_t i = 0; i < n; i++) buf[i] = rank == from ? pattern(from, to, i) : 0;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int m = 0; m < msgs; m++) {
            if (rank == from) {
                if (n >= 8) stamp(buf, n, (uint64_t)m + 1);
                MPI_Send(buf, (int)n, MPI_BYTE, to, 7, MPI_COMM_WORLD);
            } else {
                MPI_Recv(buf, (int)n, MPI_BYTE, from, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (n >= 8) bad += stamps_bad(buf, n, (uint64_t)m + 1);
            }
        }
        /* The receiver's word that the last message arrived (and its stamps' verdict). */
        if (rank == to) MPI_Send(&bad, 1, MPI_LONG, from, 8, MPI_COMM_WORLD);
        else MPI_Recv(&bad, 1, MPI_LONG, to, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double t = MPI_Wtime() - t0;
        if (rank == to) bad += pattern_bad(buf, n, from, to);
        if (rank == from)
            printf("sendrecv %zu B: %.1f MiB/s, ", n, (double)n * msgs / t / (1 << 20));
    } else {
        MPI_Barrier(MPI_COMM_WORLD);
    }
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%ld bad\n", all);
    free(buf);
    return all;
}

/* A collective's result: `calls` calls of `chunk` bytes in `t` s; the bad elements of every
 * rank summed, printed by rank 0 and returned. */
static long report(const char *what, size_t chunk, int calls, double t, long bad) {
    long all = 0;
    MPI_Allreduce(&bad, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s %zu MiB: %.1f MiB/s, %ld bad\n", what, chunk >> 20,
               (double)chunk * calls / t / (1 << 20), all);
    return all;
}

static long allreduce(size_t chunk, int calls) {
    size_t count = chunk / sizeof(double);
    double *in = malloc(count * sizeof(double)), *out = malloc(count * sizeof(double));
    /* Small integers: every sum is exact whatever order the ranks' parts are added in. */
    for (size_t i = 0; i < count; i++) in[i] = (double)(rank + (int)(i % 1000));
    long bad = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int c = 0; c < calls; c++) {
        in[0] = (double)(rank + c); /* each call's own sum */
        MPI_Allreduce(in, out, (int)count, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double ranks = (double)size * (size - 1) / 2;
        bad += out[0] != ranks + (double)size * c;
        for (size_t i = 1; i < count; i++) bad += out[i] != ranks + (double)size * (double)(i % 1000);
    }
    long all = report("allreduce", chunk, calls, MPI_Wtime() - t0, bad);
    free(in); free(out);
    return all;
}

static long alltoall(size_t chunk, int calls) {
    size_t block = chunk / (size_t)size;
    unsigned char *in = malloc(block * size), *out = malloc(block * size);
    for (int to = 0; to < size; to++)
        for (size_t i = 0; i < block; i++) in[(size_t)to * block + i] = pattern(rank, to, i);
    long bad = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int c = 0; c < calls; c++) {
        memset(out, 0, block * size);
        for (int to = 0; to < size; to++) in[(size_t)to * block] = (unsigned char)(c + to);
        MPI_Alltoall(in, (int)block, MPI_BYTE, out, (int)block, MPI_BYTE, MPI_COMM_WORLD);
        for (int from = 0; from < size; from++) {
            const unsigned char *b = out + (size_t)from * block;
            bad += b[0] != (unsigned char)(c + rank);
            for (size_t i = 1; i < block; i++) bad += b[i] != pattern(from, rank, i);
        }
    }
    long all = report("alltoall", chunk, calls, MPI_Wtime() - t0, bad);
    free(in); free(out);
    return all;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t max = (size_t)(argc > 1 ? atol(argv[1]) : 64) << 20;
    size_t chunk = (size_t)(argc > 2 ? atol(argv[2]) : 16) << 20;
    size_t total = (size_t)(argc > 3 ? atol(argv[3]) : 256) << 20;
    if (size < 2 || max < 8 || chunk < (size_t)size * 8 || total < chunk) {
        if (rank == 0) fprintf(stderr, "usage: mpi_coll [MAX_MiB] [CHUNK_MiB] [TOTAL_MiB], 2 ranks or more\n");
        MPI_Finalize();
        return 2;
    }
    long bad = 0;
    for (size_t n = 8;; n *= 8) {
        if (n > max) n = max;
        /* About TOTAL bytes of each size, at least 4 and at most 20000 messages. */
        size_t msgs = total / n;
        msgs = msgs < 4 ? 4 : msgs > 20000 ? 20000 : msgs;
        bad += sendrecv(n, (int)msgs);
        if (n == max) break;
    }
    int calls = (int)(total / chunk);
    bad += allreduce(chunk, calls);
    bad += alltoall(chunk, calls);
    if (rank == 0) printf("%s: %ld failures over %d ranks\n", bad ? "FAILED" : "PASSED", bad, size);
    MPI_Finalize();
    return bad != 0;
}

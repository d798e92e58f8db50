/* MPI over UCX over srdma: point-to-point at eager and rendezvous sizes, collectives and
 * one-sided RMA (put, get, accumulate, fetch-and-op, compare-and-swap), every result
 * checked. Run by tests/ucx.rs: mpicc -o mpi_check mpi_check.c; srdma exec mpirun -np 2
 * --mca pml ucx --mca osc ucx ./mpi_check. Prints PASSED or FAILED (rank 0) and exits 1 on
 * any wrong result. An even number of ranks: each exchanges with rank ^ 1. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int fails = 0;
#define CHECK(c, ...) do { if (!(c)) { fails++; printf("rank %d FAIL: ", rank); printf(__VA_ARGS__); printf("\n"); } } while (0)
int main(int argc, char **argv) {
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int peer = rank ^ 1;
    size_t sizes[] = {8, 1024, 8192, 65536, 1 << 20, 4 << 20};
    for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *buf = malloc(n), *rb = malloc(n);
        for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 7 + rank + s);
        MPI_Sendrecv(buf, (int)n, MPI_BYTE, peer, 1, rb, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) if (rb[i] != (unsigned char)(i * 7 + peer + s)) bad++;
        CHECK(bad == 0, "sendrecv %zu bytes: %zu wrong", n, bad);
        free(buf); free(rb);
    }
    long v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    CHECK(sum == (long)size * (size + 1) / 2, "allreduce %ld", sum);
    int bc[256]; if (rank == 0) for (int i = 0; i < 256; i++) bc[i] = i * 3; else memset(bc, 0, sizeof bc);
    MPI_Bcast(bc, 256, MPI_INT, 0, MPI_COMM_WORLD);
    for (int i = 0; i < 256; i++) if (bc[i] != i * 3) { CHECK(0, "bcast[%d]=%d", i, bc[i]); break; }
    /* One-sided */
    const int N = 1 << 16;
    long *win_buf; MPI_Win win;
    MPI_Win_allocate(N * sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &win_buf, &win);
    for (int i = 0; i < N; i++) win_buf[i] = -1;
    long *src = malloc(N * sizeof(long)), *got = malloc(N * sizeof(long));
    for (int i = 0; i < N; i++) src[i] = (long)rank * 1000000 + i;
    MPI_Win_fence(0, win);
    MPI_Put(src, N, MPI_LONG, peer, 0, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < N; i++) if (win_buf[i] != (long)peer * 1000000 + i) { CHECK(0, "put[%d]=%ld", i, win_buf[i]); break; }
    MPI_Get(got, N, MPI_LONG, peer, 0, N, MPI_LONG, win);
    MPI_Win_fence(0, win);
    for (int i = 0; i < N; i++) if (got[i] != (long)rank * 1000000 + i) { CHECK(0, "get[%d]=%ld", i, got[i]); break; }
    long one = 1, old = 0;
    win_buf[0] = 0;
    MPI_Win_fence(0, win);
    for (int k = 0; k < 100; k++) MPI_Accumulate(&one, 1, MPI_LONG, 0, 0, 1, MPI_LONG, MPI_SUM, win);
    MPI_Win_fence(0, win);
    if (rank == 0) CHECK(win_buf[0] == 100L * size, "accumulate %ld", win_buf[0]);
    MPI_Win_lock(MPI_LOCK_SHARED, peer, 0, win);
    MPI_Fetch_and_op(&one, &old, MPI_LONG, peer, 1, MPI_SUM, win);
    MPI_Win_unlock(peer, win);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(old == (long)rank * 1000000 + 1, "fetch_and_op fetched %ld", old);
    CHECK(win_buf[1] == (long)peer * 1000000 + 2, "fetch_and_op left %ld", win_buf[1]);
    long cmp = (long)rank * 1000000 + 3, nv = 42, res = 0;
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, peer, 0, win);
    MPI_Compare_and_swap(&nv, &cmp, &res, MPI_LONG, peer, 3, win);
    MPI_Win_unlock(peer, win);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(res == cmp, "compare_and_swap fetched %ld", res);
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    CHECK(win_buf[3] == 42, "compare_and_swap left %ld", win_buf[3]);
    MPI_Win_unlock(rank, win);
    MPI_Win_free(&win);
    int all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%s: %d failures over %d ranks\n", all ? "FAILED" : "PASSED", all, size);
    MPI_Finalize();
    return all != 0;
}

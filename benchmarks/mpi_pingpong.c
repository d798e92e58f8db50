/* MPI ping-pong between ranks 0 and 1: the half round trip of SIZE-byte messages, median
 * and mean over ITERS after WARMUP, printed by rank 0 as "pingpong SIZE bytes: median X us,
 * mean Y us". The same program runs over Open MPI's UCX PML (on srdma) and over its TCP BTL,
 * for benchmarks/middleware.sh. Usage: mpi_pingpong [SIZE] [ITERS]. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int size = argc > 1 ? atoi(argv[1]) : 8, iters = argc > 2 ? atoi(argv[2]) : 10000;
    int warmup = iters / 10 + 10;
    char *buf = calloc(size > 0 ? size : 1, 1);
    double *t = malloc(sizeof(double) * iters);
    for (int i = -warmup; i < iters; i++) {
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, size, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Recv(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, size, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        if (i >= 0) t[i] = (MPI_Wtime() - t0) * 1e6 / 2;
    }
    if (rank == 0) {
        double sum = 0;
        for (int i = 0; i < iters; i++) sum += t[i];
        qsort(t, iters, sizeof(double), cmp);
        printf("pingpong %d bytes: median %.3f us, mean %.3f us\n", size, t[iters / 2], sum / iters);
    }
    free(buf);
    free(t);
    MPI_Finalize();
    return 0;
}

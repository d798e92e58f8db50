/* Point-to-point between ranks 0 and 1 (others wait): an 8 B ping-pong (half round trip,
 * µs) and a 64 MiB send/recv stream (MiB/s; each message marks one byte per page, the
 * receiver checks them all). Rank 0 prints
 * "pingpong 8 B: X us" and "sendrecv 64 MiB: Y MiB/s, N bad". Built and run by
 * benchmarks/mpi.sh. Usage: mpi_p2p [iterations] [messages] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int iters = argc > 1 ? atoi(argv[1]) : 20000, msgs = argc > 2 ? atoi(argv[2]) : 32;
    char small[8] = {0};
    long bad = 0;
    if (rank < 2) {
        int peer = rank ^ 1;
        for (int warm = 0; warm < 2; warm++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int i = 0; i < iters; i++) {
                if (rank == 0) {
                    MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                    MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(small, 8, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                }
            }
            double t = MPI_Wtime() - t0;
            if (rank == 0 && warm) printf("pingpong 8 B: %.2f us\n", t / iters / 2 * 1e6);
        }
        size_t n = 64 << 20;
        unsigned char *buf = calloc(1, n);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int m = 0; m < msgs; m++) {
            if (rank == 0) {
                for (size_t i = 0; i < n; i += 4096) buf[i] = (unsigned char)(m + 1);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
            } else {
                MPI_Recv(buf, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for (size_t i = 0; i < n; i += 4096) if (buf[i] != (unsigned char)(m + 1)) bad++;
            }
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0;
        long allbad = 0;
        MPI_Reduce(&bad, &allbad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) printf("sendrecv 64 MiB: %.0f MiB/s, %ld bad\n", msgs * 64.0 / t, allbad);
        bad = allbad;
    } else {
        MPI_Barrier(MPI_COMM_WORLD); MPI_Barrier(MPI_COMM_WORLD); MPI_Barrier(MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        long z = 0, allbad; MPI_Reduce(&z, &allbad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    }
    MPI_Finalize();
    return bad != 0;
}

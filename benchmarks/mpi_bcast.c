/* MPI_Bcast of TOTAL MiB from rank 0 in CHUNK-MiB calls, data checked on every rank (one byte
 * per page and the last); rank 0 prints MiB/s. Usage: mpi_bcast [total_MiB] [chunk_MiB].
 * Built and run by benchmarks/mpi.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t total = (argc > 1 ? atol(argv[1]) : 1024) << 20, chunk = (argc > 2 ? atol(argv[2]) : 64) << 20;
    unsigned char *buf = malloc(chunk);
    long bad = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (size_t off = 0; off < total; off += chunk) {
        unsigned char tag = (unsigned char)(off / chunk);
        if (rank == 0) memset(buf, tag, chunk);
        MPI_Bcast(buf, (int)chunk, MPI_BYTE, 0, MPI_COMM_WORLD);
        if (rank != 0) for (size_t i = 0; i < chunk; i += 4096) if (buf[i] != tag || buf[chunk - 1] != tag) bad++;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime() - t0;
    long allbad = 0; MPI_Reduce(&bad, &allbad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("bcast %zu MiB in %zu MiB calls, %d ranks: %.0f MiB/s, %ld bad\n", total >> 20, chunk >> 20, size, (total >> 20) / t, allbad);
    MPI_Finalize();
    return allbad != 0;
}

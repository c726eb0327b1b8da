// net_probe.c: the bandwidth and latency between the ranks' hosts, as
// nccl-tests defines them, so a link's configured rate can be set beside
// what MPI gets from it.
//   point to point: ping-pong between rank 0 and the first rank on another
//     host (MPI_Get_processor_name); time = round trip / 2,
//     algbw = busbw = S / time.
//   all-reduce: MPI_Allreduce of S bytes of fp32 over every rank;
//     algbw = S / time, busbw = algbw x 2(n-1)/n (the bytes each rank's link
//     carries in a ring, so busbw is comparable with the link's rate).
// Each size: the median of REPS timed repetitions after one warm-up.
//
// usage: mpirun -np N net_probe [--max-mb M] [--reps R] [--link-gbit G]
// prints one JSON object (rank 0): the sizes' figures, GB/s = 1e9 bytes/s;
// with --link-gbit, the link's rate in GB/s and each busbw's share of it.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct Probe {
    int rank, ranks, peer;  // peer: first rank on another host, -1 if none
    int hosts;
    double max_mb, link_gbit;
    int reps;
    char *buf, *recv;
} Probe;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Each rank's host name; sets the peer of rank 0 and the number of hosts.
static void find_hosts(Probe *p) {
    char mine[MPI_MAX_PROCESSOR_NAME] = {0};
    int len;
    MPI_Get_processor_name(mine, &len);
    char *all = calloc((size_t)p->ranks, MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
    p->peer = -1;
    p->hosts = 0;
    for (int q = 0; q < p->ranks; q++) {
        const char *name = all + (size_t)q * MPI_MAX_PROCESSOR_NAME;
        int seen = 0;
        for (int k = 0; k < q && !seen; k++) seen = strcmp(name, all + (size_t)k * MPI_MAX_PROCESSOR_NAME) == 0;
        p->hosts += !seen;
        if (p->peer < 0 && strcmp(name, all) != 0) p->peer = q;
    }
    if (p->peer < 0 && p->ranks > 1) p->peer = 1;  // one host: between two of its ranks
    free(all);
}

// Median seconds of one way of a ping-pong of `bytes` between rank 0 and the peer.
static double ping_pong_s(Probe *p, size_t bytes) {
    double t[p->reps];
    int me = p->rank == 0 ? 0 : p->rank == p->peer ? 1 : -1;
    for (int r = -1; r < p->reps; r++) {  // r = -1: the warm-up
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (me == 0) {
            MPI_Send(p->buf, (int)bytes, MPI_CHAR, p->peer, 0, MPI_COMM_WORLD);
            MPI_Recv(p->recv, (int)bytes, MPI_CHAR, p->peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (me == 1) {
            MPI_Recv(p->recv, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(p->buf, (int)bytes, MPI_CHAR, 0, 0, MPI_COMM_WORLD);
        }
        if (r >= 0) t[r] = (MPI_Wtime() - t0) / 2;
    }
    return median(t, p->reps);
}

// Median seconds of an MPI_Allreduce of `bytes` of fp32 over every rank (the
// slowest rank's time each repetition).
static double all_reduce_s(Probe *p, size_t bytes) {
    double t[p->reps];
    for (int r = -1; r < p->reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(p->buf, p->recv, (int)(bytes / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = MPI_Wtime() - t0, slowest;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0) t[r] = slowest;
    }
    return median(t, p->reps);
}

static void print_row(const Probe *p, size_t bytes, double s, double bus_factor, int last) {
    double algbw = bytes / s / 1e9, busbw = algbw * bus_factor;
    printf("   {\"bytes\": %zu, \"time_us\": %.2f, \"algbw_GBps\": %.6f, \"busbw_GBps\": %.6f", bytes, s * 1e6, algbw,
           busbw);
    if (p->link_gbit > 0) printf(", \"busbw_of_link\": %.4f", busbw / (p->link_gbit / 8));
    printf("}%s\n", last ? "" : ",");
}

static void parse(Probe *p, int argc, char **argv) {
    p->max_mb = 4;
    p->reps = 10;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--max-mb") == 0) p->max_mb = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--reps") == 0) p->reps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--link-gbit") == 0) p->link_gbit = atof(argv[i + 1]);
        else {
            if (p->rank == 0)
                fprintf(stderr, "net_probe: error: unknown option %s (--max-mb, --reps, --link-gbit)\n", argv[i]);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (p->max_mb <= 0 || p->reps < 1) {
        if (p->rank == 0) fprintf(stderr, "net_probe: error: --max-mb and --reps must be positive\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    Probe p = {0};
    MPI_Comm_rank(MPI_COMM_WORLD, &p.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p.ranks);
    parse(&p, argc, argv);
    find_hosts(&p);
    size_t max_bytes = (size_t)(p.max_mb * 1e6) / 4 * 4;
    p.buf = calloc(max_bytes, 1);
    p.recv = calloc(max_bytes, 1);
    // sizes by 4x from 4 KB up to --max-mb (fp32 counts for the all-reduce)
    size_t sizes[32];
    int nsizes = 0;
    for (size_t s = 4096; s <= max_bytes && nsizes < 32; s *= 4) sizes[nsizes++] = s;
    if (p.rank == 0) {
        printf("{\"ranks\": %d, \"hosts\": %d, \"peer_rank\": %d, \"reps\": %d", p.ranks, p.hosts, p.peer, p.reps);
        if (p.link_gbit > 0) printf(", \"link_GBps\": %.6f", p.link_gbit / 8);
        printf(",\n \"definitions\": \"nccl-tests: algbw = S/t; point to point busbw = algbw, t = round trip/2; "
               "all-reduce busbw = algbw x 2(n-1)/n\",\n \"p2p\": [\n");
    }
    for (int i = 0; i < nsizes && p.ranks > 1; i++) {
        double s = ping_pong_s(&p, sizes[i]);
        if (p.rank == 0) print_row(&p, sizes[i], s, 1.0, i == nsizes - 1);
    }
    if (p.rank == 0) printf(" ],\n \"all_reduce\": [\n");
    for (int i = 0; i < nsizes; i++) {
        double s = all_reduce_s(&p, sizes[i]);
        if (p.rank == 0) print_row(&p, sizes[i], s, 2.0 * (p.ranks - 1) / p.ranks, i == nsizes - 1);
    }
    if (p.rank == 0) printf(" ]}\n");
    free(p.buf);
    free(p.recv);
    MPI_Finalize();
    return 0;
}

// net_probe.c: the bandwidth and latency between the ranks' hosts, as
// nccl-tests defines them, so a link's configured rate can be set beside
// what MPI gets from it.
//   point to point: ping-pong between rank 0 and the first rank on another
//     host (MPI_Get_processor_name); time = round trip / 2,
//     algbw = busbw = S / time; the latency: the time of an 8-byte message.
//   collectives of S bytes of fp32 in all over every rank, as the trainers
//     call them: all-reduce (dp_baseline), blocking reduce-scatter and
//     all-gather (zero1), nonblocking ones (zero2, zero3); algbw = S / time,
//     busbw = algbw x 2(n-1)/n for the all-reduce, x (n-1)/n for the others
//     (the bytes each rank's link carries in a ring, so busbw is comparable
//     with the link's rate, and shows how far an algorithm is from a ring).
// Each size: the median of REPS timed repetitions after one warm-up.
//
// usage: mpirun -np N net_probe [--max-mb M] [--reps R] [--link-gbit G]
// prints one JSON object (rank 0): the sizes' figures, GB/s = 1e9 bytes/s;
// with --link-gbit, the link's rate in GB/s and each busbw's share of it.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"

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

// The collectives probed, called as the trainers call them (common/comm):
// dp_baseline's all-reduce, zero1's blocking reduce-scatter and all-gather,
// zero2's and zero3's nonblocking ones (started, then waited for).
typedef enum { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, IREDUCE_SCATTER, IALL_GATHER, NKINDS } Kind;
static const char *const KIND_NAME[NKINDS] = {"all_reduce", "reduce_scatter", "all_gather", "ireduce_scatter",
                                              "iall_gather"};

// One call of `kind` on S = `bytes` in all (fp32): an all-reduce of S, a
// reduce-scatter of S into S/n per rank, an all-gather of S/n per rank into S.
static void call(Probe *p, Kind kind, size_t bytes) {
    int n = p->ranks, part = (int)(bytes / sizeof(float) / (size_t)n);
    int counts[n], displs[n];
    for (int q = 0; q < n; q++) counts[q] = part, displs[q] = q * part;
    MPI_Request req = MPI_REQUEST_NULL;
    switch (kind) {
    case ALL_REDUCE: MPI_Allreduce(p->buf, p->recv, part * n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case REDUCE_SCATTER: MPI_Reduce_scatter(p->buf, p->recv, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case ALL_GATHER:
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p->recv, counts, displs, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case IREDUCE_SCATTER:
        MPI_Ireduce_scatter(p->buf, p->recv, counts, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        break;
    case IALL_GATHER:
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p->recv, counts, displs, MPI_FLOAT, MPI_COMM_WORLD, &req);
        break;
    default: break;
    }
    MPI_Wait(&req, MPI_STATUS_IGNORE);
}

// nccl-tests' bus factor: what each rank's link carries in a ring, over S.
static double bus_factor(Kind kind, int n) { return kind == ALL_REDUCE ? 2.0 * (n - 1) / n : (double)(n - 1) / n; }

// Median seconds of `kind` on `bytes` over every rank (the slowest rank's
// time each repetition).
static double collective_s(Probe *p, Kind kind, size_t bytes) {
    double t[p->reps];
    for (int r = -1; r < p->reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        call(p, kind, bytes);
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
    comm_single_copy_choose();  // as the trainers do (comm.h)
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
    }
    double latency_s = p.ranks > 1 ? ping_pong_s(&p, 8) : 0;
    if (p.rank == 0) {
        printf(", \"latency_us\": %.2f", latency_s * 1e6);
        printf(",\n \"definitions\": \"nccl-tests: algbw = S/t; point to point busbw = algbw, t = round trip/2; "
               "all-reduce busbw = algbw x 2(n-1)/n, reduce-scatter and all-gather x (n-1)/n; S in all\",\n"
               " \"p2p\": [\n");
    }
    for (int i = 0; i < nsizes && p.ranks > 1; i++) {
        double s = ping_pong_s(&p, sizes[i]);
        if (p.rank == 0) print_row(&p, sizes[i], s, 1.0, i == nsizes - 1);
    }
    for (int k = 0; k < NKINDS; k++) {
        if (p.rank == 0) printf(" ],\n \"%s\": [\n", KIND_NAME[k]);
        for (int i = 0; i < nsizes; i++) {
            // a size the ranks split evenly (the probe's sizes are powers of 4 KB)
            size_t bytes = sizes[i] / ((size_t)p.ranks * sizeof(float)) * p.ranks * sizeof(float);
            double s = collective_s(&p, (Kind)k, bytes);
            if (p.rank == 0) print_row(&p, bytes, s, bus_factor((Kind)k, p.ranks), i == nsizes - 1);
        }
    }
    if (p.rank == 0) printf(" ]}\n");
    free(p.buf);
    free(p.recv);
    MPI_Finalize();
    return 0;
}

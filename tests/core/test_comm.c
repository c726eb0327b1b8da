// mpirun: 4
// test_comm.c: every collective of the MPI backend on the cpu device, blocking
// and asynchronous, with unequal and zero counts; paired sends and receives;
// all-to-all; sub-groups, and the groups of a host and across hosts; the
// ring-bytes statistics and the part of them that leaves a host; the trace gathered from every rank. The collectives run twice:
// on the buffers themselves, and through pinned stages as on the cuda device's
// MPI path (Comm.stage_always), reusing the stages from the group's pool. Each rank checks its own
// result; the verdicts are reduced so rank 0 asserts the global truth.
#define TEST_WITH_MPI
#include <unistd.h>
#include "testutil.h"
#include "bf16.h"
#include "comm.h"

typedef struct Fixture {
    Comm world;
    Device dev;
} Fixture;

// 1 on every rank when ok was 1 on every rank
static int all_ranks(Comm *c, int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->mpi);
    return all;
}

static void test_all_reduce_f32(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    enum { n = 1000 };
    float buf[n];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        for (int i = 0; i < n; i++) buf[i] = (float)(c->rank + 1) + (float)i;
        comm_all_reduce_sum(c, buf, n, DT_F32, h);
        comm_wait(c, h);
        int ok = 1;
        // sum over ranks of (r + 1 + i) = N(N+1)/2 + N*i
        for (int i = 0; i < n; i++)
            ok &= buf[i] == (float)(c->size * (c->size + 1) / 2 + c->size * i);
        assert_true(all_ranks(c, ok));
    }
}

static void test_all_reduce_bf16(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    enum { n = 777 };
    bf16 buf[n];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        // small integers: every partial sum is exact in bf16 (8-bit mantissa)
        for (int i = 0; i < n; i++) buf[i] = f32_to_bf16((float)(c->rank * 3 + i % 7));
        comm_all_reduce_sum(c, buf, n, DT_HALF, h);
        comm_wait(c, h);
        int ok = 1;
        for (int i = 0; i < n; i++) {
            float fp32_sum = 0;
            for (int r = 0; r < c->size; r++) fp32_sum += (float)(r * 3 + i % 7);
            ok &= buf[i] == f32_to_bf16(fp32_sum);
        }
        assert_true(all_ranks(c, ok));
    }
}

static void test_all_reduce_bf16_rounds(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    // 256 + 1 + 1 + 1 with pairwise rounding: 257 is not a bf16, so any order
    // of the sums gives a bf16 value; the result must be one and equal everywhere
    bf16 x = f32_to_bf16(c->rank == 0 ? 256.0f : 1.0f);
    comm_all_reduce_sum(c, &x, 1, DT_HALF, NULL);
    float got = bf16_to_f32(x);
    int ok = got >= 256.0f && got <= 260.0f && f32_to_bf16(got) == x;
    float mine = got, lo = 0, hi = 0;
    MPI_Allreduce(&mine, &lo, 1, MPI_FLOAT, MPI_MIN, c->mpi);
    MPI_Allreduce(&mine, &hi, 1, MPI_FLOAT, MPI_MAX, c->mpi);
    assert_true(all_ranks(c, ok && lo == hi));
}

// The maximum of f32 values of either sign, -infinity included (a rank with
// nothing to offer, as a vocabulary part holding only padding rows).
static void test_all_reduce_max_f32(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    enum { n = 300 };
    float buf[n];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        // element i's maximum -i/4 sits on rank i % size; the other ranks hold less
        for (int i = 0; i < n; i++)
            buf[i] = c->rank == i % c->size ? -0.25f * (float)i : (i % 3 ? -INFINITY : -1000.0f - (float)c->rank);
        comm_all_reduce_max(c, buf, n, DT_F32, h);
        comm_wait(c, h);
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= buf[i] == -0.25f * (float)i;
        assert_true(all_ranks(c, ok));
    }
}

// counts: {3, 0, 5, 2} on 4 ranks (a bucket that skips rank 1's shard)
static void rank_counts(const Comm *c, size_t *counts, size_t *displs, size_t *total) {
    static const size_t pattern[4] = {3, 0, 5, 2};
    *total = 0;
    for (int r = 0; r < c->size; r++) {
        counts[r] = pattern[r % 4];
        displs[r] = *total;
        *total += counts[r];
    }
}

static void test_reduce_scatter_unequal(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    size_t counts[64], displs[64], total;
    rank_counts(c, counts, displs, &total);
    float send[64], recv[64];
    bf16 send16[64], recv16[64];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        for (size_t i = 0; i < total; i++) {
            send[i] = (float)(c->rank * 100 + (int)i);
            send16[i] = f32_to_bf16((float)(c->rank + (int)i));
        }
        for (int i = 0; i < 64; i++) recv[i] = -1, recv16[i] = 0;
        comm_reduce_scatter_sum(c, send, recv, counts, DT_F32, h);
        comm_wait(c, h);
        CommHandle h16 = {0};
        comm_reduce_scatter_sum(c, send16, recv16, counts, DT_HALF, h ? &h16 : NULL);
        comm_wait(c, &h16);
        int ok = 1, n = c->size;
        for (size_t j = 0; j < counts[c->rank]; j++) {
            int i = (int)(displs[c->rank] + j);
            ok &= recv[j] == (float)(100 * n * (n - 1) / 2 + n * i);
            ok &= recv16[j] == f32_to_bf16((float)(n * (n - 1) / 2 + n * i));
        }
        ok &= recv[counts[c->rank]] == -1;  // nothing written past this rank's part
        assert_true(all_ranks(c, ok));
    }
}

static void test_all_gather_in_place_unequal(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    size_t counts[64], displs[64], total;
    rank_counts(c, counts, displs, &total);
    int32_t buf[64];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        for (int i = 0; i < 64; i++) buf[i] = -1;
        for (size_t j = 0; j < counts[c->rank]; j++)
            buf[displs[c->rank] + j] = c->rank * 10 + (int)j;
        comm_all_gather(c, buf, counts, displs, DT_I32, h);
        comm_wait(c, h);
        int ok = 1;
        for (int r = 0; r < c->size; r++)
            for (size_t j = 0; j < counts[r]; j++) ok &= buf[displs[r] + j] == r * 10 + (int)j;
        ok &= buf[total] == -1;
        assert_true(all_ranks(c, ok));
    }
}

// Parts with gaps between them: the gaps keep their values (on the staged
// path too, where the stage holds the whole extent).
static void test_all_gather_leaves_gaps(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    size_t counts[64], displs[64], extent = 0;
    for (int r = 0; r < c->size; r++) {
        counts[r] = (size_t)(r % 3) + 1;
        displs[r] = extent + 1;  // one element of gap before each part
        extent = displs[r] + counts[r];
    }
    int32_t buf[256];
    CommHandle h = {0};
    for (int i = 0; i < 256; i++) buf[i] = -7;
    for (size_t j = 0; j < counts[c->rank]; j++) buf[displs[c->rank] + j] = c->rank * 10 + (int)j;
    comm_all_gather(c, buf, counts, displs, DT_I32, &h);
    comm_wait(c, &h);
    int ok = 1;
    for (int r = 0; r < c->size; r++) {
        ok &= buf[displs[r] - 1] == -7;
        for (size_t j = 0; j < counts[r]; j++) ok &= buf[displs[r] + j] == r * 10 + (int)j;
    }
    ok &= buf[extent] == -7;
    assert_true(all_ranks(c, ok));
}

// Pinning is slow, so finished stages wait in the group's pool: repeated
// calls of one size pin once; a larger call pins a second stage beside it.
static void test_stage_pool_reuse(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    MemCtx *m = &c->dev->mem;
    for (int i = 0; i < COMM_STAGE_POOL; i++) buf_free(c->dev, &c->stage_pool[i]);  // the earlier tests' stages
    float buf[256];
    for (int i = 0; i < 256; i++) buf[i] = 1.0f;
    comm_all_reduce_sum(c, buf, 64, DT_F32, NULL);
    size_t after_one = m->tier_current[TIER_PINNED];
    for (int k = 0; k < 10; k++) comm_all_reduce_sum(c, buf, 64, DT_F32, NULL);
    int ok = m->tier_current[TIER_PINNED] == after_one && after_one >= 64 * sizeof(float);
    comm_all_reduce_sum(c, buf, 256, DT_F32, NULL);
    ok &= m->tier_current[TIER_PINNED] >= after_one + 256 * sizeof(float);
    ok &= buf[0] == (float)pow(c->size, 12) && buf[255] == (float)c->size;
    assert_true(all_ranks(c, ok));
}

static void test_broadcast_from_rank_2(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    double buf[100];
    for (int async = 0; async < 2; async++) {  // blocking, then with a handle and comm_wait
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        for (int i = 0; i < 100; i++) buf[i] = c->rank == 2 ? 0.5 * i + async : -7.0;
        comm_broadcast(c, buf, 100, DT_F64, 2, h);
        comm_wait(c, h);
        int ok = 1;
        for (int i = 0; i < 100; i++) ok &= buf[i] == 0.5 * i + async;
        assert_true(all_ranks(c, ok));
    }
}

static void test_send_recv_ring(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    int right = (c->rank + 1) % c->size, left = (c->rank + c->size - 1) % c->size;
    float out[50], in[50];
    for (int i = 0; i < 50; i++) out[i] = (float)(c->rank * 1000 + i);

    // asynchronous: post both, then wait
    CommHandle hs = {0}, hr = {0};
    memset(in, 0, sizeof in);
    comm_recv(c, in, 50, DT_F32, left, 7, &hr);
    comm_send(c, out, 50, DT_F32, right, 7, &hs);
    comm_wait(c, &hr);
    comm_wait(c, &hs);
    int ok = 1;
    for (int i = 0; i < 50; i++) ok &= in[i] == (float)(left * 1000 + i);

    // blocking: even ranks send first, odd ranks receive first (no cycle of waits)
    memset(in, 0, sizeof in);
    if (c->rank % 2 == 0) {
        comm_send(c, out, 50, DT_F32, right, 8, NULL);
        comm_recv(c, in, 50, DT_F32, left, 8, NULL);
    } else {
        comm_recv(c, in, 50, DT_F32, left, 8, NULL);
        comm_send(c, out, 50, DT_F32, right, 8, NULL);
    }
    for (int i = 0; i < 50; i++) ok &= in[i] == (float)(left * 1000 + i);
    assert_true(all_ranks(c, ok));
}

// Partners 0-1 and 2-3 each send to the other and receive from it at once,
// as neighbouring pipeline stages do. 4 MiB each way is past MPI's eager
// limit: two blocking sends issued first would wait for each other forever.
static void test_send_recv_pairs(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    enum { N = 1 << 20 };
    int peer = c->rank ^ 1, ok = 1;
    float *out = malloc(N * sizeof(float)), *in = malloc(N * sizeof(float));
    for (int i = 0; i < N; i++) out[i] = (float)(c->rank * 10 + i % 7);
    for (int async = 0; async <= 1; async++) {
        double sent0 = c->stats.payload_bytes[OP_SEND], recvd0 = c->stats.payload_bytes[OP_RECV];
        memset(in, 0, N * sizeof(float));
        CommHandle hs = {0}, hr = {0};
        comm_send_recv(c, out, 3, in, 3, N, DT_F32, peer, async ? &hs : NULL, async ? &hr : NULL);
        comm_wait(c, &hr);
        comm_wait(c, &hs);
        for (int i = 0; i < N; i++) ok &= in[i] == (float)(peer * 10 + i % 7);
        ok &= c->stats.payload_bytes[OP_SEND] - sent0 == N * 4.0 && c->stats.payload_bytes[OP_RECV] - recvd0 == N * 4.0;
    }
    free(out);
    free(in);
    assert_true(all_ranks(c, ok));
}

static void test_split_into_two_groups(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    Comm g;
    int color = c->rank / 2;  // {0,1} and {2,3}
    comm_split(c, color, c->rank, &g);
    int ok = g.size == 2 && g.rank == c->rank % 2 && !g.owns_op;

    float x[10];
    for (int i = 0; i < 10; i++) x[i] = (float)(c->rank + i);
    comm_all_reduce_sum(&g, x, 10, DT_F32, NULL);
    int first = 2 * color;  // sum over the two members: first + (first+1) + 2i
    for (int i = 0; i < 10; i++) ok &= x[i] == (float)(2 * first + 1 + 2 * i);

    bf16 y[4];
    for (int i = 0; i < 4; i++) y[i] = f32_to_bf16((float)(c->rank + 1));
    CommHandle h = {0};
    comm_all_reduce_sum(&g, y, 4, DT_HALF, &h);  // the op is shared from the world
    comm_wait(&g, &h);
    for (int i = 0; i < 4; i++) ok &= y[i] == f32_to_bf16((float)(2 * first + 3));

    size_t counts[2] = {1, 2};
    float send[3] = {(float)c->rank, 10.0f * c->rank, 100.0f * c->rank}, recv[2] = {0, 0};
    comm_reduce_scatter_sum(&g, send, recv, counts, DT_F32, NULL);
    float s = (float)(2 * first + 1);
    if (g.rank == 0) ok &= recv[0] == s;
    else ok &= recv[0] == 10 * s && recv[1] == 100 * s;

    ok &= g.stats.calls[OP_ALL_REDUCE] == 2 && g.stats.calls[OP_REDUCE_SCATTER] == 1;
    comm_free(&g);
    bf16 z = f32_to_bf16(1.0f);
    comm_all_reduce_sum(c, &z, 1, DT_HALF, NULL);  // freeing the group left the world's op alive
    ok &= z == f32_to_bf16((float)c->size);
    assert_true(all_ranks(c, ok));
}

static void test_ring_bytes_formula(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    int n = c->size;
    comm_stats_reset(c);
    Trace tr;
    trace_init(&tr, 0, now_us());  // not written: its timeline records the calls
    Trace *saved = c->trace;
    c->trace = &tr;
    float buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = 1;
    double t0 = now_us();
    comm_all_reduce_sum(c, buf, 1000, DT_F32, NULL);
    double t1 = now_us();
    // a blocking call is all exposed: in flight and waiting over the same interval
    double fly = timeline_union_us(&tr.tl, TRACE_TID_COMM, t0, t1), wait = timeline_union_us(&tr.tl, TRACE_TID_WAIT, t0, t1);
    int ok = fly > 0 && wait > 0 && fabs(fly - wait) < 1e-6 && fly <= t1 - t0;
    CommHandle h = {0};
    comm_all_reduce_sum(c, buf, 1000, DT_F32, &h);
    comm_wait(c, &h);

    float recv[1000];
    size_t counts[64];
    for (int r = 0; r < n; r++) counts[r] = 1000 / n;
    comm_reduce_scatter_sum(c, buf, recv, counts, DT_F32, NULL);

    // all-reduce: 2(N-1)/N x payload per call; reduce-scatter: (N-1)/N x payload
    double ar = 2.0 * (n - 1) / n * 4000;
    double rs = (double)(n - 1) / n * (1000 / n * n * 4);
    ok &= c->stats.calls[OP_ALL_REDUCE] == 2;
    ok &= test_close(c->stats.payload_bytes[OP_ALL_REDUCE], 8000, 0, 1e-12);
    ok &= test_close(c->stats.ring_bytes[OP_ALL_REDUCE], 2 * ar, 0, 1e-12);
    ok &= test_close(c->stats.ring_bytes[OP_REDUCE_SCATTER], rs, 0, 1e-12);
    ok &= n != 4 || c->stats.ring_bytes[OP_ALL_REDUCE] == 12000;  // 2 x 1.5 x 4000
    ok &= c->stats.calls[OP_ALL_GATHER] == 0;
    double t2 = now_us();  // blocked time is part of in-flight time, which is part of the window
    ok &= timeline_union_us(&tr.tl, TRACE_TID_WAIT, t0, t2) <= timeline_union_us(&tr.tl, TRACE_TID_COMM, t0, t2);
    ok &= timeline_union_us(&tr.tl, TRACE_TID_COMM, t0, t2) <= t2 - t0;
    c->trace = saved;
    trace_free(&tr);
    assert_true(all_ranks(c, ok));
}

// Rank r sends rank q r + q + 1 floats (none to itself when r is 1), each
// naming sender, receiver and position; blocking, then with a handle.
static void test_all_to_all_unequal(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    int n = c->size, ok = 1;
    size_t sendcounts[64], recvcounts[64], send_total = 0, recv_total = 0;
    for (int q = 0; q < n; q++) {
        sendcounts[q] = c->rank == 1 && q == 1 ? 0 : (size_t)(c->rank + q + 1);
        recvcounts[q] = c->rank == 1 && q == 1 ? 0 : (size_t)(q + c->rank + 1);
        send_total += sendcounts[q];
        recv_total += recvcounts[q];
    }
    float *send = malloc(send_total * sizeof(float)), *recv = malloc(recv_total * sizeof(float));
    for (size_t q = 0, at = 0; q < (size_t)n; at += sendcounts[q++])
        for (size_t i = 0; i < sendcounts[q]; i++) send[at + i] = (float)(1000 * c->rank + 100 * q + i);
    for (int async = 0; async < 2; async++) {
        CommHandle handle = {0}, *h = async ? &handle : NULL;
        double moved0 = c->stats.ring_bytes[OP_ALL_TO_ALL];
        memset(recv, 0, recv_total * sizeof(float));
        comm_all_to_all(c, send, sendcounts, recv, recvcounts, DT_F32, h);
        comm_wait(c, h);
        for (size_t q = 0, at = 0; q < (size_t)n; at += recvcounts[q++])
            for (size_t i = 0; i < recvcounts[q]; i++) ok &= recv[at + i] == (float)(1000 * q + 100 * c->rank + i);
        // the bytes to the other ranks, not the part for itself
        ok &= c->stats.ring_bytes[OP_ALL_TO_ALL] - moved0 == 4.0 * (send_total - sendcounts[c->rank]);
    }
    free(send);
    free(recv);
    assert_true(all_ranks(c, ok));
}

// Hosts as comm_world_init finds them (one here), then 4 ranks set out as 2
// hosts of 2: the host and across groups, and whether the layout is regular.
static void test_split_hosts(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    int ok = c->hosts == 1 && c->host_links == 0 && comm_hosts_regular(c);
    int *found = c->host_of, found_hosts = c->hosts, found_links = c->host_links;
    int two[4] = {0, 0, 1, 1}, mixed[4] = {0, 1, 0, 1}, uneven[4] = {0, 0, 0, 1};
    c->host_of = mixed, c->hosts = 2, c->host_links = 4;
    ok &= !comm_hosts_regular(c);
    c->host_of = uneven, c->host_links = 2;
    ok &= !comm_hosts_regular(c);
    c->host_of = two;
    ok &= comm_hosts_regular(c);
    Comm host, across;
    comm_split_hosts(c, &host, &across);
    ok &= host.size == 2 && host.rank == c->rank % 2 && host.hosts == 1 && host.host_links == 0;
    ok &= across.size == 2 && across.rank == c->rank / 2 && across.hosts == 2 && across.host_links == 2;
    float x = (float)c->rank;
    comm_all_reduce_sum(&across, &x, 1, DT_F32, NULL);  // ranks r and r + 2
    ok &= x == (float)(2 * (c->rank % 2) + 2);
    comm_free(&host);
    comm_free(&across);
    c->host_of = found, c->hosts = found_hosts, c->host_links = found_links;
    assert_true(all_ranks(c, ok));
}

// The bytes that leave a host, with 4 ranks set out as 2 hosts of 2: a
// ring's links 1 -> 2 and 3 -> 0 join the hosts, half of its 4 links; an
// all-to-all's parts for ranks 2 and 3 (from ranks 0 and 1) leave; a send
// leaves only when its peer is on the other host. On one host nothing does.
static void test_cross_host_bytes(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    int *found = c->host_of, found_hosts = c->hosts, found_links = c->host_links, two[4] = {0, 0, 1, 1};
    float buf[1000] = {0};
    size_t counts[4] = {250, 250, 250, 250}, displs[4] = {0, 250, 500, 750}, ten[4] = {10, 10, 10, 10};
    int ok = 1;
    for (int hosts = 1; hosts <= 2; hosts++) {
        if (hosts == 2) c->host_of = two, c->hosts = 2, c->host_links = 2;
        comm_stats_reset(c);
        comm_all_gather(c, buf, counts, displs, DT_F32, NULL);
        comm_all_to_all(c, buf, ten, buf + 500, ten, DT_F32, NULL);
        float one[8] = {0};
        comm_send_recv(c, one, 5, one + 4, 5, 4, DT_F32, c->rank ^ 2, NULL, NULL);  // 0 <-> 2, 1 <-> 3: across
        comm_send_recv(c, one, 6, one + 4, 6, 4, DT_F32, c->rank ^ 1, NULL, NULL);  // 0 <-> 1, 2 <-> 3: within
        ok &= c->stats.ring_bytes[OP_ALL_GATHER] == 3000 && c->stats.ring_bytes[OP_ALL_TO_ALL] == 120;
        double cross = comm_cross_host_bytes(c);
        if (hosts == 1) ok &= cross == 0;
        else
            ok &= c->stats.cross_host_bytes[OP_ALL_GATHER] == 1500 && c->stats.cross_host_bytes[OP_ALL_TO_ALL] == 80 &&
                  c->stats.cross_host_bytes[OP_SEND] == 16 && c->stats.cross_host_bytes[OP_RECV] == 16 &&
                  cross == 1500 + 80 + 32;
    }
    c->host_of = found, c->hosts = found_hosts, c->host_links = found_links;
    assert_true(all_ranks(c, ok));
}

static void test_sum_and_max_f64(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    long before = c->stats.calls[OP_ALL_REDUCE];
    double sum = comm_sum_f64(c, 0.25 * (c->rank + 1));
    double max = comm_max_f64(c, (double)(c->rank * c->rank));
    int n = c->size;
    int ok = sum == 0.25 * n * (n + 1) / 2 && max == (double)((n - 1) * (n - 1));
    ok &= c->stats.calls[OP_ALL_REDUCE] == before;  // host bookkeeping is not counted
    assert_true(all_ranks(c, ok));
}

static void test_progress_until_test_completes(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    enum { n = 1 << 16 };
    float *buf = malloc(n * sizeof *buf);
    for (int i = 0; i < n; i++) buf[i] = 1;
    CommHandle h = {0};
    comm_all_reduce_sum(c, buf, n, DT_F32, &h);
    int polls = 0;
    while (!comm_test(c, &h) && polls < 100000000) {
        comm_progress(c);
        polls++;
    }
    int ok = !h.active && comm_test(c, &h);  // a completed handle stays complete
    for (int i = 0; i < n; i++) ok &= buf[i] == (float)c->size;
    free(buf);
    assert_true(all_ranks(c, ok));
}

static void test_trace_gathers_every_rank(void **state) {
    Comm *c = &((Fixture *)*state)->world;
    Trace t;
    trace_init(&t, 1, now_us());
    Trace *saved = c->trace;
    c->trace = &t;
    float x = 1;
    comm_all_reduce_sum(c, &x, 1, DT_F32, NULL);
    c->trace = saved;
    trace_span(&t, TRACE_TID_COMPUTE, "matmul_forward", now_us(), now_us() + 5, 0);
    int ok = t.count == 3;  // the all-reduce in flight, its wait (it blocked), the compute span

    char path[256] = "/tmp/test_comm_trace_XXXXXX";
    if (c->rank == 0) close(mkstemp(path));
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, c->mpi);
    trace_write(&t, path);
    trace_free(&t);
    MPI_Barrier(c->mpi);
    if (c->rank == 0) {
        char *json = calloc(1, 1 << 20);
        FILE *f = fopen(path, "r");
        ok &= f != NULL && fread(json, 1, (1 << 20) - 1, f) > 0;
        if (f) fclose(f);
        ok &= strncmp(json, "{\"traceEvents\":[", 16) == 0;
        char want[64];
        for (int r = 0; r < c->size; r++) {
            snprintf(want, sizeof want, "\"args\":{\"name\":\"rank %d\"}", r);
            ok &= strstr(json, want) != NULL;
            snprintf(want, sizeof want, "\"ph\":\"X\",\"pid\":%d,\"tid\":1", r);
            ok &= strstr(json, want) != NULL;  // each rank's all_reduce on the comm thread
        }
        ok &= strstr(json, "\"name\":\"all_reduce\"") != NULL;
        ok &= strstr(json, "\"args\":{\"bytes\":4}") != NULL;
        free(json);
        unlink(path);
    }
    assert_true(all_ranks(c, ok));
}

int main(int argc, char **argv) {
    Fixture fixture;  // set up once, handed to every test as its state
    int local_rank, local_size;
    comm_world_init(&fixture.world, &argc, &argv, &local_rank, &local_size, 0);
    DeviceOptions opt = {.kind = "cpu", .local_rank = local_rank, .local_size = local_size};
    device_init(&fixture.dev, &opt);
    comm_setup(&fixture.world, &fixture.dev, "auto", NULL);

    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_all_reduce_f32, &fixture),
        cmocka_unit_test_prestate(test_all_reduce_bf16, &fixture),
        cmocka_unit_test_prestate(test_all_reduce_bf16_rounds, &fixture),
        cmocka_unit_test_prestate(test_all_reduce_max_f32, &fixture),
        cmocka_unit_test_prestate(test_reduce_scatter_unequal, &fixture),
        cmocka_unit_test_prestate(test_all_gather_in_place_unequal, &fixture),
        cmocka_unit_test_prestate(test_all_gather_leaves_gaps, &fixture),
        cmocka_unit_test_prestate(test_broadcast_from_rank_2, &fixture),
        cmocka_unit_test_prestate(test_send_recv_ring, &fixture),
        cmocka_unit_test_prestate(test_send_recv_pairs, &fixture),
        cmocka_unit_test_prestate(test_split_into_two_groups, &fixture),
        cmocka_unit_test_prestate(test_ring_bytes_formula, &fixture),
        cmocka_unit_test_prestate(test_all_to_all_unequal, &fixture),
        cmocka_unit_test_prestate(test_split_hosts, &fixture),
        cmocka_unit_test_prestate(test_cross_host_bytes, &fixture),
        cmocka_unit_test_prestate(test_sum_and_max_f64, &fixture),
        cmocka_unit_test_prestate(test_progress_until_test_completes, &fixture),
        cmocka_unit_test_prestate(test_trace_gathers_every_rank, &fixture),
    };
    int failed = run_mpi_tests(tests);

    Fixture staged = fixture;  // the same group and device (world.dev), its own stage pool
    staged.world.stage_always = 1;
    staged.world.owns_op = 0;  // the world frees the bf16 op
    staged.world.host_of = NULL;  // and its hosts (one, as NULL says)
    const struct CMUnitTest through_pinned_stages[] = {
        cmocka_unit_test_prestate(test_all_reduce_f32, &staged),
        cmocka_unit_test_prestate(test_all_reduce_bf16, &staged),
        cmocka_unit_test_prestate(test_all_reduce_max_f32, &staged),
        cmocka_unit_test_prestate(test_reduce_scatter_unequal, &staged),
        cmocka_unit_test_prestate(test_all_gather_in_place_unequal, &staged),
        cmocka_unit_test_prestate(test_all_gather_leaves_gaps, &staged),
        cmocka_unit_test_prestate(test_broadcast_from_rank_2, &staged),
        cmocka_unit_test_prestate(test_send_recv_ring, &staged),
        cmocka_unit_test_prestate(test_send_recv_pairs, &staged),
        cmocka_unit_test_prestate(test_all_to_all_unequal, &staged),
        cmocka_unit_test_prestate(test_stage_pool_reuse, &staged),
    };
    failed |= run_mpi_tests(through_pinned_stages);

    comm_free(&staged.world);  // its stages go back to the device before the device goes
    device_destroy(&fixture.dev);
    comm_world_finalize(&fixture.world);
    return failed ? 1 : 0;
}

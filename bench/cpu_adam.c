// cpu_adam.c (bench): how close the CPU Adam (cpu_adam.h) comes to the
// memory bandwidth of this machine, and how much its SIMD path gains over the
// scalar loop. In one run, in interleaved rounds (each round runs the three
// in a rotated order, one call each, after one warm-up call of each):
//   triad   a[i] = b[i] + s*c[i] (STREAM's triad, McCalpin), OpenMP over the
//           threads; GB/s counts 3 arrays x 4 bytes per element, as STREAM
//           does: the write-allocate read of a[] is not counted;
//   best    cpu_adam_step on the widest path this CPU has, same threads;
//   scalar  cpu_adam_step on the scalar path, same threads.
// Adam's GB/s counts 28 bytes per parameter: 2 grad in, 12 read and 12
// written of master/m/v, 2 param out (param's write-allocate, 2 more bytes,
// is not counted either; "with_write_allocate" gives the ratio with both
// write-allocates counted: 16 bytes per triad element, 30 per parameter).
// Reported: the median time of the rounds; ratios of the medians.
//
// usage: cpu_adam [--params COUNT] [--threads N] [--rounds R]; prints one
// JSON object.
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "check.h"
#include "cpu_adam.h"
#include "flags.h"

enum { TRIAD, ADAM_BEST, ADAM_SCALAR, KINDS };
static const char *const KIND_NAMES[KINDS] = {"triad", "adam_best", "adam_scalar"};

#define TRIAD_BYTES_PER_ELEM 12.0  // read b, c; write a (4 bytes each)
#define ADAM_BYTES_PER_PARAM 28.0  // 2 grad + 12 read + 12 written + 2 param
#define TARGET_ADAM_TO_TRIAD 0.80
#define TARGET_BEST_TO_SCALAR 5.0

typedef struct Bench {
    size_t n;  // triad elements = Adam parameters
    int threads, rounds;
    float *a, *b, *c;         // triad
    float *master, *m, *v;    // Adam state
    bf16 *grad, *param;
    AdamWStep step;
} Bench;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void *alloc_or_exit(size_t bytes, size_t n) {
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!p)
        fail_usage("cannot allocate %.2f GB for --params %zu; pass a smaller --params",
                   bytes * 1e-9, n);
    return p;
}

// First touch on the threads that later stream the data (NUMA placement);
// values that keep Adam's state normal (no denormal slow paths) step after step.
static void bench_init(Bench *bn) {
    size_t n = bn->n;
    bn->a = alloc_or_exit(n * 4, n), bn->b = alloc_or_exit(n * 4, n), bn->c = alloc_or_exit(n * 4, n);
    bn->master = alloc_or_exit(n * 4, n), bn->m = alloc_or_exit(n * 4, n);
    bn->v = alloc_or_exit(n * 4, n);
    bn->grad = alloc_or_exit(n * 2, n), bn->param = alloc_or_exit(n * 2, n);
#pragma omp parallel for schedule(static) num_threads(bn->threads)
    for (size_t i = 0; i < n; i++) {
        float x = (float)(i % 1000) * 1e-3f - 0.5f;  // in [-0.5, 0.5)
        bn->a[i] = 0.0f, bn->b[i] = 1.0f + x, bn->c[i] = x;
        bn->master[i] = x, bn->m[i] = 0.1f * x, bn->v[i] = 0.01f * x * x + 1e-4f;
        bn->grad[i] = f32_to_bf16(x + (x < 0 ? -0.25f : 0.25f));  // |g| >= 0.25
        bn->param[i] = 0;
    }
    // step 10 of a GPT-2-like run
    const float beta1 = 0.9f, beta2 = 0.95f, t = 10;
    bn->step = (AdamWStep){.lr = 6e-4f, .beta1 = beta1, .beta2 = beta2, .eps = 1e-8f,
                           .weight_decay = 0.1f, .bias_corr1 = 1.0f - powf(beta1, t),
                           .bias_corr2 = 1.0f - powf(beta2, t), .grad_scale = 1.0f};
}

static void bench_free(Bench *bn) {
    free(bn->a), free(bn->b), free(bn->c), free(bn->master), free(bn->m), free(bn->v);
    free(bn->grad), free(bn->param);
}

static void triad(Bench *bn, float s) {
    float *a = bn->a;
    const float *b = bn->b, *c = bn->c;
#pragma omp parallel for simd schedule(static) num_threads(bn->threads)
    for (size_t i = 0; i < bn->n; i++) a[i] = b[i] + s * c[i];
}

// seconds of one call of `kind`
static double run_once(Bench *bn, int kind) {
    double t0 = now_s();
    if (kind == TRIAD) {
        triad(bn, 3.0f);
    } else {
        CpuAdamPath path = kind == ADAM_BEST ? cpu_adam_best_path() : CPU_ADAM_SCALAR;
        cpu_adam_step(path, bn->threads, bn->master, bn->m, bn->v, bn->grad, bn->param, bn->n,
                      &bn->step);
    }
    return now_s() - t0;
}

static int cmp_double(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *x, int count) {
    qsort(x, (size_t)count, sizeof *x, cmp_double);
    return count % 2 ? x[count / 2] : 0.5 * (x[count / 2 - 1] + x[count / 2]);
}

static void parse(int argc, char **argv, Bench *bn) {
    double params = 64e6;
    int threads = 0, rounds = 7;
    FlagSpec specs[] = {
        {.name = "params", .type = FLAG_COUNT, .dst = &params, .meta = "COUNT",
         .help = "parameters (and triad elements): 64M, 1e6", .min = 1, .max = 4e9},
        {.name = "threads", .type = FLAG_INT, .dst = &threads, .meta = "N",
         .help = "OpenMP threads; 0 = every processor", .min = 0, .max = 1024},
        {.name = "rounds", .type = FLAG_INT, .dst = &rounds, .meta = "R",
         .help = "interleaved rounds; the median is reported", .min = 1, .max = 1000},
    };
    flags_parse(argc, argv, specs, 3,
                "usage: cpu_adam [--params COUNT] [--threads N] [--rounds R]\n"
                "CPU Adam against a STREAM triad and the scalar loop; prints one JSON object.");
    bn->n = (size_t)params;
    bn->threads = threads ? threads : omp_get_num_procs();
    bn->rounds = rounds;
}

// the median, fastest and slowest seconds of each kind over the rounds
static void measure(Bench *bn, double med_s[KINDS], double min_s[KINDS], double max_s[KINDS]) {
    double *secs[KINDS];
    for (int k = 0; k < KINDS; k++) {
        secs[k] = xcalloc((size_t)bn->rounds, sizeof(double));
        run_once(bn, k);  // warm-up: thread start, first pass over the pages
    }
    for (int r = 0; r < bn->rounds; r++)
        for (int j = 0; j < KINDS; j++) {
            int k = (r + j) % KINDS;
            secs[k][r] = run_once(bn, k);
        }
    for (int k = 0; k < KINDS; k++) {
        med_s[k] = median(secs[k], bn->rounds);  // sorts: the ends are the extremes
        min_s[k] = secs[k][0];
        max_s[k] = secs[k][bn->rounds - 1];
        free(secs[k]);
    }
}

static const char *yes_no(int x) { return x ? "true" : "false"; }

static void print_json(const Bench *bn, const double med_s[KINDS], const double min_s[KINDS],
                       const double max_s[KINDS]) {
    double gbps[KINDS], gbps_lo[KINDS], gbps_hi[KINDS];  // the spread over the rounds: slowest, fastest
    for (int k = 0; k < KINDS; k++) {
        double bytes = k == TRIAD ? TRIAD_BYTES_PER_ELEM : ADAM_BYTES_PER_PARAM;
        gbps[k] = bytes * bn->n / med_s[k] * 1e-9;
        gbps_lo[k] = bytes * bn->n / max_s[k] * 1e-9;
        gbps_hi[k] = bytes * bn->n / min_s[k] * 1e-9;
    }
    double adam_to_triad = gbps[ADAM_BEST] / gbps[TRIAD];
    double best_to_scalar = med_s[ADAM_SCALAR] / med_s[ADAM_BEST];
    // write-allocate reads counted too: triad 16 bytes per element, Adam 30 (param's line)
    double adam_to_triad_wa =
        adam_to_triad * (30.0 / ADAM_BYTES_PER_PARAM) / (16.0 / TRIAD_BYTES_PER_ELEM);
    const char *best = cpu_adam_path_name(cpu_adam_best_path());
    printf("{\"bench\": \"cpu_adam\", \"params\": %zu, \"threads\": %d, \"rounds\": %d, "
           "\"best_path\": \"%s\", \"measured\": \"median of interleaved rounds, one call each\", ",
           bn->n, bn->threads, bn->rounds, best);
    printf("\"triad\": {\"ms\": %.3f, \"gbps\": %.2f, \"gbps_min\": %.2f, \"gbps_max\": %.2f, "
           "\"bytes_per_element\": 12, \"write_allocate_counted\": false}, ",
           med_s[TRIAD] * 1e3, gbps[TRIAD], gbps_lo[TRIAD], gbps_hi[TRIAD]);
    for (int k = ADAM_BEST; k <= ADAM_SCALAR; k++)
        printf("\"%s\": {\"path\": \"%s\", \"ms\": %.3f, \"params_per_s\": %.4g, \"gbps\": %.2f, "
               "\"gbps_min\": %.2f, \"gbps_max\": %.2f, \"bytes_per_param\": 28}, ", KIND_NAMES[k],
               k == ADAM_BEST ? best : "scalar", med_s[k] * 1e3, bn->n / med_s[k], gbps[k], gbps_lo[k], gbps_hi[k]);
    printf("\"adam_to_triad\": %.3f, \"adam_to_triad_target\": %.2f, \"adam_to_triad_met\": %s, ",
           adam_to_triad, TARGET_ADAM_TO_TRIAD, yes_no(adam_to_triad >= TARGET_ADAM_TO_TRIAD));
    printf("\"best_to_scalar\": %.2f, \"best_to_scalar_target\": %.1f, \"best_to_scalar_met\": %s, ",
           best_to_scalar, TARGET_BEST_TO_SCALAR, yes_no(best_to_scalar >= TARGET_BEST_TO_SCALAR));
    printf("\"with_write_allocate\": {\"triad_bytes_per_element\": 16, \"adam_bytes_per_param\": 30, "
           "\"adam_to_triad\": %.3f}}\n", adam_to_triad_wa);
}

int main(int argc, char **argv) {
    Bench bn = {0};
    parse(argc, argv, &bn);
    bench_init(&bn);
    double med_s[KINDS], min_s[KINDS], max_s[KINDS];
    measure(&bn, med_s, min_s, max_s);
    print_json(&bn, med_s, min_s, max_s);
    bench_free(&bn);
    return 0;
}

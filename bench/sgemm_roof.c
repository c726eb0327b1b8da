// sgemm_roof.c: the fp32 GEMM roof of this machine, measured with OpenBLAS.
// The cpu device has no datasheet peak, so MFU on cpu is reported against
// this number: the best sgemm rate over a few large square sizes and the
// GPT-2 124M layer shapes (BT=1024 tokens, C=768).
//
// usage: sgemm_roof [threads]   (default: what OpenBLAS picked, i.e. all cores)
// prints one JSON object: {"sgemm_gflops": best, "by_shape": {...}, "threads": n, "core": the
// OpenBLAS kernels, "core_choice": how they were chosen (blas_core.h)}
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "blas_core.h"

typedef struct Shape {
    const char *name;
    int M, K, N;  // C (M,N) = A (M,K) @ B (K,N)
} Shape;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Best GFLOP/s over repeated runs: 2*M*N*K flops per call; runs for at least
// `min_s` seconds after one warm-up call, so page faults and thread start-up
// are not counted.
static double measure(const Shape *s, double min_s) {
    size_t a_n = (size_t)s->M * s->K, b_n = (size_t)s->K * s->N, c_n = (size_t)s->M * s->N;
    float *A = malloc(a_n * sizeof(float));
    float *B = malloc(b_n * sizeof(float));
    float *C = malloc(c_n * sizeof(float));
    if (!A || !B || !C) {
        fprintf(stderr, "sgemm_roof: out of memory for %s\n", s->name);
        exit(1);
    }
    for (size_t i = 0; i < a_n; i++) A[i] = (float)((i * 7919) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < b_n; i++) B[i] = (float)((i * 104729) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < c_n; i++) C[i] = 0.0f;
    double flops = 2.0 * s->M * s->N * s->K, best = 0.0;
    double t_end = now_s() + min_s;
    for (int rep = 0; rep == 0 || now_s() < t_end || rep < 3; rep++) {
        double t0 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->M, s->N, s->K, 1.0f, A, s->K,
                    B, s->N, 0.0f, C, s->N);
        double dt = now_s() - t0;
        if (rep > 0 && flops / dt > best) best = flops / dt;
    }
    free(A);
    free(B);
    free(C);
    return best * 1e-9;
}

int main(int argc, char **argv) {
    blas_core_choose(argv);  // the trainers' kernels: the roof is theirs
    if (argc > 1) {
        int n = atoi(argv[1]);
        if (n < 1) {
            fprintf(stderr, "sgemm_roof: threads must be a positive integer, got '%s'\n", argv[1]);
            return 2;
        }
        openblas_set_num_threads(n);
    }
    const Shape shapes[] = {
        {"1024", 1024, 1024, 1024},
        {"2048", 2048, 2048, 2048},
        {"3072", 3072, 3072, 3072},
        {"1024x768x3072", 1024, 768, 3072},  // GPT-2 124M fc: (BT,C) @ (C,4C)
        {"1024x3072x768", 1024, 3072, 768},  // fc projection: (BT,4C) @ (4C,C)
        {"1024x768x2304", 1024, 768, 2304},  // qkv: (BT,C) @ (C,3C)
    };
    int n_shapes = (int)(sizeof shapes / sizeof shapes[0]);
    double best = 0.0, by_shape[sizeof shapes / sizeof shapes[0]];
    for (int i = 0; i < n_shapes; i++) {
        by_shape[i] = measure(&shapes[i], 1.0);
        if (by_shape[i] > best) best = by_shape[i];
    }
    printf("{\"sgemm_gflops\": %.1f, \"by_shape\": {", best);
    for (int i = 0; i < n_shapes; i++)
        printf("%s\"%s\": %.1f", i ? ", " : "", shapes[i].name, by_shape[i]);
    char how[256];
    blas_core_describe(how, sizeof how);
    printf("}, \"threads\": %d, \"core\": \"%s\", \"core_choice\": \"%s\"}\n", openblas_get_num_threads(),
           blas_core_running(), how);
    return 0;
}

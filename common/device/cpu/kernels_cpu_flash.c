// kernels_cpu_flash.c: FlashAttention on the cpu device (flash_math.h has
// the math and the papers). One task per (batch, head), each on one thread,
// so every sum runs in a fixed order whatever the thread count. The tiles'
// products are single-threaded sgemms on FLASH_TILE x FLASH_TILE tiles of
// q, k, v read in place from qkv (B,T,3C) (head h of q at column h*hs, k at
// C + h*hs, v at 2C + h*hs, rows 3C apart); key tiles above the diagonal are
// skipped, half of the (T,T) products that the materialized kernel runs.
// A thread's scratch is two tiles and a row of T: no (T,T) matrix.
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "flash_math.h"
#include "kernels_cpu.h"

#define FT FLASH_TILE

// A thread's scratch in floats: two (FT,FT) tiles, the running max and sum
// of a query tile's rows (FT each), and the backward's D (T).
static size_t per_thread_floats(int T) { return 2 * (size_t)FT * FT + 2 * FT + (size_t)T; }

size_t flash_cpu_scratch_bytes(int threads, int T) { return (size_t)threads * per_thread_floats(T) * sizeof(float); }

static int tile_len(int at, int T) { return T - at < FT ? T - at : FT; }

// One query tile of one head: y rows [i0, i0 + rows) (stride C) and their lse.
static void forward_query_tile(float *y, float *lse, const float *q, const float *k, const float *v, int i0, int T,
                               int C, int hs, float *z, float *m, float *l) {
    int ld = 3 * C, rows = tile_len(i0, T);
    float scale = flash_scale(hs);
    for (int r = 0; r < rows; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        memset(y + (size_t)(i0 + r) * C, 0, (size_t)hs * sizeof(float));
    }
    for (int j0 = 0; j0 <= i0; j0 += FT) {
        int cols = tile_len(j0, T);
        // z (rows,cols) = scale q_i k_j^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, q + (size_t)i0 * ld, ld,
                    k + (size_t)j0 * ld, ld, 0.0f, z, FT);
        for (int r = 0; r < rows; r++) {
            float *zr = z + (size_t)r * FT, *yr = y + (size_t)(i0 + r) * C;
            int n = flash_visible(i0, r, j0, cols);
            float tile_max = -INFINITY, sum = 0.0f;
            for (int c = 0; c < n; c++) tile_max = zr[c] > tile_max ? zr[c] : tile_max;
            float m_new = flash_running_max(m[r], tile_max), corr = flash_rescale(m[r], m_new);
            for (int c = 0; c < n; c++) {
                zr[c] = expf(zr[c] - m_new);  // p~, unnormalized
                sum += zr[c];
            }
            for (int c = n; c < cols; c++) zr[c] = 0.0f;
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            for (int e = 0; e < hs; e++) yr[e] *= corr;
        }
        // y_i += p~ v_j
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, z, FT, v + (size_t)j0 * ld, ld,
                    1.0f, y + (size_t)i0 * C, C);
    }
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / l[r], *yr = y + (size_t)(i0 + r) * C;
        for (int e = 0; e < hs; e++) yr[e] *= inv;
        lse[i0 + r] = flash_lse(m[r], l[r]);
    }
}

void flash_attention_forward_cpu(Device *d, act *out_, float *lse, const act *qkv_, int B, int T, int C, int NH) {
    float *out = out_;        // (B,T,C)
    const float *qkv = qkv_;  // (B,T,3C)
    int hs = C / NH;
    float *scratch = device_scratch(d, flash_cpu_scratch_bytes(omp_get_max_threads(), T));
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *z = scratch + (size_t)omp_get_thread_num() * per_thread_floats(T), *m = z + 2 * FT * FT, *l = m + FT;
        const float *q = qkv + (size_t)b * T * 3 * C + h * hs;
        for (int i0 = 0; i0 < T; i0 += FT)
            forward_query_tile(out + (size_t)b * T * C + h * hs, lse + (size_t)bh * T, q, q + C, q + 2 * C, i0, T, C,
                               hs, z, m, l);
    }
}

// One (key tile j0, query tile i0) pair of one head's backward: p and dz
// recomputed in the two tiles, dq_i, dk_j and dv_j accumulated (stride 3C).
static void backward_pair(float *dq, float *dk, float *dv, const float *dy, const float *q, const float *k,
                          const float *v, const float *lse, const float *D, int i0, int j0, int T, int C, int hs,
                          float *p, float *dz) {
    int ld = 3 * C, rows = tile_len(i0, T), cols = tile_len(j0, T);
    float scale = flash_scale(hs);
    const float *qi = q + (size_t)i0 * ld, *kj = k + (size_t)j0 * ld, *vj = v + (size_t)j0 * ld;
    const float *dyi = dy + (size_t)i0 * C;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, qi, ld, kj, ld, 0.0f, p, FT);
    for (int r = 0; r < rows; r++) {
        float *pr = p + (size_t)r * FT;
        int n = flash_visible(i0, r, j0, cols);
        for (int c = 0; c < n; c++) pr[c] = flash_prob(pr[c], lse[i0 + r]);
        for (int c = n; c < cols; c++) pr[c] = 0.0f;
    }
    // dv_j += p^T dy_i;  dp (rows,cols) = dy_i v_j^T, then dz = p (dp - D)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, p, FT, dyi, C, 1.0f,
                dv + (size_t)j0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0f, dyi, C, vj, ld, 0.0f, dz, FT);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * FT + c;
            dz[i] = flash_dscore(p[i], dz[i], D[i0 + r]);
        }
    // dq_i += scale dz k_j;  dk_j += scale dz^T q_i
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale, dz, FT, kj, ld, 1.0f,
                dq + (size_t)i0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale, dz, FT, qi, ld, 1.0f,
                dk + (size_t)j0 * ld, ld);
}

void flash_attention_backward_cpu(Device *d, act *dqkv_, const act *dout_, const act *qkv_, const act *out_,
                                  const float *lse, int B, int T, int C, int NH) {
    float *dqkv = dqkv_;                             // (B,T,3C)
    const float *dout = dout_, *out = out_;          // (B,T,C)
    const float *qkv = qkv_;                         // (B,T,3C)
    int hs = C / NH;
    float *scratch = device_scratch(d, flash_cpu_scratch_bytes(omp_get_max_threads(), T));
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH;
        float *p = scratch + (size_t)omp_get_thread_num() * per_thread_floats(T), *dz = p + FT * FT;
        float *D = dz + FT * FT + 2 * FT;
        size_t off = (size_t)b * T * 3 * C + h * hs, row_off = (size_t)b * T * C + h * hs;
        const float *dy = dout + row_off, *y = out + row_off, *q = qkv + off;
        float *dq = dqkv + off;
        // D_t = dy_t . y_t
        for (int t = 0; t < T; t++) {
            float s = 0.0f;
            for (int e = 0; e < hs; e++) s += dy[(size_t)t * C + e] * y[(size_t)t * C + e];
            D[t] = s;
        }
        for (int t = 0; t < T; t++)
            for (int part = 0; part < 3; part++) memset(dq + (size_t)t * 3 * C + part * C, 0, hs * sizeof(float));
        // key tiles outer, the query tiles that see them inner (i0 >= j0)
        for (int j0 = 0; j0 < T; j0 += FT)
            for (int i0 = j0; i0 < T; i0 += FT)
                backward_pair(dq, dq + C, dq + 2 * C, dy, q, q + C, q + 2 * C, lse + (size_t)bh * T, D, i0, j0, T, C,
                              hs, p, dz);
    }
}

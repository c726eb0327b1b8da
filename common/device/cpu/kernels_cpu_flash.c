// kernels_cpu_flash.c: FlashAttention on the cpu device (flash_math.h has
// the math and the papers). One task per (batch, head), each on one thread,
// so every sum runs in a fixed order whatever the thread count. The tiles'
// products are single-threaded sgemms on FLASH_TILE x FLASH_TILE tiles of
// q, k, v read in place from qkv (B,T,3C) (head h of q at column h*hs, k at
// C + h*hs, v at 2C + h*hs, rows 3C apart); key tiles above the diagonal are
// skipped, half of the (T,T) products that the materialized kernel runs.
// A thread's scratch is two tiles and a row of T: no (T,T) matrix. The
// same loops run ring attention's blocks (kernels.h's FlashBlock): one
// chunk's query rows against another's keys, with their own strides, the
// diagonal chunk causal and a chunk before it whole; the whole attention is
// the block of qkv against itself.
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

// One head of one sequence in a FlashBlock: its q, k, v, and its rows of
// the output (or its gradient) and of lse.
typedef struct Head {
    const float *q, *k, *v;
    size_t q_ld, kv_ld, o_ld;
    int Tq, Tk, causal;
    size_t o, kv;  // element offsets of the head's output rows and key rows (y, dy; dk, dv)
    size_t lse;    // of its lse row
    size_t dq_ld;  // backward: dq's rows (o_ld in a block; q's own in qkv's gradient)
} Head;

static Head head_of(const FlashBlock *f, int bh) {
    int b = bh / f->NH, h = bh % f->NH;
    size_t col = (size_t)h * f->hs, kv = b * f->kv_bs + col;
    Head x = {(const float *)f->q + b * f->q_bs + col, (const float *)f->k + kv, (const float *)f->v + kv,
              f->q_ld, f->kv_ld, f->o_ld, f->Tq, f->Tk, f->causal, b * f->o_bs + col, kv, (size_t)bh * f->lse_bs,
              f->o_ld};
    return x;
}

// Keys of key tile j0 that row r of query tile i0 sees
static int visible(const Head *x, int i0, int r, int j0, int cols) {
    return x->causal ? flash_visible(i0, r, j0, cols) : cols;
}

// One query tile of one head: y rows [i0, i0 + rows) and their lse, merged
// with what they hold (merge) or afresh.
static void forward_query_tile(const Head *x, float *y, float *lse, int merge, int hs, int i0, float *z, float *m,
                               float *l) {
    int rows = tile_len(i0, x->Tq), last = x->causal ? i0 : x->Tk - 1;
    float scale = flash_scale(hs);
    for (int r = 0; r < rows; r++) {
        m[r] = flash_merge_start_max(merge, lse + i0 + r), l[r] = flash_merge_start_sum(merge);
        if (!merge) memset(y + (size_t)(i0 + r) * x->o_ld, 0, (size_t)hs * sizeof(float));
    }
    for (int j0 = 0; j0 <= last; j0 += FT) {
        int cols = tile_len(j0, x->Tk);
        // z (rows,cols) = scale q_i k_j^T
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, x->q + (size_t)i0 * x->q_ld,
                    (int)x->q_ld, x->k + (size_t)j0 * x->kv_ld, (int)x->kv_ld, 0.0f, z, FT);
        for (int r = 0; r < rows; r++) {
            float *zr = z + (size_t)r * FT, *yr = y + (size_t)(i0 + r) * x->o_ld;
            int n = visible(x, i0, r, j0, cols);
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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, 1.0f, z, FT,
                    x->v + (size_t)j0 * x->kv_ld, (int)x->kv_ld, 1.0f, y + (size_t)i0 * x->o_ld, (int)x->o_ld);
    }
    for (int r = 0; r < rows; r++) {
        float inv = 1.0f / l[r], *yr = y + (size_t)(i0 + r) * x->o_ld;
        for (int e = 0; e < hs; e++) yr[e] *= inv;
        lse[i0 + r] = flash_lse(m[r], l[r]);
    }
}

void flash_block_forward_cpu(Device *d, const FlashBlock *f, float *y, float *lse, int merge) {
    float *scratch = device_scratch(d, flash_cpu_scratch_bytes(omp_get_max_threads(), f->Tq));
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < f->B * f->NH; bh++) {
        float *z = scratch + (size_t)omp_get_thread_num() * per_thread_floats(f->Tq), *m = z + 2 * FT * FT, *l = m + FT;
        Head x = head_of(f, bh);
        for (int i0 = 0; i0 < f->Tq; i0 += FT)
            forward_query_tile(&x, y + x.o, lse + x.lse, merge, f->hs, i0, z, m, l);
    }
}

// The whole causal attention of qkv (B,T,3C) as one block: q, k, v read in
// place, rows 3C apart.
static FlashBlock whole_block(const act *qkv, int B, int T, int C, int NH) {
    size_t ld = 3 * (size_t)C;
    FlashBlock f = {B, NH, C / NH, T, T, 1, qkv, (const float *)qkv + C, (const float *)qkv + 2 * C,
                    ld, T * ld, ld, T * ld, (size_t)C, (size_t)T * C, (size_t)T};
    return f;
}

void flash_attention_forward_cpu(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, int NH) {
    FlashBlock f = whole_block(qkv, B, T, C, NH);
    flash_block_forward_cpu(d, &f, out, lse, 0);
}

// One (key tile j0, query tile i0) pair of one head's backward: p and dz
// recomputed in the two tiles, dq_i (o strides), dk_j and dv_j (k's) accumulated.
static void backward_pair(const Head *x, float *dq, float *dk, float *dv, const float *dy, const float *lse,
                          const float *D, int hs, int i0, int j0, float *p, float *dz) {
    int rows = tile_len(i0, x->Tq), cols = tile_len(j0, x->Tk), ld = (int)x->kv_ld, old = (int)x->o_ld;
    float scale = flash_scale(hs);
    const float *qi = x->q + (size_t)i0 * x->q_ld, *kj = x->k + (size_t)j0 * ld, *vj = x->v + (size_t)j0 * ld;
    const float *dyi = dy + (size_t)i0 * old;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, scale, qi, (int)x->q_ld, kj, ld, 0.0f, p,
                FT);
    for (int r = 0; r < rows; r++) {
        float *pr = p + (size_t)r * FT;
        int n = visible(x, i0, r, j0, cols);
        for (int c = 0; c < n; c++) pr[c] = flash_prob(pr[c], lse[i0 + r]);
        for (int c = n; c < cols; c++) pr[c] = 0.0f;
    }
    // dv_j += p^T dy_i;  dp (rows,cols) = dy_i v_j^T, then dz = p (dp - D)
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, 1.0f, p, FT, dyi, old, 1.0f,
                dv + (size_t)j0 * ld, ld);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, hs, 1.0f, dyi, old, vj, ld, 0.0f, dz, FT);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * FT + c;
            dz[i] = flash_dscore(p[i], dz[i], D[i0 + r]);
        }
    // dq_i += scale dz k_j;  dk_j += scale dz^T q_i
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hs, cols, scale, dz, FT, kj, ld, 1.0f,
                dq + (size_t)i0 * x->dq_ld, (int)x->dq_ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, hs, rows, scale, dz, FT, qi, (int)x->q_ld, 1.0f,
                dk + (size_t)j0 * ld, ld);
}
// One head's rows of D_t = dy_t . y_t
static void rows_d(float *D, const float *dy, const float *y, size_t ld, int T, int hs) {
    for (int t = 0; t < T; t++) {
        float s = 0.0f;
        for (int e = 0; e < hs; e++) s += dy[(size_t)t * ld + e] * y[(size_t)t * ld + e];
        D[t] = s;
    }
}

// The backward of a block: dq (its own strides, dq_ld and dq_bs), dk and dv
// (k's) accumulated, or zeroed first (zero: the whole attention's gradient).
static void block_backward(Device *d, const FlashBlock *f, const float *y, const float *dy, const float *lse,
                           float *dq, size_t dq_ld, size_t dq_bs, float *dk, float *dv, int zero) {
    int hs = f->hs;
    float *scratch = device_scratch(d, flash_cpu_scratch_bytes(omp_get_max_threads(), f->Tq));
#pragma omp parallel for schedule(static) if (blas_single_threaded())
    for (int bh = 0; bh < f->B * f->NH; bh++) {
        float *p = scratch + (size_t)omp_get_thread_num() * per_thread_floats(f->Tq), *dz = p + FT * FT;
        float *D = dz + FT * FT + 2 * FT;
        Head x = head_of(f, bh);
        x.dq_ld = dq_ld;
        float *dqh = dq + bh / f->NH * dq_bs + (size_t)(bh % f->NH) * hs, *dkh = dk + x.kv, *dvh = dv + x.kv;
        rows_d(D, dy + x.o, y + x.o, x.o_ld, f->Tq, hs);
        if (zero) {
            for (int t = 0; t < f->Tq; t++) memset(dqh + (size_t)t * dq_ld, 0, (size_t)hs * sizeof(float));
            for (int s = 0; s < f->Tk; s++) {
                memset(dkh + (size_t)s * x.kv_ld, 0, (size_t)hs * sizeof(float));
                memset(dvh + (size_t)s * x.kv_ld, 0, (size_t)hs * sizeof(float));
            }
        }
        // key tiles outer, the query tiles that see them inner (causal: i0 >= j0)
        for (int j0 = 0; j0 < f->Tk; j0 += FT)
            for (int i0 = f->causal ? j0 : 0; i0 < f->Tq; i0 += FT)
                backward_pair(&x, dqh, dkh, dvh, dy + x.o, lse + x.lse, D, hs, i0, j0, p, dz);
    }
}

void flash_attention_backward_cpu(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out,
                                  const float *lse, int B, int T, int C, int NH) {
    FlashBlock f = whole_block(qkv, B, T, C, NH);
    float *dq = dqkv;
    block_backward(d, &f, out, dout, lse, dq, f.q_ld, f.q_bs, dq + C, dq + 2 * C, 1);
}

void flash_block_backward_cpu(Device *d, const FlashBlock *f, const act *y, const act *dy, const float *lse,
                              float *dq, float *dk, float *dv) {
    block_backward(d, f, y, dy, lse, dq, f->o_ld, f->o_bs, dk, dv, 0);
}

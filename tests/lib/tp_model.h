// tp_model.h: what the tensor-parallel model tests share (test_tp.c,
// test_tp3.c): a model of one rank's tp part (or the whole model, tp 1) with
// bf16 params from the shared initial values and fp32 gradients added by the
// tests' walk; a forward and backward of one micro-batch; the part's gradients
// placed at their whole-model indices; checks against the whole model.
#pragma once
#define TEST_WITH_MPI
#include "testutil.h"
#include "bf16.h"
#include "check.h"
#include "comm.h"
#include "gpt.h"
#include "model_walk.h"

typedef struct TPFixture {
    Comm world;  // the tp group
    Device dev;
} TPFixture;

// MPI, the cpu device (its share of the cores) and the world as the tp
// group; a usage error unless `ranks` ranks run.
static inline void tpm_setup(TPFixture *f, int *argc, char ***argv, int ranks) {
    int local_rank, local_size;
    comm_world_init(&f->world, argc, argv, &local_rank, &local_size, 0);
    DeviceOptions opt = {.kind = "cpu", .local_rank = local_rank, .local_size = local_size};
    device_init(&f->dev, &opt);
    comm_setup(&f->world, &f->dev, "auto", NULL);
    if (f->world.size != ranks) fail_usage("this test runs on %d ranks (mpirun -np %d), not %d", ranks, ranks, f->world.size);
}

static inline void tpm_teardown(TPFixture *f) {
    device_destroy(&f->dev);
    comm_world_finalize(&f->world);
}

typedef struct TPModel {
    GPTLayout l;
    bf16 *params;  // this layout's Ψ
    float *grads;  // fp32, added to by the backward walk
} TPModel;

// GPT-2's initial values times `scale` (larger weights, larger gradients),
// plus a jitter of up to 0.02 drawn from the whole-model index, so biases
// are not all zero and layernorm gains not all one; padding rows stay zero.
static inline void tpm_init(TPModel *m, const GPTConfig *cfg, int tp, int rank, float scale) {
    gpt_layout_tp(&m->l, cfg, tp, rank);
    size_t n = m->l.num_params;
    float *init = malloc(n * sizeof(float));
    gpt_init_values(&m->l, 21, 0, n, init);
    m->params = malloc(n * sizeof(bf16));
    m->grads = calloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) {
        size_t g = gpt_global_index(&m->l, i);
        uint64_t s = (uint64_t)g * 0x9E3779B97F4A7C15ull + 1;
        float jitter = g == GPT_PADDING ? 0.0f : test_uniform(&s, -0.02f, 0.02f);
        m->params[i] = f32_to_bf16(init[i] * scale + jitter);
    }
    free(init);
}

static inline void tpm_free(TPModel *m) {
    free(m->params);
    free(m->grads);
}

static inline double tpm_loss(Device *d, TPModel *m, Comm *tp, int B, int T, const int32_t *in, const int32_t *tgt) {
    GPT g;
    GPTPlan p = gpt_plan_whole(&m->l, B, T);
    gpt_alloc(&g, &m->l, d, &p, tp);
    double loss = walk_loss(&g, m->params, in, tgt, 0.0f);
    gpt_free(&g);
    return loss;
}

// Forward and backward of one micro-batch; grads hold its gradients after.
static inline double tpm_step(Device *d, TPModel *m, Comm *tp, int B, int T, const int32_t *in, const int32_t *tgt) {
    GPT g;
    GPTPlan p = gpt_plan_whole(&m->l, B, T);
    gpt_alloc(&g, &m->l, d, &p, tp);
    memset(m->grads, 0, m->l.num_params * sizeof(float));
    double loss = walk_loss(&g, m->params, in, tgt, 1.0f / (B * T));
    walk_backward(&g, m->params, m->grads, 0);
    gpt_free(&g);
    return loss;
}

// The group's gradients at whole-model indices (whole_n of them), on every
// rank: split tensors from the rank that holds them, replicated ones from tp
// rank 0, summed over the group (one value and zeros: exact).
static inline float *tpm_gather(TPModel *m, Comm *tp, size_t whole_n) {
    float *full = calloc(whole_n, sizeof(float));
    Range rep[GPT_MAX_UNITS * 2 + 1];
    int nrep = gpt_replicated_ranges(&m->l, rep, GPT_MAX_UNITS * 2 + 1);
    for (size_t i = 0, k = 0; i < m->l.num_params; i++) {
        while (k < (size_t)nrep && i >= rep[k].offset + rep[k].count) k++;
        int replicated = k < (size_t)nrep && i >= rep[k].offset;
        size_t g = gpt_global_index(&m->l, i);
        if (g != GPT_PADDING && (!replicated || m->l.tp_rank == 0)) full[g] = m->grads[i];
    }
    MPI_Allreduce(MPI_IN_PLACE, full, (int)whole_n, MPI_FLOAT, MPI_SUM, tp->mpi);
    return full;
}

// 1 on every rank of c when ok is 1 on every rank
static inline int tpm_all(Comm *c, int ok) {
    int all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->mpi);
    return all;
}

// Are the replicated tensors' gradients (and the loss) the same bits on every rank of the group?
static inline int tpm_replicated_agree(TPModel *m, Comm *tp, double loss) {
    Range rep[GPT_MAX_UNITS * 2 + 1];
    int nrep = gpt_replicated_ranges(&m->l, rep, GPT_MAX_UNITS * 2 + 1), ok = 1;
    for (int k = 0; k < nrep; k++) {
        float *mine = m->grads + rep[k].offset, *root = malloc(rep[k].count * sizeof(float));
        memcpy(root, mine, rep[k].count * sizeof(float));
        MPI_Bcast(root, (int)rep[k].count, MPI_FLOAT, 0, tp->mpi);
        ok &= memcmp(root, mine, rep[k].count * sizeof(float)) == 0;
        free(root);
    }
    double root_loss = loss;
    MPI_Bcast(&root_loss, 1, MPI_DOUBLE, 0, tp->mpi);
    return ok && memcmp(&root_loss, &loss, sizeof loss) == 0;
}

// Gradients of every tensor within atol_of_max * (the tensor's largest |whole|) + rtol |whole|.
static inline int tpm_grads_close(const GPTLayout *whole, const float *got, const float *want, double atol_of_max,
                                  double rtol, const char *what) {
    int bad = 0;
    for (int u = 0; u < whole->num_units; u++) {
        int nt = u == 0 ? EMB_NTENSORS : u == gpt_unit_head(whole) ? HEAD_NTENSORS : BLK_NTENSORS;
        const size_t *off = u == 0 ? whole->emb_off : u == gpt_unit_head(whole) ? whole->head_off : whole->blk_off;
        for (int t = 0; t < nt; t++) {
            size_t lo = whole->unit[u].offset + off[t], hi = whole->unit[u].offset + off[t + 1];
            double maxabs = 0;
            for (size_t i = lo; i < hi; i++) maxabs = fmax(maxabs, fabs(want[i]));
            for (size_t i = lo; i < hi; i++)
                if (!test_close(got[i], want[i], atol_of_max * maxabs, rtol) && bad++ < 5)
                    print_message("%s: unit %d tensor %d element %zu: tp %.9g, whole %.9g (max %.3g)\n", what, u,
                                  t, i - lo, got[i], want[i], maxabs);
        }
    }
    return bad == 0;
}

static inline void tpm_tokens(int32_t *in, int32_t *tgt, int n, int V, uint64_t seed) {
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        in[i] = (int32_t)(test_rng_next(&s) % V);
        tgt[i] = (int32_t)(test_rng_next(&s) % V);
    }
}

// One micro-batch at tp = the group's size against the whole model (see
// test_tp.c for the tolerances: loss 2e-6, gradients 2e-5 of their tensor's
// largest); the replicated gradients and the loss the same bits on every
// rank; no gradient on wte's padding rows. The verdict of every rank.
static inline int tpm_matches_whole(Device *d, Comm *c, const GPTConfig *cfg, int B, int T) {
    int32_t *in = malloc(B * T * sizeof(int32_t)), *tgt = malloc(B * T * sizeof(int32_t));
    tpm_tokens(in, tgt, B * T, cfg->vocab_size, 3);
    TPModel whole, part;
    tpm_init(&whole, cfg, 1, 0, 1.0f);
    tpm_init(&part, cfg, c->size, c->rank, 1.0f);
    double want = tpm_step(d, &whole, NULL, B, T, in, tgt);
    double got = tpm_step(d, &part, c, B, T, in, tgt);
    float *full = tpm_gather(&part, c, whole.l.num_params);
    int ok = fabs(got - want) <= 2e-6;
    if (!ok) print_message("loss: tp %.9g, whole %.9g\n", got, want);
    ok &= tpm_grads_close(&whole.l, full, whole.grads, 2e-5, 0.0, "gradient");
    ok &= tpm_replicated_agree(&part, c, got);
    for (size_t i = 0; i < part.l.num_params; i++)  // padding rows of wte past the whole model's
        if (gpt_global_index(&part.l, i) == GPT_PADDING) ok &= part.grads[i] == 0.0f;
    size_t C = (size_t)cfg->channels;  // the whole model's padding rows (V rounded up to 128)
    for (size_t i = (size_t)cfg->vocab_size * C; i < whole.l.emb_off[EMB_WTE + 1]; i++)
        ok &= whole.grads[i] == 0.0f && full[i] == 0.0f;
    free(full), free(in), free(tgt);
    tpm_free(&whole);
    tpm_free(&part);
    return tpm_all(c, ok);
}

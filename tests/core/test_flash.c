// test_flash.c: FlashAttention on the cpu device (kernels_cpu_flash.c)
// against attention in double precision straight from its definition, and
// against the materialized kernel it replaces:
// - the output and each row's log-sum-exp, at T below, at and across the
//   tile (odd T, T not a multiple of FLASH_TILE), head sizes 4 to 128;
// - the backward against the materialized kernel's, and against central
//   finite differences of the forward;
// - causality, the same bits whatever the thread count, and no (T,T)
//   scratch;
// - ring attention's blocks (FlashBlock: one chunk's queries against
//   another chunk's keys, merged through their log-sum-exp, the gradients
//   summed over the blocks) give the whole attention and its gradients;
// - a planted bug of each kind (a running maximum that forgets earlier
//   tiles, a missing rescale of what a row summed, a causal mask off by one:
//   tests/core/flash_plants.h, built into copies of the kernel) is caught by
//   the same checks.
#include <omp.h>
#include "testutil.h"
#include "flash_math.h"
#include "kernels.h"

// the planted copies (Makefile: one object each)
#define PLANT_DECL(name)                                                                                   \
    void flash_forward_plant_##name(Device *d, act *out, float *lse, const act *qkv, int B, int T, int C, \
                                    int NH);                                                               \
    void flash_backward_plant_##name(Device *d, act *dqkv, const act *dout, const act *qkv, const act *out, \
                                     const float *lse, int B, int T, int C, int NH);
PLANT_DECL(running_max)
PLANT_DECL(rescale)
PLANT_DECL(mask)

typedef void (*ForwardFn)(Device *, act *, float *, const act *, int, int, int, int);
typedef void (*BackwardFn)(Device *, act *, const act *, const act *, const act *, const float *, int, int, int,
                           int);

typedef struct Shape {
    int B, T, C, NH;
    float range;  // q, k, v drawn in [-range, range]
    int spike;    // q and the first tile's keys all 4: scores of 16 sqrt(hs) there, near 0 after
} Shape;

// below a tile, odd; one tile plus one; exactly a tile; three tiles, the
// last partial; head size 128; scores of 128 in the first tile, whose exp
// overflows fp32 unless each row's maximum is taken out first
static const Shape shapes[] = {
    {2, 7, 12, 3, 2, 0}, {1, 37, 48, 3, 2, 0}, {1, FLASH_TILE + 1, 32, 1, 2, 0}, {1, FLASH_TILE, 64, 2, 2, 0},
    {2, 2 * FLASH_TILE + 2, 128, 2, 2, 0}, {1, 200, 256, 2, 2, 0}, {1, 2 * FLASH_TILE + 5, 128, 2, 0.5f, 1},
};
#define NSHAPES (int)(sizeof shapes / sizeof shapes[0])

typedef struct Case {
    Shape s;
    size_t n, nqkv, nrows;  // B*T*C, 3x that, B*NH*T
    float *qkv, *out, *lse, *R, *dqkv;
} Case;

static Case case_new(Shape s, uint64_t seed) {
    Case c = {.s = s};
    c.n = (size_t)s.B * s.T * s.C, c.nqkv = 3 * c.n, c.nrows = (size_t)s.B * s.NH * s.T;
    c.qkv = malloc(c.nqkv * sizeof(float)), c.out = malloc(c.n * sizeof(float));
    c.lse = malloc(c.nrows * sizeof(float)), c.R = malloc(c.n * sizeof(float));
    c.dqkv = malloc(c.nqkv * sizeof(float));
    // scores of a few units: a row's maximum moves as its tiles arrive
    test_fill(c.qkv, c.nqkv, seed, -s.range, s.range);
    for (int bt = 0; s.spike && bt < s.B * s.T; bt++)
        for (int e = 0; e < s.C; e++) {
            c.qkv[(size_t)bt * 3 * s.C + e] = 4;                                        // q
            if (bt % s.T < FLASH_TILE) c.qkv[(size_t)bt * 3 * s.C + s.C + e] = 4;      // k of the first tile
        }
    test_fill(c.R, c.n, seed + 1, -1, 1);
    return c;
}

static void case_free(Case *c) { free(c->qkv), free(c->out), free(c->lse), free(c->R), free(c->dqkv); }

// out (B,T,C) and lse (B,NH,T) in double from the definition
static void reference(const Case *c, double *out, double *lse) {
    int B = c->s.B, T = c->s.T, C = c->s.C, NH = c->s.NH, hs = C / NH;
    double *z = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *q = c->qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0;
                for (int s = 0; s <= t; s++) {
                    const float *k = c->qkv + ((size_t)b * T + s) * 3 * C + C + h * hs;
                    double dot = 0;
                    for (int e = 0; e < hs; e++) dot += (double)q[e] * k[e];
                    z[s] = dot / sqrt((double)hs);
                    m = z[s] > m ? z[s] : m;
                }
                for (int s = 0; s <= t; s++) sum += exp(z[s] - m);
                lse[((size_t)b * NH + h) * T + t] = m + log(sum);
                for (int e = 0; e < hs; e++) {
                    double y = 0;
                    for (int s = 0; s <= t; s++)
                        y += exp(z[s] - m) / sum * c->qkv[((size_t)b * T + s) * 3 * C + 2 * C + h * hs + e];
                    out[((size_t)b * T + t) * C + h * hs + e] = y;
                }
            }
    free(z);
}

static int count_far(const float *got, const double *want, size_t n, double tol, const char *what) {
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol * (1 + fabs(want[i]))))
            if (bad++ < 3) print_message("%s[%zu]: kernel %.7g, reference %.7g\n", what, i, got[i], want[i]);
    return bad;
}

// Elements of the forward (out and lse) that stray from the reference.
static int forward_errors(Device *d, ForwardFn fwd, Case *c) {
    double *out = malloc(c->n * sizeof(double)), *lse = malloc(c->nrows * sizeof(double));
    for (size_t i = 0; i < c->nrows; i++) c->lse[i] = NAN;
    fwd(d, c->out, c->lse, c->qkv, c->s.B, c->s.T, c->s.C, c->s.NH);
    reference(c, out, lse);
    int bad = count_far(c->out, out, c->n, 2e-5, "out") + count_far(c->lse, lse, c->nrows, 2e-5, "lse");
    free(out), free(lse);
    return bad;
}

// Elements of dqkv that stray from the materialized kernel's gradient.
static int backward_errors(Device *d, ForwardFn fwd, BackwardFn bwd, Case *c) {
    const Shape *s = &c->s;
    float *att = malloc((size_t)s->B * s->NH * s->T * s->T * sizeof(float)), *y = malloc(c->n * sizeof(float));
    float *want_f = malloc(c->nqkv * sizeof(float));
    double *want = malloc(c->nqkv * sizeof(double)), top = 0;
    d->k->attention_forward(d, y, att, c->qkv, s->B, s->T, s->C, s->NH);
    d->k->attention_backward(d, want_f, c->R, c->qkv, att, s->B, s->T, s->C, s->NH);
    for (size_t i = 0; i < c->nqkv; i++) want[i] = want_f[i], top = fmax(top, fabs(want_f[i]));
    fwd(d, c->out, c->lse, c->qkv, s->B, s->T, s->C, s->NH);
    for (size_t i = 0; i < c->nqkv; i++) c->dqkv[i] = NAN;  // overwritten
    bwd(d, c->dqkv, c->R, c->qkv, c->out, c->lse, s->B, s->T, s->C, s->NH);
    // fp32 both, summed in other orders: a few ulps of the largest gradient
    int bad = 0;
    for (size_t i = 0; i < c->nqkv; i++)
        if (!(fabs(c->dqkv[i] - want[i]) <= 1e-5 * top + 1e-5 * fabs(want[i])))
            if (bad++ < 3) print_message("dqkv[%zu]: flash %.7g, materialized %.7g\n", i, c->dqkv[i], want[i]);
    free(att), free(y), free(want_f), free(want);
    return bad;
}

// ---- ring attention's blocks ----

// Query chunk i against key chunk j of qkv (B,T,3C) cut into chunks of Tc:
// the diagonal causal; y, dq (B,T,C) and lse (B,NH,T) of the whole sequence.
static FlashBlock ring_block(const Case *c, int Tc, int i, int j) {
    const Shape *s = &c->s;
    size_t ld = 3 * (size_t)s->C, q0 = (size_t)i * Tc * ld, k0 = (size_t)j * Tc * ld;
    FlashBlock f = {s->B, s->NH, s->C / s->NH, Tc, Tc, i == j, c->qkv + q0, c->qkv + k0 + s->C,
                    c->qkv + k0 + 2 * s->C, ld, s->T * ld, ld, s->T * ld, (size_t)s->C, (size_t)s->T * s->C,
                    (size_t)s->T};
    return f;
}

// The key chunks query chunk i meets, in the order of the ring: over P
// ranks (2P chunks), chunk i's rank r (i or 2P-1-i) holds at step s the
// chunks of rank (r - s) mod P; those after i are skipped.
static int ring_order(int P, int i, int *keys) {
    int r = i < P ? i : 2 * P - 1 - i, n = 0;
    for (int step = 0; step < P; step++) {
        int src = (r - step + P) % P, pair[2] = {src, 2 * P - 1 - src};
        for (int e = 0; e < 2; e++)
            if (pair[e] <= i) keys[n++] = pair[e];
    }
    return n;
}

// Over P = 2 and 3 ranks: every query chunk's output and lse, merged over
// its key chunks in the ring's order, equal the whole attention's (2e-5, as
// the forward against the reference), and the gradients summed over the
// blocks equal the whole backward's (1e-5 of the largest, as the backward
// against the materialized kernel).
static void test_ring_blocks_equal_whole(void **state) {
    Device *d = *state;
    const int P[2] = {2, 3}, Tc[2] = {FLASH_TILE + 3, 9};
    for (int k = 0; k < 2; k++) {
        Case c = case_new((Shape){2, 2 * P[k] * Tc[k], 48, 3, 2, 0}, 80 + k);
        d->k->flash_attention_forward(d, c.out, c.lse, c.qkv, c.s.B, c.s.T, c.s.C, c.s.NH);
        d->k->flash_attention_backward(d, c.dqkv, c.R, c.qkv, c.out, c.lse, c.s.B, c.s.T, c.s.C, c.s.NH);
        float *y = calloc(c.n, sizeof(float)), *lse = calloc(c.nrows, sizeof(float));
        float *dq = calloc(c.n, sizeof(float)), *dkv = calloc(c.nqkv, sizeof(float));
        for (int i = 0; i < 2 * P[k]; i++) {
            int keys[8], n = ring_order(P[k], i, keys);
            size_t o = (size_t)i * Tc[k] * c.s.C;
            for (int m = 0; m < n; m++) {
                FlashBlock f = ring_block(&c, Tc[k], i, keys[m]);
                d->k->flash_block_forward(d, &f, y + o, lse + (size_t)i * Tc[k], m > 0);
            }
        }
        for (int i = 0; i < 2 * P[k]; i++) {
            int keys[8], n = ring_order(P[k], i, keys);
            size_t o = (size_t)i * Tc[k] * c.s.C;
            for (int m = 0; m < n; m++) {
                FlashBlock f = ring_block(&c, Tc[k], i, keys[m]);
                size_t k0 = (size_t)keys[m] * Tc[k] * 3 * c.s.C;
                d->k->flash_block_backward(d, &f, c.out + o, c.R + o, c.lse + (size_t)i * Tc[k], dq + o,
                                           dkv + k0 + c.s.C, dkv + k0 + 2 * c.s.C);
            }
        }
        double *want = malloc(c.nqkv * sizeof(double)), top = 0;
        for (size_t x = 0; x < c.n; x++) want[x] = c.out[x];
        int bad = count_far(y, want, c.n, 2e-5, "ring y");
        for (size_t x = 0; x < c.nrows; x++) want[x] = c.lse[x];
        bad += count_far(lse, want, c.nrows, 2e-5, "ring lse");
        for (size_t x = 0; x < c.nqkv; x++) top = fmax(top, fabs(c.dqkv[x]));
        for (size_t bt = 0; bt < (size_t)c.s.B * c.s.T; bt++)
            for (int e = 0; e < c.s.C; e++) dkv[bt * 3 * c.s.C + e] = dq[bt * c.s.C + e];  // dq in q's columns
        for (size_t x = 0; x < c.nqkv; x++)
            if (!(fabs(dkv[x] - c.dqkv[x]) <= 1e-5 * top + 1e-5 * fabs(c.dqkv[x])))
                if (bad++ < 3) print_message("dqkv[%zu]: ring %.7g, whole %.7g\n", x, dkv[x], c.dqkv[x]);
        if (bad) fail_msg("ring over %d ranks (chunks of %d): %d elements off the whole attention's", P[k], Tc[k], bad);
        free(y), free(lse), free(dq), free(dkv), free(want);
        case_free(&c);
    }
}

static void test_forward_against_reference(void **state) {
    Device *d = *state;
    for (int i = 0; i < NSHAPES; i++) {
        Case c = case_new(shapes[i], 40 + i);
        int bad = forward_errors(d, d->k->flash_attention_forward, &c);
        if (bad) fail_msg("B %d T %d C %d NH %d: %d elements off", c.s.B, c.s.T, c.s.C, c.s.NH, bad);
        case_free(&c);
    }
}

static void test_backward_against_materialized(void **state) {
    Device *d = *state;
    for (int i = 0; i < NSHAPES; i++) {
        Case c = case_new(shapes[i], 50 + i);
        int bad = backward_errors(d, d->k->flash_attention_forward, d->k->flash_attention_backward, &c);
        if (bad) fail_msg("B %d T %d C %d NH %d: %d gradient elements off", c.s.B, c.s.T, c.s.C, c.s.NH, bad);
        case_free(&c);
    }
}

// L = sum(out * R), so dL/dout = R; dL/dqkv[i] against (L(x + h) - L(x - h)) / 2h.
static double objective(Device *d, Case *c) {
    d->k->flash_attention_forward(d, c->out, c->lse, c->qkv, c->s.B, c->s.T, c->s.C, c->s.NH);
    double l = 0;
    for (size_t i = 0; i < c->n; i++) l += (double)c->out[i] * c->R[i];
    return l;
}

static void test_backward_finite_differences(void **state) {
    Device *d = *state;
    const Shape small[] = {{2, 7, 12, 3, 2, 0}, {1, FLASH_TILE + 3, 8, 2, 2, 0}};  // within a tile, across two
    for (int k = 0; k < 2; k++) {
        Case c = case_new(small[k], 60 + k);
        objective(d, &c);
        d->k->flash_attention_backward(d, c.dqkv, c.R, c.qkv, c.out, c.lse, c.s.B, c.s.T, c.s.C, c.s.NH);
        int bad = 0;
        for (size_t i = 0; i < c.nqkv; i++) {
            float x0 = c.qkv[i], h = 1e-2f;
            c.qkv[i] = x0 + h;
            double lp = objective(d, &c);
            c.qkv[i] = x0 - h;
            double lm = objective(d, &c);
            c.qkv[i] = x0;
            double fd = (lp - lm) / (2.0 * h);
            // rounding ~ 1e-7 |L| / h and the softmax's curvature ~ h^2: as test_kernels' materialized check
            if (!test_close(c.dqkv[i], fd, 1e-3, 1e-2) && bad++ < 3)
                print_message("dqkv[%zu]: kernel %.7g, finite difference %.7g\n", i, c.dqkv[i], fd);
        }
        if (bad) fail_msg("T %d: %d elements off their finite difference", c.s.T, bad);
        case_free(&c);
    }
}

// Changing token t's k and v leaves every output before t bit-identical.
static void test_causal(void **state) {
    Device *d = *state;
    Case c = case_new((Shape){2, FLASH_TILE + 9, 16, 2, 2, 0}, 70);
    int t_future = FLASH_TILE + 2;
    objective(d, &c);
    float *before = malloc(c.n * sizeof(float));
    memcpy(before, c.out, c.n * sizeof(float));
    for (int b = 0; b < c.s.B; b++)
        for (int i = c.s.C; i < 3 * c.s.C; i++) c.qkv[((size_t)b * c.s.T + t_future) * 3 * c.s.C + i] += 0.5f;
    objective(d, &c);
    for (int b = 0; b < c.s.B; b++)
        assert_memory_equal(c.out + (size_t)b * c.s.T * c.s.C, before + (size_t)b * c.s.T * c.s.C,
                            (size_t)t_future * c.s.C * sizeof(float));
    free(before);
    case_free(&c);
}

// One head per thread, each summing in its own fixed order: the thread count
// changes no bit; and the scratch it asks for holds no (T,T) matrix.
static void test_same_bits_any_threads_no_tt_scratch(void **state) {
    Device *d = *state;
    Shape s = {2, 3 * FLASH_TILE + 5, 64, 4, 2, 0};
    Case a = case_new(s, 80), b = case_new(s, 80);
    omp_set_num_threads(1);
    d->k->flash_attention_forward(d, a.out, a.lse, a.qkv, s.B, s.T, s.C, s.NH);
    d->k->flash_attention_backward(d, a.dqkv, a.R, a.qkv, a.out, a.lse, s.B, s.T, s.C, s.NH);
    omp_set_num_threads(d->threads > 1 ? d->threads : 2);
    d->k->flash_attention_forward(d, b.out, b.lse, b.qkv, s.B, s.T, s.C, s.NH);
    d->k->flash_attention_backward(d, b.dqkv, b.R, b.qkv, b.out, b.lse, s.B, s.T, s.C, s.NH);
    omp_set_num_threads(d->threads);
    assert_memory_equal(a.out, b.out, a.n * sizeof(float));
    assert_memory_equal(a.lse, b.lse, a.nrows * sizeof(float));
    assert_memory_equal(a.dqkv, b.dqkv, a.nqkv * sizeof(float));
    // at T = 1024 one (T,T) fp32 matrix is 4 MB; the flash kernels' whole scratch is far below
    size_t want = d->k->scratch_bytes(d->threads, 1, 1024, 64, 1, 256, 1, 1);
    size_t tt = (size_t)1024 * 1024 * sizeof(float);
    print_message("scratch at T 1024: flash %zu B, one (T,T) matrix %zu B\n", want, tt);
    assert_true(want < tt / 8);
    case_free(&a), case_free(&b);
}

static void test_planted_bugs_are_caught(void **state) {
    Device *d = *state;
    const struct {
        const char *name;
        ForwardFn fwd;
        BackwardFn bwd;
    } plants[] = {
        {"a running maximum that forgets earlier tiles", flash_forward_plant_running_max,
         flash_backward_plant_running_max},
        {"a missing rescale of what a row summed", flash_forward_plant_rescale, flash_backward_plant_rescale},
        {"the causal mask off by one", flash_forward_plant_mask, flash_backward_plant_mask},
    };
    for (int p = 0; p < 3; p++) {
        int caught = 0;
        for (int i = 0; i < NSHAPES; i++) {
            Case c = case_new(shapes[i], 40 + i);
            caught += forward_errors(d, plants[p].fwd, &c) > 0;
            caught += backward_errors(d, plants[p].fwd, plants[p].bwd, &c) > 0;
            case_free(&c);
        }
        print_message("planted %s: %d of %d checks fail\n", plants[p].name, caught, 2 * NSHAPES);
        if (!caught) fail_msg("planted %s: every check passed", plants[p].name);
    }
}

static int setup(void **state) {
    static Device dev;
    DeviceOptions opt = {.kind = "cpu"};
    device_init(&dev, &opt);
    *state = &dev;
    return 0;
}

static int teardown(void **state) {
    device_destroy(*state);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_against_reference),
        cmocka_unit_test(test_backward_against_materialized),
        cmocka_unit_test(test_backward_finite_differences),
        cmocka_unit_test(test_causal),
        cmocka_unit_test(test_ring_blocks_equal_whole),
        cmocka_unit_test(test_same_bits_any_threads_no_tt_scratch),
        cmocka_unit_test(test_planted_bugs_are_caught),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

// test_adamw.c: the cpu AdamW kernel (kernels_cpu.adamw) against a scalar
// double-precision AdamW written here from the paper (Loshchilov & Hutter,
// decoupled weight decay), over several steps with bias correction, weight
// decay and a gradient scale (the clipping factor).
//
// Tolerances: the kernel computes in fp32, the reference in double. One step
// changes master by lr * O(1), computed with a relative error of a few fp32
// ulps (~1e-6), and rounds master to fp32 (~6e-8 relative); over 10 steps
// that stays below 1e-6 absolute for |master| <= 1 and lr = 1e-2, so master is
// checked at atol 2e-6, rtol 2e-6. v at rtol 1e-5 (a few ulps per step);
// m is a signed running mean that can cancel to near zero, so its error is
// relative to the gradients (|g| <= 1): atol 1e-7 besides rtol 1e-5.
#include "testutil.h"
#include "kernels.h"

enum { N = 1000 + 13, STEPS = 10 };  // N is no multiple of any vector width: the tail runs too

typedef struct RefState {
    double master[N], m[N], v[N];
} RefState;

static void reference_step(RefState *r, const bf16 *grad, double lr, double beta1, double beta2,
                           double eps, double wd, double grad_scale, int t) {
    double bc1 = 1.0 - pow(beta1, t), bc2 = 1.0 - pow(beta2, t);
    for (int i = 0; i < N; i++) {
        double g = (double)bf16_to_f32(grad[i]) * grad_scale;
        r->m[i] = beta1 * r->m[i] + (1.0 - beta1) * g;
        r->v[i] = beta2 * r->v[i] + (1.0 - beta2) * g * g;
        double mhat = r->m[i] / bc1, vhat = r->v[i] / bc2;
        r->master[i] -= lr * (mhat / (sqrt(vhat) + eps) + wd * r->master[i]);
    }
}

static void test_adamw_matches_reference(void **state) {
    Device *d = *state;
    static float master[N], m[N], v[N], master_noparam[N], m2[N], v2[N], gf[N];
    static bf16 grad[N], param[N];
    static RefState ref;
    test_fill(master, N, 1, -1, 1);
    for (int i = 0; i < N; i++) {
        ref.master[i] = master[i];
        ref.m[i] = ref.v[i] = 0.0;
        m[i] = v[i] = m2[i] = v2[i] = 0.0f;
    }
    memcpy(master_noparam, master, sizeof master);
    const float lr = 1e-2f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    for (int t = 1; t <= STEPS; t++) {
        // gradients of several magnitudes, some exactly zero (decay only)
        test_fill(gf, N, 100 + t, -1, 1);
        for (int i = 0; i < N; i++) gf[i] *= (i % 7 == 0) ? 0.0f : (i % 3 == 0 ? 1e-3f : 1.0f);
        d->k->f32_to_half(d, grad, gf, N);
        float grad_scale = (t % 2) ? 0.5f : 1.0f;
        AdamWStep s = {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = wd,
                       .bias_corr1 = 1.0f - powf(beta1, (float)t),
                       .bias_corr2 = 1.0f - powf(beta2, (float)t), .grad_scale = grad_scale};
        d->k->adamw(d, master, m, v, grad, param, N, &s);
        d->k->adamw(d, master_noparam, m2, v2, grad, NULL, N, &s);  // param NULL: master only
        reference_step(&ref, grad, lr, beta1, beta2, eps, wd, grad_scale, t);
    }
    int bad = 0;
    for (int i = 0; i < N; i++) {
        int ok = test_close(master[i], ref.master[i], 2e-6, 2e-6) &&
                 test_close(m[i], ref.m[i], 1e-7, 1e-5) && test_close(v[i], ref.v[i], 1e-12, 1e-5);
        if (!ok && bad++ < 5)
            print_message("[%d] master %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g\n", i,
                          master[i], ref.master[i], m[i], ref.m[i], v[i], ref.v[i]);
        // the bf16 parameter is exactly the rounded master
        assert_true(param[i] == f32_to_bf16(master[i]));
    }
    assert_int_equal(bad, 0);
    assert_memory_equal(master, master_noparam, sizeof master);
    assert_memory_equal(m, m2, sizeof m);
    assert_memory_equal(v, v2, sizeof v);
}

// The kernel (the CPU Adam, cpu_adam.h, on this CPU's widest path) gives the
// bits of adamw_element (elementwise.h), the per-element update the cuda
// kernel also uses: its operation order is pinned (explicit fmaf, no multiply
// left for the compiler to contract), so vector code can repeat it exactly.
static void test_adamw_matches_element(void **state) {
    Device *d = *state;
    static float master[N], m[N], v[N], em[N], ev[N], emaster[N], gf[N];
    static bf16 grad[N], param[N], eparam[N];
    test_fill(master, N, 7, -1, 1);
    test_fill(m, N, 8, -0.1f, 0.1f);
    test_fill(v, N, 9, 0.0f, 0.01f);
    test_fill(gf, N, 10, -1, 1);
    d->k->f32_to_half(d, grad, gf, N);
    memcpy(emaster, master, sizeof master);
    memcpy(em, m, sizeof m);
    memcpy(ev, v, sizeof v);
    AdamWStep s = {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f,
                   .bias_corr1 = 0.19f, .bias_corr2 = 0.002f, .grad_scale = 0.25f};
    d->k->adamw(d, master, m, v, grad, param, N, &s);
    for (int i = 0; i < N; i++)
        eparam[i] = f32_to_bf16(adamw_element(&emaster[i], &em[i], &ev[i], bf16_to_f32(grad[i]), &s));
    assert_memory_equal(master, emaster, sizeof master);
    assert_memory_equal(m, em, sizeof m);
    assert_memory_equal(v, ev, sizeof v);
    assert_memory_equal(param, eparam, sizeof param);
}

// The order adamw_element promises, written out here from its comment: any
// other rounding order (a multiply-add left to the compiler to contract, or
// not) changes the last bit of some of these elements.
static float pinned_order_master(float w, float *m, float *v, float grad, const AdamWStep *s) {
    float g = grad * s->grad_scale;
    *m = fmaf(s->beta1, *m, (1.0f - s->beta1) * g);
    *v = fmaf(s->beta2, *v, ((1.0f - s->beta2) * g) * g);
    float step_dir = (*m / s->bias_corr1) / (sqrtf(*v / s->bias_corr2) + s->eps);
    return fmaf(-s->lr, fmaf(s->weight_decay, w, step_dir), w);
}

static void test_adamw_element_order_is_pinned(void **state) {
    static float master[N], m[N], v[N], gf[N];
    test_fill(master, N, 11, -1, 1);
    test_fill(m, N, 12, -0.1f, 0.1f);
    test_fill(v, N, 13, 0.0f, 0.01f);
    test_fill(gf, N, 14, -1, 1);
    AdamWStep s = {.lr = 3e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                   .bias_corr1 = 0.271f, .bias_corr2 = 0.142625f, .grad_scale = 0.75f};
    for (int i = 0; i < N; i++) {
        float em = m[i], ev = v[i];
        float expect = pinned_order_master(master[i], &em, &ev, gf[i], &s);
        adamw_element(&master[i], &m[i], &v[i], gf[i], &s);
        if (memcmp(&master[i], &expect, 4) || memcmp(&m[i], &em, 4) || memcmp(&v[i], &ev, 4))
            fail_msg("[%d] master %a vs %a, m %a vs %a, v %a vs %a", i, master[i], expect, m[i],
                     em, v[i], ev);
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
        cmocka_unit_test(test_adamw_matches_reference),
        cmocka_unit_test(test_adamw_matches_element),
        cmocka_unit_test(test_adamw_element_order_is_pinned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}

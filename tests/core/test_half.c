// test_half.c: the fp16 conversions (bf16.h f16_to_f32/f32_to_f16) against
// the compiler's own _Float16 conversions (IEEE-754 binary16, round to
// nearest even), and the row paths of half_rows.h (F16C where the CPU has
// it, scalar) against the scalar functions, bit for bit.
//
// Cases: all 65536 binary16 values up to fp32 and back; fp32 values around
// every rounding boundary (the ties of each exponent, 65504/65520, the
// subnormal range down to 2^-25 and below), random bit patterns, infinities
// and NaNs (a NaN stays a NaN, quiet).
#include "testutil.h"
#include "half_rows.h"

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint16_t f16_bits(_Float16 h) {
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
static int f16_is_nan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }

// the compiler's conversion, the reference (a NaN only has to stay a quiet NaN)
static void expect_down(float f) {
    uint16_t got = f32_to_f16(f), want = f16_bits((_Float16)f);
    if (isnan(f)) {
        if (!f16_is_nan(got) || !(got & 0x200u)) fail_msg("f32_to_f16(NaN 0x%08x) = 0x%04x, not a quiet NaN", bits_of(f), got);
        return;
    }
    if (got != want) fail_msg("f32_to_f16(%.9g = 0x%08x) = 0x%04x, _Float16 gives 0x%04x", f, bits_of(f), got, want);
}

static void test_every_half_up_and_back(void **state) {
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 x;
        uint16_t h16 = (uint16_t)h;
        memcpy(&x, &h16, sizeof x);
        float got = f16_to_f32(h16);
        if (f16_is_nan(h16)) {
            if (!isnan(got)) fail_msg("f16_to_f32(0x%04x) = %g, not NaN", h, got);
            continue;
        }
        if (bits_of(got) != bits_of((float)x))
            fail_msg("f16_to_f32(0x%04x) = 0x%08x, _Float16 gives 0x%08x", h, bits_of(got), bits_of((float)x));
        if (f32_to_f16(got) != h16) fail_msg("0x%04x does not come back from fp32 (0x%04x)", h, f32_to_f16(got));
    }
}

// For each binary16 value: the exact midpoint to its successor (a tie),
// one fp32 ulp either side of it, and the value's fp32 neighbours.
static void test_rounding_boundaries(void **state) {
    for (uint32_t h = 0; h < 0x7c00; h++) {
        float a = f16_to_f32((uint16_t)h), b = f16_to_f32((uint16_t)(h + 1));
        float mid = a + (b - a) / 2;  // exact: one more bit than fp16 has
        for (int sign = 0; sign < 2; sign++) {
            float s = sign ? -1.0f : 1.0f;
            expect_down(s * mid);
            expect_down(s * nextafterf(mid, 0));
            expect_down(s * nextafterf(mid, INFINITY));
            expect_down(s * nextafterf(a, INFINITY));
            expect_down(s * nextafterf(a, 0));
        }
    }
    const float edges[] = {65504.0f, 65519.99f, 65520.0f, 65536.0f, 1e30f, 5.960464477539063e-08f /* 2^-24 */,
                           2.9802322387695312e-08f /* 2^-25: a tie to zero */, 2.98023259e-08f, 1e-45f, 0.0f, -0.0f,
                           INFINITY, -INFINITY, NAN, -NAN, float_of(0x7f800001u), float_of(0x7fffffffu)};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) expect_down(edges[i]);
}

static void test_random_bits(void **state) {
    uint64_t rng = 0x5eed;
    for (int i = 0; i < 4000000; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        expect_down(float_of((uint32_t)(rng >> 32)));
    }
}

// A row of n values through path p in both formats, against the scalar
// functions element by element (NaNs included: both paths keep the payload).
static void check_rows(HalfRowsPath p, size_t n, int offset) {
    float *src = malloc((n + 8) * sizeof(float)), *back = malloc((n + 8) * sizeof(float));
    bf16 *h = malloc((n + 8) * sizeof(bf16));
    uint64_t rng = 42 + n;
    for (size_t i = 0; i < n + 8; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(rng >> 32);
        // half of them in fp16's range, so most round to finite values
        src[i] = i % 2 ? float_of(u) : float_of((u & 0x807fffffu) | ((uint32_t)(100 + (u >> 24) % 45) << 23));
    }
    for (int fmt = HALF_BF16; fmt <= HALF_FP16; fmt++) {
        f32_to_half_row(p, (HalfFormat)fmt, h + offset, src + offset, n);
        half_to_f32_row(p, (HalfFormat)fmt, back + offset, h + offset, n);
        for (size_t i = offset; i < n + offset; i++) {
            bf16 want = f32_to_half((HalfFormat)fmt, src[i]);
            int nan = fmt == HALF_FP16 ? f16_is_nan(want) : isnan(src[i]);
            if (h[i] != want && !(nan && isnan(half_to_f32((HalfFormat)fmt, h[i]))))
                fail_msg("%s row, %s, n %zu: element %zu is 0x%04x, the scalar 0x%04x", p ? "f16c" : "scalar",
                         half_format_name((HalfFormat)fmt), n, i, h[i], want);
            float up = half_to_f32((HalfFormat)fmt, h[i]);
            if (bits_of(back[i]) != bits_of(up) && !(isnan(up) && isnan(back[i])))
                fail_msg("%s row, %s: element %zu back is 0x%08x, the scalar 0x%08x", p ? "f16c" : "scalar",
                         half_format_name((HalfFormat)fmt), i, bits_of(back[i]), bits_of(up));
        }
    }
    free(src), free(back), free(h);
}

static void test_row_paths(void **state) {
    for (int p = HALF_ROWS_SCALAR; p <= HALF_ROWS_F16C; p++) {
        const char *why = half_rows_unsupported_reason((HalfRowsPath)p);
        if (why) {
            print_message("half rows: %s path skipped: %s\n", p ? "f16c" : "scalar", why);
            continue;
        }
        print_message("half rows: %s path runs\n", p ? "f16c" : "scalar");
        const size_t sizes[] = {1, 7, 8, 9, 17, 1000, 65537};
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
            for (int offset = 0; offset < 3; offset++) check_rows((HalfRowsPath)p, sizes[k], offset);
    }
    assert_null(half_rows_unsupported_reason(half_rows_best_path()));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_half_up_and_back),
        cmocka_unit_test(test_rounding_boundaries),
        cmocka_unit_test(test_random_bits),
        cmocka_unit_test(test_row_paths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

// test_memory_math.c: the ZeRO formulas against hand-computed figures (the
// paper's Ψ = 7.5B, N = 64 example), the partition's padding, the closed
// forms against what states_alloc really allocates, states_init's values (of
// the whole layout and of ranges of it), and the memory_math binary
// (--measure under mpirun, --json, bad input, the planner's step times
// against the ring formulas, ZeRO++'s mean bytes over the ranks in closed
// form at the flags' largest --ranks).
#include <jansson.h>
#include <math.h>
#include "testutil.h"
#include "device.h"
#include "gpt.h"
#include "act_math.h"
#include "mem_math.h"
#include "states.h"
#include "zeropp_math.h"

static void test_paper_example(void **state) {
    (void)state;
    // Rajbhandari et al. 2020, Figure 1: 120, 31.4, 16.6, 1.9 GB
    const double psi = 7.5e9;
    assert_true(test_close(stage_formula_bytes(STAGE_DP, psi, 64), 120e9, 0.5, 0));
    assert_true(test_close(stage_formula_bytes(STAGE_ZERO1, psi, 64), 31.40625e9, 0.5, 0));   // 4Ψ + 12Ψ/64
    assert_true(test_close(stage_formula_bytes(STAGE_ZERO2, psi, 64), 16.640625e9, 0.5, 0));  // 2Ψ + 14Ψ/64
    assert_true(test_close(stage_formula_bytes(STAGE_ZERO3, psi, 64), 1.875e9, 0.5, 0));      // 16Ψ/64
    assert_true(test_close(stage_formula_bytes(STAGE_OFFLOAD, psi, 64), 15e9 + 1.640625e9, 0.5, 0));
    assert_true(test_close(stage_formula_bytes(STAGE_INFINITY, psi, 64), 1.875e9, 0.5, 0));
    StateBytes b;
    stage_formula_state_bytes(STAGE_OFFLOAD, psi, 64, &b);
    assert_true(test_close(b.tier_total[TIER_DEVICE], 15e9, 0.5, 0));
    assert_true(test_close(b.tier_total[TIER_PINNED], 1.640625e9, 0.5, 0));
    // infinity: 12Ψ/N on NVMe, the gradient shard pinned, the param shard where --offload-params puts it
    const StageId inf[3] = {STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME};
    const double dev[3] = {0.234375e9, 0, 0}, pin[3] = {0.234375e9, 0.46875e9, 0.234375e9};
    const double nvme[3] = {1.40625e9, 1.40625e9, 1.640625e9};
    for (int i = 0; i < 3; i++) {
        assert_true(test_close(stage_formula_bytes(inf[i], psi, 64), 1.875e9, 0.5, 0));
        stage_formula_state_bytes(inf[i], psi, 64, &b);
        assert_true(test_close(b.tier_total[TIER_DEVICE], dev[i], 0.5, 0));
        assert_true(test_close(b.tier_total[TIER_PINNED], pin[i], 0.5, 0));
        assert_true(test_close(b.tier_total[TIER_NVME], nvme[i], 0.5, 0));
        assert_true(b.tier_total[TIER_HOST] == 0);
    }
    assert_string_equal(stage_formula(STAGE_INFINITY), "2Ψ/N (device) + 2Ψ/N (pinned) + 12Ψ/N (nvme)");
    assert_string_equal(stage_formula(STAGE_ZERO2), "2Ψ + 14Ψ/N");
    assert_string_equal(stage_name(STAGE_OFFLOAD), "cpu_offload");
}

static void test_partition_padding(void **state) {
    (void)state;
    Partition p;
    partition_init(&p, 1000, 4, 3);  // 1000 -> 1024 (multiple of 4 * 64)
    assert_int_equal(p.padded, 1024);
    assert_int_equal(p.shard, 256);
    assert_int_equal(p.begin, 768);
    assert_int_equal(p.end, 1024);
    partition_init(&p, 1024, 4, 0);  // already a multiple: no padding
    assert_int_equal(p.padded, 1024);
    partition_init(&p, 1, 1, 0);
    assert_int_equal(p.padded, 64);
    partition_init(&p, 1000, 3, 1);  // 3 * 64 = 192: 1000 -> 1152, shards of 384
    assert_int_equal(p.padded, 1152);
    assert_int_equal(p.shard, 384);
    assert_int_equal(p.begin, 384);
    partition_init(&p, 7500000000ull, 64, 63);  // 7.5e9 / 4096 = 1831054.6875 -> 1831055 * 4096
    assert_int_equal(p.padded, 7500001280ull);
    assert_int_equal(p.shard, 117187520ull);
    assert_int_equal(p.end, p.padded);

    partition_init(&p, 1000, 4, 0);
    Range r = {200, 100};  // [200, 300) spans shards 0 [0,256) and 1 [256,512)
    size_t first = 0;
    assert_int_equal(partition_overlap(&p, r, 0, &first), 56);
    assert_int_equal(first, 200);
    assert_int_equal(partition_overlap(&p, r, 1, &first), 44);
    assert_int_equal(first, 256);
    assert_int_equal(partition_overlap(&p, r, 2, NULL), 0);
}

static Device cpu_device(void) {
    Device d;
    DeviceOptions opt = {.kind = "cpu", .hbm_gb = 0, .threads = 1, .local_rank = 0, .local_size = 1};
    device_init(&d, &opt);
    return d;
}

// What each stage declares in its strategy (.states); the trainers' own
// declarations are checked against the closed forms by memory_math --measure
// (test_binary_measure). These copies let the tests below run states_alloc.
#define LAYOUT(p, g, o, pt, gt, ot) \
    ((StatesLayout){.params = p, .grads = g, .optim = o, .params_tier = pt, .grads_tier = gt, .optim_tier = ot})
static StatesLayout layout_of(StageId s) {
    const MemTier D = TIER_DEVICE, P = TIER_PINNED, NV = TIER_NVME;
    switch (s) {
    case STAGE_DP: return LAYOUT(STATE_FULL, STATE_FULL, STATE_FULL, D, D, D);
    case STAGE_ZERO1: return LAYOUT(STATE_FULL, STATE_FULL, STATE_SHARD, D, D, D);
    case STAGE_ZERO2: return LAYOUT(STATE_FULL, STATE_SHARD, STATE_SHARD, D, D, D);
    case STAGE_ZERO3: return LAYOUT(STATE_SHARD, STATE_SHARD, STATE_SHARD, D, D, D);
    case STAGE_OFFLOAD: return LAYOUT(STATE_FULL, STATE_SHARD, STATE_SHARD, D, P, P);
    case STAGE_INFINITY: return LAYOUT(STATE_SHARD, STATE_SHARD, STATE_SHARD, D, P, NV);
    case STAGE_INFINITY_CPU: return LAYOUT(STATE_SHARD, STATE_SHARD, STATE_SHARD, P, P, NV);
    case STAGE_INFINITY_NVME: return LAYOUT(STATE_SHARD, STATE_SHARD, STATE_SHARD, NV, P, NV);
    default: fail_msg("no layout for stage %d", (int)s);
    }
    return LAYOUT(STATE_NONE, STATE_NONE, STATE_NONE, D, D, D);
}

// The stages whose every state states_alloc can place (cpu_offload --dpu
// keeps a second gradient shard of its own).
static const StageId ALLOC_STAGES[] = {STAGE_DP, STAGE_ZERO1, STAGE_ZERO2, STAGE_ZERO3, STAGE_OFFLOAD,
                                       STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME};
#define N_ALLOC_STAGES (sizeof ALLOC_STAGES / sizeof ALLOC_STAGES[0])

// Bytes states_alloc counts for a layout on one rank; on NVMe, where it
// allocates nothing, the sizes of the descriptors it hands back (the files
// stage 06 makes).
static void alloc_bytes(Device *d, const StatesLayout *l, size_t psi, int ranks, int rank,
                        double out[TIER_COUNT][CAT_COUNT]) {
    Partition p;
    partition_init(&p, psi, ranks, rank);
    ModelStates st;
    states_alloc(&st, d, l, &p);
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++) out[t][c] = (double)d->mem.current[t][c];
    const Buf *bufs[5] = {&st.params, &st.grads, &st.master, &st.m, &st.v};
    for (int i = 0; i < 5; i++)
        if (bufs[i]->tier == TIER_NVME) {
            assert_null(bufs[i]->ptr);
            out[TIER_NVME][bufs[i]->cat] += (double)bufs[i]->bytes;
        }
    states_free(&st, d);
    for (int t = 0; t < TIER_COUNT; t++) assert_int_equal(d->mem.tier_current[t], 0);
}

static int same_bytes(double a[TIER_COUNT][CAT_COUNT], const StateBytes *f) {
    for (int t = 0; t < TIER_COUNT; t++)
        for (int c = 0; c < CAT_COUNT; c++)
            if (a[t][c] != f->bytes[t][c]) return 0;
    return 1;
}

// The closed forms (with the stated padding) equal what states_alloc
// allocates for each stage's layout, on every rank, padding included; and
// they are a real check: a layout that keeps one state differently (whole
// instead of sharded, or on another tier) disagrees with them.
static void test_closed_forms_check_the_allocator(void **state) {
    (void)state;
    Device d = cpu_device();
    const size_t psis[] = {834304, 1000, 123457, 64, 5, 7500001};
    const int ranks[] = {4, 3, 7, 1, 8, 64};
    for (size_t i = 0; i < sizeof psis / sizeof psis[0]; i++)
        for (int rank = 0; rank < ranks[i]; rank += ranks[i] > 2 ? ranks[i] - 1 : 1)
            for (size_t k = 0; k < N_ALLOC_STAGES; k++) {
                StageId s = ALLOC_STAGES[k];
                StatesLayout l = layout_of(s);
                StateBytes f;
                stage_state_bytes((StageId)s, psis[i], ranks[i], &f);
                double got[TIER_COUNT][CAT_COUNT];
                alloc_bytes(&d, &l, psis[i], ranks[i], rank, got);
                if (!same_bytes(got, &f))
                    fail_msg("Ψ %zu N %d rank %d %s: states_alloc differs from the closed form", psis[i], ranks[i],
                             rank, stage_name((StageId)s));
                if (ranks[i] == 1) continue;  // at N = 1 a shard is the whole buffer
                StatesLayout wrong[3] = {l, l, l};
                wrong[0].grads = l.grads == STATE_FULL ? STATE_SHARD : STATE_FULL;
                wrong[1].optim = l.optim == STATE_FULL ? STATE_SHARD : STATE_FULL;
                wrong[2].optim_tier = l.optim_tier == TIER_DEVICE ? TIER_PINNED : TIER_DEVICE;
                for (int w = 0; w < 3; w++) {
                    alloc_bytes(&d, &wrong[w], psis[i], ranks[i], rank, got);
                    if (same_bytes(got, &f))
                        fail_msg("%s: a changed layout (%d) still matches the closed form", stage_name((StageId)s), w);
                }
            }
    device_destroy(&d);
}

// The padding rule the closed forms state, against the partition's own.
static void test_padding_rule(void **state) {
    (void)state;
    for (size_t psi = 1; psi < 5000; psi += 37)
        for (int n = 1; n <= 9; n++) {
            Partition p;
            partition_init(&p, psi, n, 0);
            assert_true(padded_params((double)psi, n) == (double)p.padded);
        }
}

// Infinity's optimizer states (and with --offload-params nvme its params)
// live on NVMe: states_alloc hands back descriptors of the formula's sizes and
// allocates nothing for them through the device.
static void test_infinity_descriptors(void **state) {
    (void)state;
    Device d = cpu_device();
    Partition p;
    partition_init(&p, 1000, 3, 2);
    StatesLayout l = layout_of(STAGE_INFINITY_NVME);
    ModelStates st;
    states_alloc(&st, &d, &l, &p);
    StateBytes f;
    stage_state_bytes(STAGE_INFINITY_NVME, 1000, 3, &f);
    assert_null(st.params.ptr);
    assert_null(st.master.ptr);
    assert_int_equal(st.params.bytes, f.bytes[TIER_NVME][CAT_PARAMS]);
    assert_int_equal(st.master.bytes + st.m.bytes + st.v.bytes,
                     f.bytes[TIER_NVME][CAT_MASTER] * 3);
    assert_int_equal(d.mem.tier_current[TIER_DEVICE] + d.mem.tier_current[TIER_HOST], 0);
    assert_int_equal(d.mem.tier_current[TIER_PINNED], f.tier_total[TIER_PINNED]);  // the gradient shard
    states_free(&st, &d);
    assert_int_equal(st.params.bytes, 0);
    device_destroy(&d);
}

static void check_init(StageId s, int ranks, int rank) {
    GPTConfig cfg;
    assert_true(gpt_preset("tiny", &cfg));
    GPTLayout gl;
    gpt_layout(&gl, &cfg);
    Device d = cpu_device();
    Partition p;
    partition_init(&p, gl.num_params, ranks, rank);
    StatesLayout l = layout_of(s);
    ModelStates st;
    states_alloc(&st, &d, &l, &p);
    states_init(&st, &d, &gl, 1234);
    float *want = malloc(gl.num_params * sizeof(float));
    gpt_init_values(&gl, 1234, 0, gl.num_params, want);
    const float *master = st.master.ptr;
    for (size_t i = 0; i < st.optim_count; i++) {
        size_t g = st.optim_begin + i;
        assert_true(master[i] == (g < gl.num_params ? want[g] : 0.0f));
        assert_true(((float *)st.m.ptr)[i] == 0.0f && ((float *)st.v.ptr)[i] == 0.0f);
    }
    const bf16 *params = st.params.ptr;
    size_t pbegin = l.params == STATE_SHARD ? p.begin : 0;
    for (size_t i = 0; i < st.params.bytes / sizeof(bf16); i++) {
        size_t g = pbegin + i;
        assert_int_equal(params[i], f32_to_bf16(g < gl.num_params ? want[g] : 0.0f));
    }
    const bf16 *grads = st.grads.ptr;
    for (size_t i = 0; i < st.grads.bytes / sizeof(bf16); i++) assert_int_equal(grads[i], 0);
    free(want);
    states_free(&st, &d);
    device_destroy(&d);
}

static void test_states_init_values(void **state) {
    (void)state;
    check_init(STAGE_DP, 1, 0);
    check_init(STAGE_ZERO1, 3, 2);  // last shard: holds the padding
    check_init(STAGE_ZERO2, 3, 0);
    check_init(STAGE_ZERO3, 3, 2);
    check_init(STAGE_OFFLOAD, 4, 1);
}

// States holding two ranges of the layout (a last pipeline stage: wte, then
// its blocks and the head), sharded over 3 ranks: each element starts at the
// value of the layout element it holds, the padding at zero.
static void test_states_init_ranges(void **state) {
    (void)state;
    GPTConfig cfg;
    assert_true(gpt_preset("tiny", &cfg));
    GPTLayout gl;
    gpt_layout(&gl, &cfg);
    int hu = gpt_unit_head(&gl);
    Range held[2] = {{0, (size_t)cfg.vocab_size * cfg.channels},
                     {gl.unit[2].offset, gl.unit[hu].offset + gl.unit[hu].count - gl.unit[2].offset}};
    float *want = malloc(gl.num_params * sizeof(float));
    gpt_init_values(&gl, 99, 0, gl.num_params, want);
    for (int rank = 0; rank < 3; rank++) {
        Device d = cpu_device();
        Partition p;
        partition_init(&p, held[0].count + held[1].count, 3, rank);
        StatesLayout l = layout_of(STAGE_ZERO1);
        ModelStates st;
        states_alloc(&st, &d, &l, &p);
        states_init_ranges(&st, &d, &gl, held, 2, 99);
        const float *master = st.master.ptr;
        const bf16 *params = st.params.ptr;
        for (size_t i = 0; i < p.padded; i++) {
            float w = i < held[0].count ? want[i]
                    : i < p.num_params ? want[held[1].offset + i - held[0].count] : 0.0f;
            assert_int_equal(params[i], f32_to_bf16(w));
            if (i >= p.begin && i < p.end) assert_true(master[i - p.begin] == w);
        }
        states_free(&st, &d);
        device_destroy(&d);
    }
    free(want);
}

static void test_comm_elems(void **state) {
    (void)state;
    // Ψ = 1000 on N = 4: one ring reduce-scatter or all-gather moves 750 per rank
    assert_true(stage_comm_elems(STAGE_DP, 1000, 4, 1) == 1500);
    assert_true(stage_comm_elems(STAGE_ZERO1, 1000, 4, 1) == 1500);
    assert_true(stage_comm_elems(STAGE_ZERO2, 1000, 4, 1) == 1500);
    assert_true(stage_comm_elems(STAGE_ZERO3, 1000, 4, 1) == 2250);
    // k = 4 micro-batches: dp/zero1 still once; zero2 reduce-scatters 4x; zero3 all 3 parts 4x
    assert_true(stage_comm_elems(STAGE_DP, 1000, 4, 4) == 1500);
    assert_true(stage_comm_elems(STAGE_ZERO1, 1000, 4, 4) == 1500);
    assert_true(stage_comm_elems(STAGE_ZERO2, 1000, 4, 4) == 3750);
    assert_true(stage_comm_elems(STAGE_ZERO3, 1000, 4, 4) == 9000);
    assert_true(stage_comm_elems(STAGE_ZERO3, 1000, 1, 1) == 0);  // one rank talks to no one
}

// Bytes between tiers, by hand: Ψ = 1000, N = 4 (Ψ_pad = 1024, shards of
// 256), k = 2 micro-batches.
static void test_transfer_bytes(void **state) {
    (void)state;
    const StageId stages[] = {STAGE_ZERO3, STAGE_OFFLOAD, STAGE_INFINITY, STAGE_INFINITY_CPU, STAGE_INFINITY_NVME};
    const double want[][XFER_COUNT] = {  // d2h, h2d, nvme read, nvme write
        {0, 0, 0, 0},
        {1000, 512, 0, 0},        // 2kΨ/N down, 2Ψ_pad/N up
        {1000, 512, 3072, 3072},  // + master, m, v: 12Ψ_pad/N each way
        {1000, 2000, 3072, 3072}, // the params' slices up twice per micro-batch: 4kΨ/N
        {1000, 2000, 5072, 3584}, // ... read from NVMe too; the new shard written: 14Ψ_pad/N
    };
    for (size_t i = 0; i < sizeof stages / sizeof stages[0]; i++) {
        double got[XFER_COUNT];
        stage_transfer_bytes(stages[i], 1000, 4, 2, got);
        for (int x = 0; x < XFER_COUNT; x++)
            if (got[x] != want[i][x])
                fail_msg("%s %s: %g bytes, by hand %g", stage_name(stages[i]), transfer_name((Transfer)x), got[x],
                         want[i][x]);
    }
    assert_string_equal(stage_transfer_formula(STAGE_INFINITY_NVME, XFER_NVME_WRITE), "14Ψ_pad/N");
    assert_string_equal(stage_transfer_formula(STAGE_INFINITY, XFER_H2D), "2Ψ_pad/N");
}

static void test_korthikanti(void **state) {
    (void)state;
    // s b h (34 + 5 a s / h) = 1024 * 8 * 768 * (34 + 80)
    assert_true(korthikanti_bytes(GPT_RECOMPUTE_NONE, 1024, 8, 768, 12, 1, 0) == 717225984.0);
    // selective drops the 5as^2b; full keeps the 16-bit input, 2sbh
    assert_true(korthikanti_bytes(GPT_RECOMPUTE_SELECTIVE, 1024, 8, 768, 12, 1, 0) == 1024.0 * 8 * 768 * 34);
    assert_true(korthikanti_bytes(GPT_RECOMPUTE_FULL, 1024, 8, 768, 12, 1, 0) == 1024.0 * 8 * 768 * 2);
    // tensor parallel t = 4: sbh(10 + 24/t + 5as/(ht)); with sequence parallelism sbh/t (34 + 5as/h)
    assert_true(korthikanti_bytes(GPT_RECOMPUTE_NONE, 1024, 8, 768, 12, 4, 0) == 1024.0 * 8 * 768 * (10 + 6 + 20));
    assert_true(korthikanti_bytes(GPT_RECOMPUTE_NONE, 1024, 8, 768, 12, 4, 1) == 1024.0 * 8 * 768 / 4 * 114);
}

static void test_max_params_round_trip(void **state) {
    (void)state;
    const int ranks[] = {1, 8, 64};
    assert_true(test_close(stage_max_params(STAGE_DP, 80e9, 8), 5e9, 1, 0));  // 80 GB / 16
    for (int s = STAGE_DP; s < STAGE_COUNT; s++)
        for (int i = 0; i < 3; i++) {
            if (!strcmp(stage_tier_formula((StageId)s, TIER_DEVICE), "0")) continue;  // no model state on the device
            double psi = stage_max_params((StageId)s, 80e9, ranks[i]);
            StateBytes b;
            stage_formula_state_bytes((StageId)s, psi, ranks[i], &b);
            assert_true(test_close(b.tier_total[TIER_DEVICE], 80e9, 0, 1e-12));
        }
    assert_true(isinf(stage_max_params(STAGE_INFINITY_CPU, 80e9, 8)));
    assert_true(isinf(stage_max_params(STAGE_INFINITY_NVME, 80e9, 8)));
}

static void test_fit_hint(void **state) {
    (void)state;
    // Ψ = 1e8, budget 0.6 GB at 4 ranks: zero2 0.55 GB, zero3 0.4 GB fit; dp 1.6 GB
    // never; zero1 = 4Ψ + 12Ψ/N needs N >= 6 unpadded, but at 6 the padding
    // (Ψ_pad = 100,000,128) leaves it 768 bytes over: 7 ranks
    char hint[1024];
    stage_fit_hint(100000000, 4, 0.6e9, hint, sizeof hint);
    assert_non_null(strstr(hint, "fits at 4 ranks: zero2 (0.55 GB), zero3 (0.4 GB)"));
    assert_non_null(strstr(hint, "dp_baseline needs 1.6 GB at any rank count"));
    assert_non_null(strstr(hint, "zero1 fits from 7 ranks"));
    // zero3: 16Ψ/N <= 2 MB from N = 800 unpadded; at 800 the padding (Ψ_pad =
    // 100,044,800) leaves it 896 bytes over, at 801 it fits
    stage_fit_hint(100000000, 4, 2e6, hint, sizeof hint);
    assert_non_null(strstr(hint, "no stage"));
    assert_non_null(strstr(hint, "zero3 fits from 801 ranks"));
    // the smallest count, not the smallest power of two: 16 x 70B / 80 GB = 14
    stage_fit_hint(70000000000ull, 8, 80e9, hint, sizeof hint);
    if (!strstr(hint, "zero3 fits from 14 ranks")) fail_msg("70B in 80 GB: %s", hint);
    // the stages that take the states off the device are named too: gpt2-774m
    // in 0.44 GB at 2 ranks (stage 06's showcase, where zero3 is refused)
    stage_fit_hint(774030080, 2, 0.441e9, hint, sizeof hint);
    const char *want[] = {"cpu_offload needs 1.55 GB at any rank count", "infinity fits from 4 ranks",
                          "infinity --offload-params nvme keeps 0 GB there"};
    for (int i = 0; i < 3; i++)
        if (!strstr(hint, want[i])) fail_msg("no \"%s\" in: %s", want[i], hint);
}

static void test_binary_measure(void **state) {
    (void)state;
    // the stages' own declared layouts against the closed forms, with and
    // without padding, through the binary that links every strategy
    const char *cmds[] = {"mpirun -np 4 ./memory_math --measure --model small --json",
                          "mpirun -np 3 ./memory_math --measure --model small --json",
                          "mpirun -np 5 ./memory_math --measure --params 123457 --json",
                          "mpirun -np 2 ./memory_math --measure --params 5 --json"};
    for (int i = 0; i < 4; i++) {
        char *out = NULL;
        int rc = test_run(cmds[i], &out);
        if (rc != 0 || !strstr(out, "\"all_equal\":true") || strstr(out, "DIFFERENT"))
            fail_msg("%s: exit %d, output:\n%s", cmds[i], rc, out);
        free(out);
    }
}

static void test_binary_paper_json(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("./memory_math --params 7.5B --ranks 64 --json", &out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "\"formula_bytes\":120000000000"));
    assert_non_null(strstr(out, "\"formula_bytes\":31406250000"));
    assert_non_null(strstr(out, "\"formula_bytes\":16640625000"));
    assert_non_null(strstr(out, "\"formula_bytes\":1875000000"));
    assert_non_null(strstr(out, "\"params_padded\":7500001280"));
    free(out);
}

// DeepSpeed's estimators beside ours, from their closed forms worked here by
// hand for gpt2-1558m (Ψ = 1,557,686,400 with wte stored as 50,304 rows, its
// largest module, 50304 x 1600) at N = 8: ZeRO-2 2Ψ + 18Ψ/N = 6.6201672 GB
// against our 5.841324; ZeRO-3 4L + 18Ψ/N = 3.82674 GB; offload's CPU
// Ψ·max(4N,16)·1.5 per node.
static void test_binary_deepspeed_estimate(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("./memory_math --model gpt2-1558m --ranks 8 --json", &out);
    assert_int_equal(rc, 0);
    const char *s = strstr(out, "\"deepspeed_estimate\"");
    if (!s) fail_msg("no deepspeed_estimate section:\n%.300s", out);
    double psi = 1557686400.0, L = 50304.0 * 1600, n = 8;
    double want[4][2] = {{2 * psi + floor(18 * psi / n), 4 * psi * n * 1.5},
                         {2 * psi, psi * 32 * 1.5},
                         {4 * L + floor(18 * psi / n), 4 * L * n * 1.5},
                         {4 * L, 18 * psi * 1.5}};
    double gpu[4], cpu[4];
    const char *row = s;
    for (int i = 0; i < 4; i++) {
        row = strstr(row + 1, "{\"deepspeed\":");
        assert_non_null(row);
        assert_int_equal(json_numbers(row, "gpu_gb", &gpu[i], 1), 1);
        assert_int_equal(json_numbers(row, "cpu_gb", &cpu[i], 1), 1);
        if (fabs(gpu[i] * 1e9 - want[i][0]) > 1 || fabs(cpu[i] * 1e9 - want[i][1]) > 1)
            fail_msg("row %d: GPU %.0f CPU %.0f bytes, by hand %.0f and %.0f", i, gpu[i] * 1e9, cpu[i] * 1e9,
                     want[i][0], want[i][1]);
    }
    double ours = NAN;
    json_numbers(strstr(s, "\"stage\":\"zero2\""), "device_gb", &ours, 1);
    assert_true(fabs(ours - 5.841324) < 1e-6);
    // with --grad-accum-dtype fp32 the workbench keeps DeepSpeed's fp32 partition too: 2Ψ + 18Ψ/N, its 6.620 GB
    double accum = NAN;
    json_numbers(strstr(s, "\"stage\":\"zero2\""), "device_gb_fp32_accum", &accum, 1);
    assert_true(fabs(accum * 1e9 - want[0][0]) <= 1);
    assert_non_null(strstr(s, "4 (fp32 gradients"));
    assert_non_null(strstr(s, "--grad-accum-dtype fp32"));
    free(out);
}

// With a model and a batch, "fits" counts what the run allocates: the
// figure memory_math prints for a stage is the count the trainer's budget
// check makes (its --json record's device_need), to the byte; a model whose
// activations alone exceed the budget fits nowhere.
static double stage_total(const char *json, const char *stage) {
    char key[96];
    snprintf(key, sizeof key, "{\"stage\":\"%s\",", stage);
    const char *section = strstr(json, "\"fit_run\"");
    if (!section) fail_msg("memory_math prints no fit_run section:\n%.400s", json);
    const char *row = strstr(section, key);
    if (!row) fail_msg("memory_math prints no fit_run row for %s:\n%.400s", stage, json);
    double gb = NAN;
    json_numbers(row, "total_gb", &gb, 1);
    return gb * 1e9;
}

// memory_math --pp 4 with m = 8 (issue 48's staircase): each pipeline
// stage's micro-batches in flight are 4, 3, 2, 1 under 1F1B and ZB-H1 and 8
// under AFAB (ZB-H1's waiting for their W 1, 2, 3, 4), interleaved's chunk
// micro-batches at --pp 2, m = 4 and 2 chunks 5 and 3, and its activations and device peak are what 3d_parallel measures
// for that stage's rank (its activations, and the peak of the formula's
// timeline that every measured boundary equals), to the byte.
static void test_binary_pipeline_staircase(void **state) {
    (void)state;
    char root[64];
    assert_int_equal(test_make_dir(root, sizeof root, "mm-pipe"), 0);
    // small has 4 layers: interleaved's 2 chunks per stage at --pp 2 (m = 4)
    const char *schedules[] = {"1f1b", "afab", "zb-h1", "interleaved --virtual-stages 2"};
    for (int k = 0; k < 4; k++) {
        char cmd[1024], json[256], *mm = NULL, *run = NULL;
        int P = k == 3 ? 2 : 4, micro = k == 3 ? 4 : 8;
        snprintf(cmd, sizeof cmd, "./memory_math --model small --ranks %d --pp %d --grad-accum %d --batch 2 --seq-len "
                 "64 --schedule %s --json", P, P, micro, schedules[k]);
        assert_int_equal(test_run(cmd, &mm), 0);
        snprintf(json, sizeof json, "%s/%d.json", root, k);
        snprintf(cmd, sizeof cmd, "mpirun -np %d ./3d_parallel --model small --pp %d --grad-accum %d --batch 2 "
                 "--seq-len 64 --schedule %s --steps 2 --eval-every 0 --quiet --json %s > /dev/null && tail -1 %s", P, P,
                 micro, schedules[k], json, json);
        assert_int_equal(test_run(cmd, &run), 0);
        json_error_t e;
        json_t *m = json_loads(mm, 0, &e), *r = json_loads(run, 0, &e);
        if (!m || !r) fail_msg("--schedule %s: not JSON (%s)", schedules[k], e.text);
        json_t *rows = json_object_get(json_object_get(m, "pipeline"), "stages");
        json_t *ranks = json_object_get(json_object_get(r, "grid"), "ranks");
        json_t *panels = json_object_get(json_object_get(r, "memory_timeline"), "panels");
        if (json_array_size(rows) != (size_t)P || json_array_size(ranks) != (size_t)P ||
            json_array_size(panels) != (size_t)P)
            fail_msg("--schedule %s: %zu stages in memory_math, %zu ranks and %zu panels in the run", schedules[k],
                     json_array_size(rows), json_array_size(ranks), json_array_size(panels));
        if (!json_is_true(json_object_get(json_object_get(r, "memory_timeline"), "equal_on_every_rank")))
            fail_msg("--schedule %s: a rank's measured timeline differs from its formula's", schedules[k]);
        for (int s = 0; s < P; s++) {
            json_t *row = json_array_get(rows, (size_t)s), *rank = NULL, *panel = NULL;
            for (size_t q = 0; q < (size_t)P; q++) {
                json_t *a = json_array_get(ranks, q), *b = json_array_get(panels, q);
                if (json_integer_value(json_object_get(a, "stage")) == s) rank = a;
                if (json_integer_value(json_object_get(b, "of_rank")) == s) panel = b;  // tp 1, dp 1: rank = stage
            }
            if (!rank || !panel) fail_msg("--schedule %s: no rank or panel of stage %d in the run", schedules[k], s);
            int flight = (int)json_number_value(json_object_get(row, "in_flight"));
            // AFAB: all m; interleaved: chunk micro-batches, 2(P - s - 1) + (v - 1)P + 1; else P - s
            int want = k == 1 ? 8 : k == 3 ? 2 * (P - s - 1) + P + 1 : 4 - s;
            double acts = json_number_value(json_object_get(row, "activations_mb")) * 1e6;
            double peak = json_number_value(json_object_get(row, "peak_mb")) * 1e6;
            double measured = json_number_value(json_object_get(rank, "activations"));
            double formula_peak = json_number_value(json_object_get(panel, "formula_peak"));
            if (flight != want || json_integer_value(json_object_get(rank, "peak_in_flight")) != want)
                fail_msg("--schedule %s stage %d: %d in flight by memory_math, %lld in the run; %d by the schedule",
                         schedules[k], s, flight, json_integer_value(json_object_get(rank, "peak_in_flight")), want);
            // zb-h1: s + 1 micro-batches waiting for their W (stage s), by memory_math and in the run
            int waiting = (int)json_number_value(json_object_get(row, "w_waiting"));
            if (k == 2 && (waiting != s + 1 || json_integer_value(json_object_get(rank, "w_pending")) != s + 1))
                fail_msg("zb-h1 stage %d: %d waiting for W by memory_math, %lld in the run; want %d", s, waiting,
                         json_integer_value(json_object_get(rank, "w_pending")), s + 1);
            if (fabs(acts - measured) > 0.5 || fabs(peak - formula_peak) > 0.5)
                fail_msg("--schedule %s stage %d: activations %.0f and peak %.0f by memory_math; the run %.0f and %.0f",
                         schedules[k], s, acts, peak, measured, formula_peak);
            print_message("--schedule %s stage %d: %d in flight, activations %.0f B, peak %.0f B, as the run\n",
                          schedules[k], s, flight, measured, formula_peak);
        }
        json_decref(m);
        json_decref(r);
        free(mm);
        free(run);
    }
    assert_int_equal(test_remove_dir(root), 0);
}

static void test_binary_fit_counts_the_run(void **state) {
    (void)state;
    char *mm = NULL, *out = NULL;
    const char *stages[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload"};
    const char *modes[] = {"none", "selective", "full"};
    char root[64];
    assert_int_equal(test_make_dir(root, sizeof root, "mm-fit"), 0);
    for (int m = 0; m < 3; m++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./memory_math --hbm-gb 1 --ranks 2 --model small --batch 4 --seq-len 64 "
                 "--recompute %s --json", modes[m]);
        assert_int_equal(test_run(cmd, &mm), 0);
        for (int i = 0; i < 5; i++) {
            snprintf(cmd, sizeof cmd, "mpirun -np 2 ./%s --model small --batch 4 --seq-len 64 --steps 1 "
                     "--recompute %s --eval-batches 1 --quiet --json %s/%s.json > /dev/null && tail -1 %s/%s.json",
                     stages[i], modes[m], root, stages[i], root, stages[i]);
            assert_int_equal(test_run(cmd, &out), 0);
            double need = NAN;
            if (json_numbers(strstr(out, "\"device_need\""), "total", &need, 1) != 1)
                fail_msg("%s: no device_need in its record:\n%.300s", stages[i], out);
            double mine = stage_total(mm, stages[i]);
            if (fabs(mine - need) > 1)
                fail_msg("%s --recompute %s: memory_math counts %.0f B, the trainer %.0f B", stages[i], modes[m], mine,
                         need);
            free(out);
        }
        free(mm);
    }
    // 3d_parallel's row: --tp 2 (pp 1, dp 1), with sequence parallelism or partitioned checkpoints;
    // Ulysses' --cp 2 (its all-to-all buffers, the core's output kept twice), under full recompute and tiles too
    const char *tp_flags[] = {"--tp 2", "--tp 2 --sequence-parallel --recompute selective",
                              "--tp 2 --recompute full --partition-activations --offload-activations", "--cp 2",
                              "--cp 2 --recompute full --tiled-mlp 2 --tiled-loss 2"};
    const char *tp_rows[] = {"3d_parallel --tp 2", "3d_parallel --tp 2 --sp", "3d_parallel --tp 2 --pa",
                             "3d_parallel --tp 1 --cp 2", "3d_parallel --tp 1 --cp 2"};
    for (int i = 0; i < 5; i++) {
        char cmd[640];
        snprintf(cmd, sizeof cmd, "./memory_math --hbm-gb 1 --ranks 2 --model small --batch 4 --seq-len 64 %s --json",
                 tp_flags[i]);
        assert_int_equal(test_run(cmd, &mm), 0);
        snprintf(cmd, sizeof cmd, "mpirun -np 2 ./3d_parallel --model small --batch 4 --seq-len 64 --steps 1 %s "
                 "--eval-batches 1 --quiet --json %s/3d.json > /dev/null && tail -1 %s/3d.json", tp_flags[i], root, root);
        assert_int_equal(test_run(cmd, &out), 0);
        double need = NAN;
        if (json_numbers(strstr(out, "\"device_need\""), "total", &need, 1) != 1)
            fail_msg("3d_parallel %s: no device_need in its record:\n%.300s", tp_flags[i], out);
        double mine = stage_total(mm, tp_rows[i]);
        if (fabs(mine - need) > 1) fail_msg("%s: memory_math counts %.0f B, the trainer %.0f B", tp_flags[i], mine, need);
        free(out);
        free(mm);
    }
    assert_int_equal(test_remove_dir(root), 0);
    // the case: 61 GB of activations per rank; model states alone would fit zero1 (8.6 GB)
    assert_int_equal(test_run("./memory_math --model gpt2-1558m --ranks 8 --hbm-gb 16 --batch 8 --seq-len 1024 "
                              "--json", &out), 0);
    if (!strstr(out, "\"fits\":\"none\"")) fail_msg("gpt2-1558m, B 8, T 1024 fits somewhere in 16 GB:\n%s", out);
    free(out);
    // with full recompute the same run fits in 80 GB at every ZeRO stage: each block keeps its input alone
    assert_int_equal(test_run("./memory_math --model gpt2-1558m --ranks 8 --hbm-gb 80 --batch 8 --seq-len 1024 "
                              "--recompute full --json", &out), 0);
    const char *fits = strstr(out, "\"fits\":\"");
    if (!fits) fail_msg("no fits line:\n%s", out);
    const char *want[] = {"zero1 (", "zero2 (", "zero3 (", "cpu_offload (", "infinity ("};
    for (int i = 0; i < 5; i++)
        if (!strstr(fits, want[i])) fail_msg("gpt2-1558m --recompute full: %s does not fit in 80 GB:\n%.300s", want[i], fits);
    free(out);
}

// A run memory_math says does not fit is refused by the trainer's budget
// check before anything is allocated, and the same run with full recompute
// fits by both counts (the count itself is compared above).
static void test_binary_refusal_agrees(void **state) {
    (void)state;
    char *mm = NULL, *out = NULL;
    const char *run = "--model gpt2-1558m --batch 8 --seq-len 1024 --hbm-gb 24";
    char cmd[512];
    snprintf(cmd, sizeof cmd, "./memory_math --ranks 2 %s --json", run);
    assert_int_equal(test_run(cmd, &mm), 0);
    double none = stage_total(mm, "zero3");
    free(mm);
    snprintf(cmd, sizeof cmd, "./memory_math --ranks 2 %s --recompute full --json", run);
    assert_int_equal(test_run(cmd, &mm), 0);
    double full = stage_total(mm, "zero3");
    free(mm);
    if (!(none > 24e9 && full < 24e9)) fail_msg("zero3 at 2 ranks: %.3g B without recompute, %.3g with full", none, full);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero3 %s --steps 1 2>&1", run);
    int rc = test_run(cmd, &out);
    if (rc != 2 || !strstr(out, "zero3 needs")) fail_msg("%s: exit %d, expected the budget check's refusal:\n%s", cmd, rc, out);
    free(out);
}

static void test_binary_bad_input(void **state) {
    (void)state;
    const char *cmds[] = {"./memory_math --bogus", "./memory_math --ranks 0", "./memory_math --params -5",
                          "./memory_math --model nope", "./memory_math --pp 2",
                          "./memory_math --model small --pp 5", "./memory_math --model small --ranks 6 --pp 4",
                          "./memory_math --model small --pp 2 --schedule zb",
                          "./memory_math --model small --schedule zb-h1",
                          "./memory_math --model small --pp 2 --schedule zb-h1 --tiled-mlp 2",
                          "./memory_math --model small --pp 2 --virtual-stages 2",
                          "./memory_math --model small --pp 2 --schedule interleaved --virtual-stages 3",
                          "./memory_math --model small --schedule afab", "./memory_math --model tiny --cp 4",
                          "./memory_math --model small --cp 2 --cp-mode ring --seq-len 30",
                          "./memory_math --model small --cp 2 --attention materialized",
                          "./memory_math --model small --cp 2 --seq-len 33", "./memory_math --cp 2"};
    for (int i = 0; i < 18; i++) {
        char *out = NULL;
        int rc = test_run(cmds[i], &out);
        int lines = 0;
        for (char *c = out; *c; c++) lines += *c == '\n';
        if (rc != 2 || lines != 1) fail_msg("%s: exit %d, %d lines:\n%s", cmds[i], rc, lines, out);
        free(out);
    }
}

// The planner: with no latency, each stage's comm time is its ring bytes
// over the link, its compute the model FLOPs of its tokens over the rate,
// and the step with nothing hidden their sum; zero3's comm is 1.5 zero2's.
static double plan_number(const char *json, const char *stage, const char *key) {
    char at[96];
    snprintf(at, sizeof at, "{\"stage\":\"%s\",", stage);
    const char *section = strstr(json, "\"step_time\"");
    if (!section) fail_msg("memory_math prints no step_time section:\n%.400s", json);
    const char *row = strstr(section, at);
    if (!row) fail_msg("no step_time row for %s:\n%.400s", stage, section);
    double v = NAN;
    json_numbers(row, key, &v, 1);
    return v;
}

static void expect_close(const char *what, const char *stage, double got, double want) {
    if (!test_close(got, want, 1e-9, 1e-6))
        fail_msg("%s of %s: memory_math says %.9g, the formula %.9g", what, stage, got, want);
}

static void test_binary_planner(void **state) {
    (void)state;
    char *out = NULL;
    int rc = test_run("./memory_math --model small --ranks 4 --batch 2 --link-gbps 0.2 --gflops 10 --json", &out);
    assert_int_equal(rc, 0);
    GPTConfig cfg;
    GPTLayout l;
    assert_true(gpt_preset("small", &cfg));
    gpt_layout(&l, &cfg);
    int T = cfg.max_seq_len;
    double compute_ms = gpt_flops_per_token(&l, T) * 2 * T / 10e9 * 1e3, link_bytes_per_ms = 0.2e9 / 8 / 1e3;
    const char *stages[] = {"dp_baseline", "zero1", "zero2", "zero3"};
    for (int i = 0; i < 4; i++) {
        double bytes = 2 * stage_comm_elems((StageId)i, (double)l.num_params, 4, 1);
        expect_close("comm bytes", stages[i], plan_number(out, stages[i], "comm_bytes"), bytes);
        expect_close("comm ms", stages[i], plan_number(out, stages[i], "comm_ms"), bytes / link_bytes_per_ms);
        expect_close("compute ms", stages[i], plan_number(out, stages[i], "compute_ms"), compute_ms);
        expect_close("step ms", stages[i], plan_number(out, stages[i], "step_serial_ms"),
                     compute_ms + bytes / link_bytes_per_ms);
    }
    double ratio = plan_number(out, "zero3", "comm_ms") / plan_number(out, "zero2", "comm_ms");
    if (fabs(ratio - 1.5) > 1e-3) fail_msg("zero3's comm over zero2's: %.4f, the formulas 1.5", ratio);
    free(out);
    // the planner needs both rates and a model: one line, exit 2
    const char *bad[] = {"./memory_math --model small --link-gbps 1", "./memory_math --link-gbps 1 --gflops 5"};
    for (int i = 0; i < 2; i++) {
        rc = test_run(bad[i], &out);
        if (rc != 2 || !strstr(out, "error") || strchr(out, '\n') != out + strlen(out) - 1)
            fail_msg("%s: exit %d, expected one line and exit 2:\n%s", bad[i], rc, out);
        free(out);
    }
}

// zero3's ZeRO++ in memory_math: the bytes in the host and the secondary
// partition its section prints are those zero3 counts, the fit row with the
// switches given is zero3's budget count, the planner times a host's bytes
// across hosts on the link, and bad switches are refused as zero3 refuses them.
static double mode_number(const char *json, const char *mode, const char *key) {
    char at[96];
    snprintf(at, sizeof at, "{\"mode\":\"%s\",", mode);
    const char *row = strstr(json, at);
    if (!row) fail_msg("no ZeRO++ row %s:\n%.400s", mode, json);
    double v = NAN;
    json_numbers(row, key, &v, 1);
    return v;
}

static void test_binary_zeropp(void **state) {
    (void)state;
    char *mm = NULL, *out = NULL, root[64], cmd[640];
    const char *switches = "--quantize-weights --hpz-size 2 --quantize-grads";
    assert_int_equal(test_make_dir(root, sizeof root, "mm-zeropp"), 0);
    snprintf(cmd, sizeof cmd, "./memory_math --hbm-gb 1 --ranks 2 --ranks-per-host 2 --model small --batch 4 --seq-len 64 "
             "%s --json", switches);
    assert_int_equal(test_run(cmd, &mm), 0);
    snprintf(cmd, sizeof cmd, "mpirun -np 2 ./zero3 --model small --batch 4 --seq-len 64 --steps 1 --eval-batches 1 %s "
             "--quiet --json %s/z.json > /dev/null && tail -1 %s/z.json", switches, root, root);
    assert_int_equal(test_run(cmd, &out), 0);
    double need = NAN, intra = NAN, secondary = NAN;
    json_numbers(strstr(out, "\"device_need\""), "total", &need, 1);
    json_numbers(strstr(out, "\"zeropp\""), "intra_host_bytes_per_step", &intra, 1);
    json_numbers(strstr(out, "\"zeropp\""), "secondary_bytes", &secondary, 1);
    if (fabs(stage_total(mm, "zero3++") - need) > 1)
        fail_msg("zero3 %s: memory_math counts %.0f B, the trainer %.0f B", switches, stage_total(mm, "zero3++"), need);
    if (fabs(mode_number(mm, "zero3++", "in_host_bytes") - intra) > 1 ||
        mode_number(mm, "zero3++", "secondary_bytes") != secondary)
        fail_msg("zero3++: memory_math %.0f B in the host, params_hpz %.0f B; zero3 counts %.0f and %.0f",
                 mode_number(mm, "zero3++", "in_host_bytes"), mode_number(mm, "zero3++", "secondary_bytes"), intra,
                 secondary);
    free(mm), free(out);
    assert_int_equal(test_remove_dir(root), 0);
    // the planner on 2 hosts of 2: a host's link carries its 2 ranks' bytes across hosts
    assert_int_equal(test_run("./memory_math --model small --ranks 4 --batch 2 --ranks-per-host 2 --link-gbps 0.2 "
                              "--gflops 10 --json", &mm), 0);
    double across = mode_number(mm, "zero3++", "across_bytes"), link_bytes_per_ms = 0.2e9 / 8 / 1e3;
    expect_close("comm bytes", "zero3++", plan_number(mm, "zero3++", "comm_bytes"), 2 * across);
    expect_close("comm ms", "zero3++", plan_number(mm, "zero3++", "comm_ms"), 2 * across / link_bytes_per_ms);
    if (!(plan_number(mm, "zero3++", "comm_ms") < plan_number(mm, "zero3", "comm_ms") / 2))
        fail_msg("zero3++ should spend less than half of zero3's time on the link:\n%.600s", strstr(mm, "step_time"));
    free(mm);
    const char *bad[] = {"./memory_math --model small --ranks 4 --ranks-per-host 2 --hpz-size 4",
                         "./memory_math --model small --ranks 4 --ranks-per-host 3",
                         "./memory_math --ranks 4 --quantize-grads"};
    for (int i = 0; i < 3; i++) {
        int rc = test_run(bad[i], &out);
        if (rc != 2 || !strstr(out, "error") || strchr(out, '\n') != out + strlen(out) - 1)
            fail_msg("%s: exit %d, expected one line and exit 2:\n%s", bad[i], rc, out);
        free(out);
    }
}

// Issue 49 item 5: the mean over ranks was a loop over every rank of a loop
// over every rank, with a stack array of --ranks counts: 37 s at 8192
// ranks, and SIGSEGV at the flag's maximum. The closed form is the mean of
// every rank's own bytes (zeropp_hop_bytes), and the maximum answers at once.
static void test_zeropp_mean_of_every_rank(void **state) {
    (void)state;
    const char *models[] = {"tiny", "small"};
    const int ranks[][2] = {{4, 2}, {6, 3}, {12, 4}, {12, 12}, {30, 5}};  // N, P
    const ZeroPPConfig modes[] = {{.hpz = 1, .grad_bits = 8, .block = 256},
                                  {.quantize_grads = 1, .hpz = 1, .grad_bits = 8, .block = 256},
                                  {.quantize_weights = 1, .quantize_grads = 1, .hpz = 1, .grad_bits = 4, .block = 96},
                                  {.quantize_weights = 1, .quantize_grads = 1, .hpz = 2, .grad_bits = 8, .block = 40}};
    for (int m = 0; m < 2; m++)
        for (int r = 0; r < 5; r++)
            for (int c = 0; c < 4; c++) {
                GPTConfig cfg;
                GPTLayout l;
                Partition p;
                assert_true(gpt_preset(models[m], &cfg));
                gpt_layout(&l, &cfg);
                int N = ranks[r][0], hosts = N / ranks[r][1];
                partition_init(&p, l.num_params, N, 0);
                size_t cap = zero_bucket_elems(0.05, &p);  // several buckets, each across several shards
                HopBytes mean, one, sum = {0};
                zeropp_hop_bytes_mean(&l, &p, hosts, 1, cap, &modes[c], &mean);
                for (int q = 0; q < N; q++) {
                    zeropp_hop_bytes(&l, &p, hosts, 1, cap, &modes[c], q, &one);
                    for (int h = 0; h < HOP_COUNT; h++) sum.intra[h] += one.intra[h], sum.cross[h] += one.cross[h];
                }
                for (int h = 0; h < HOP_COUNT; h++)
                    if (!test_close(mean.intra[h], sum.intra[h] / N, 1e-6, 1e-12) ||
                        !test_close(mean.cross[h], sum.cross[h] / N, 1e-6, 1e-12) ||
                        mean.collectives[h] != one.collectives[h])
                        fail_msg("%s N=%d H=%d mode %d hop %d: mean %.6f/%.6f (%g), every rank's %.6f/%.6f (%g)",
                                 models[m], N, hosts, c, h, mean.intra[h], mean.cross[h], mean.collectives[h],
                                 sum.intra[h] / N, sum.cross[h] / N, one.collectives[h]);
            }
}

static void test_binary_zeropp_at_most_ranks(void **state) {
    (void)state;
    const char *runs[] = {"--ranks 1048576 --ranks-per-host 2",
                          "--ranks 1048576 --ranks-per-host 2 --quantize-weights --hpz-size 2 --quantize-grads",
                          "--ranks 65536 --ranks-per-host 8 --quantize-grads --link-gbps 100 --gflops 1000"};
    for (int i = 0; i < 3; i++) {
        char cmd[256], *out = NULL;
        snprintf(cmd, sizeof cmd, "timeout 30 ./memory_math --model tiny %s --json", runs[i]);
        int rc = test_run(cmd, &out);
        if (rc != 0 || !strstr(out, "\"zeropp\":{\"modes\""))
            fail_msg("%s: exit %d (124: over 30 s), expected the ZeRO++ modes:\n%.300s", cmd, rc, out);
        // zero3's rings cross hosts on H of their N links: with P = 2 as many bytes across as inside
        double across = mode_number(out, "zero3", "across_bytes"), in_host = mode_number(out, "zero3", "in_host_bytes");
        if (i < 2 && !(across > 0 && across == in_host))
            fail_msg("%s: zero3 moves %.2f B in the host and %.2f B across", cmd, in_host, across);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paper_example),
        cmocka_unit_test(test_binary_pipeline_staircase),
        cmocka_unit_test(test_binary_fit_counts_the_run),
        cmocka_unit_test(test_binary_refusal_agrees),
        cmocka_unit_test(test_partition_padding),
        cmocka_unit_test(test_closed_forms_check_the_allocator),
        cmocka_unit_test(test_padding_rule),
        cmocka_unit_test(test_infinity_descriptors),
        cmocka_unit_test(test_states_init_values),
        cmocka_unit_test(test_states_init_ranges),
        cmocka_unit_test(test_comm_elems),
        cmocka_unit_test(test_transfer_bytes),
        cmocka_unit_test(test_korthikanti),
        cmocka_unit_test(test_max_params_round_trip),
        cmocka_unit_test(test_fit_hint),
        cmocka_unit_test(test_binary_measure),
        cmocka_unit_test(test_binary_paper_json),
        cmocka_unit_test(test_binary_deepspeed_estimate),
        cmocka_unit_test(test_binary_zeropp),
        cmocka_unit_test(test_binary_bad_input),
        cmocka_unit_test(test_binary_planner),
        cmocka_unit_test(test_zeropp_mean_of_every_rank),
        cmocka_unit_test(test_binary_zeropp_at_most_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

// test_tp_layout.c: the parameter layout under tensor parallelism
// (gpt_layout_tp) against the definitions of Megatron-LM's split, written out
// here: tp = 1 is the whole model's layout, wte stored with V rounded up to
// 128 rows (llm.c's Vp); the tp ranks' parts cover the whole model (split
// tensors once, replicated ones on every rank, the rows a tp part pads past
// the whole model's on none); QKV is split by heads within each of q, k, v;
// every element starts
// from the whole model's initial value; the replicated ranges are the
// layernorms, the row-parallel biases and wpe; a tp that does not divide the
// heads is refused.
#include "testutil.h"
#include "gpt.h"

static GPTConfig config(const char *preset, int vocab, int heads, int channels) {
    GPTConfig c;
    assert_true(gpt_preset(preset, &c));
    if (vocab) c.vocab_size = vocab;
    if (heads) c.num_heads = heads;
    if (channels) c.channels = channels;
    return c;
}

// wte's rows in the whole model: V rounded up to a multiple of 128.
static size_t whole_rows(const GPTConfig *c) { return ((size_t)c->vocab_size + 127) / 128 * 128; }

// Ψ of the whole model: wte Vp*C, wpe maxT*C, per block 12C^2 + 13C, head 2C.
static size_t whole_params(const GPTConfig *c) {
    size_t C = c->channels;
    return whole_rows(c) * C + (size_t)c->max_seq_len * C + c->num_layers * (12 * C * C + 13 * C) + 2 * C;
}

// Elements identical on every tp rank: wpe, per block the two layernorms
// (4C) and the two row-parallel biases (2C), the final layernorm (2C).
static size_t replicated_params(const GPTConfig *c) {
    size_t C = c->channels;
    return (size_t)c->max_seq_len * C + c->num_layers * 6 * C + 2 * C;
}

static void test_tp1_is_the_whole_layout(void **state) {
    GPTConfig c = config("small", 250, 0, 0);
    GPTLayout a, b;
    gpt_layout(&a, &c);
    gpt_layout_tp(&b, &c, 1, 0);
    assert_memory_equal(&a, &b, sizeof a);
    assert_int_equal(a.num_params, whole_params(&c));
    assert_int_equal(a.vocab_part, 256);  // 6 padding rows
    assert_int_equal(a.vocab_padded, 256);
    assert_int_equal(gpt_real_vocab_rows(&a), 250);
    assert_int_equal(gpt_padding_params(&a), 6 * c.channels);
    size_t C = c.channels, emb = 256 * C + c.max_seq_len * C, blk = 12 * C * C + 13 * C;
    for (int u = 1; u < a.num_units; u++) assert_int_equal(a.unit[u].offset, emb + (u - 1) * blk);
    for (size_t i = 0; i < a.num_params; i++)
        if (gpt_global_index(&a, i) != i) fail_msg("tp 1: element %zu maps to %zu", i, gpt_global_index(&a, i));
}

// Every element of every rank's part maps into the whole model; counts the hits.
static void check_cover(const GPTConfig *c, int tp) {
    GPTLayout w;
    gpt_layout(&w, c);
    unsigned char *hits = calloc(w.num_params, 1);
    size_t total = 0, padding = 0, C = c->channels;
    int align = tp % 2 == 0 ? 64 * tp : 128 * tp;  // lcm(128, 64 tp)
    int padded = (c->vocab_size + align - 1) / align * align;
    for (int r = 0; r < tp; r++) {
        GPTLayout l;
        gpt_layout_tp(&l, c, tp, r);
        assert_int_equal(l.vocab_padded, padded);
        assert_int_equal(l.vocab_padded % 128, 0);
        assert_int_equal(l.vocab_part, padded / tp);
        assert_int_equal(l.vocab_part % 64, 0);
        assert_int_equal(l.vocab_begin, r * padded / tp);
        total += l.num_params;
        for (size_t i = 0; i < l.num_params; i++) {
            size_t g = gpt_global_index(&l, i);
            if (g == GPT_PADDING) {  // only wte rows past the whole model's
                assert_true(i < l.emb_off[EMB_WTE + 1]);
                assert_true(l.vocab_begin + i / C >= whole_rows(c));
                padding++;
                continue;
            }
            assert_true(g < w.num_params);
            hits[g]++;
        }
    }
    assert_int_equal(padding, (padded - whole_rows(c)) * C);
    assert_int_equal(total, whole_params(c) + (tp - 1) * replicated_params(c) + padding);
    size_t replicated = 0;
    for (size_t g = 0; g < w.num_params; g++) {
        if (hits[g] != 1 && hits[g] != tp) fail_msg("tp %d: whole element %zu held %d times", tp, g, hits[g]);
        replicated += hits[g] == tp;
    }
    assert_int_equal(replicated, replicated_params(c));
    free(hits);
}

static void test_parts_cover_the_whole_model(void **state) {
    GPTConfig small = config("small", 0, 0, 0), odd = config("small", 250, 0, 0);
    check_cover(&small, 2);
    check_cover(&small, 4);
    check_cover(&odd, 2);  // 250 -> 256: rank 1 holds the whole model's 6 padding rows
    GPTConfig three = config("tiny", 256, 3, 48);
    check_cover(&three, 3);  // 256 -> 384: rank 2 holds padding only, past the whole model's 256 rows
    GPTConfig wide = config("tiny", 300, 3, 48);
    check_cover(&wide, 3);  // 300 -> 384 at tp 1 and tp 3: no rows past the whole model's
    GPTConfig four = config("tiny", 300, 4, 0);
    check_cover(&four, 4);  // 300 -> 512 at tp 4 (a multiple of 256): 128 rows past the whole model's 384
}

// GPT-2's 50,257 tokens are stored as llm.c's 50,304 rows (a multiple of
// 128; Ψ 124,475,904 for gpt2-124m, 36,096 of them padding), at tp 1, 2 and
// 3 alike (50,304 = 131 x 384), and 50,432 at tp 4 (a multiple of 256). The
// byte-level presets' 256 tokens are already a multiple of 128: unpadded.
static void test_vocabulary_is_padded_to_128(void **state) {
    GPTConfig c = config("gpt2-124m", 0, 0, 0);
    GPTLayout l;
    gpt_layout(&l, &c);
    assert_int_equal(l.vocab_padded, 50304);
    assert_int_equal(l.vocab_part, 50304);
    assert_int_equal(l.emb_off[EMB_WTE + 1] - l.emb_off[EMB_WTE], (size_t)50304 * 768);
    assert_int_equal(l.num_params, 124475904);
    assert_int_equal(gpt_padding_params(&l), (size_t)47 * 768);
    const int tps[4] = {1, 2, 3, 4}, want[4] = {50304, 50304, 50304, 50432};
    for (int k = 0; k < 4; k++) assert_int_equal(gpt_vocab_padded(50257, tps[k]), want[k]);
    GPTConfig tiny = config("tiny", 0, 0, 0), small = config("small", 0, 0, 0);
    GPTLayout t, s;
    gpt_layout(&t, &tiny);
    gpt_layout(&s, &small);
    assert_int_equal(t.vocab_padded, 256);
    assert_int_equal(s.vocab_padded, 256);
    assert_int_equal(gpt_padding_params(&t) + gpt_padding_params(&s), 0);
}

// Rank r holds heads [r NH/T, (r+1) NH/T) of each of q, k, v (QKV rows), the
// matching rows of the MLP's first linear, and the matching input columns of
// the projections after them.
static void test_split_follows_megatron(void **state) {
    GPTConfig c = config("small", 0, 0, 0);  // C 128, 4 heads
    GPTLayout w, l;
    gpt_layout(&w, &c);
    int T = 2, r = 1;
    gpt_layout_tp(&l, &c, T, r);
    size_t C = c.channels, Cp = C / T, F = 4 * C / T;
    int u = gpt_unit_block(2);
    size_t lo = l.unit[u].offset, wo = w.unit[u].offset;
    // k's head rows: local row Cp + 3 is row C + r Cp + 3 of the whole QKV weight
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_QKVW] + (Cp + 3) * C + 5),
                     wo + w.blk_off[BLK_QKVW] + (C + r * Cp + 3) * C + 5);
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_QKVB] + 2 * Cp + 7),
                     wo + w.blk_off[BLK_QKVB] + 2 * C + r * Cp + 7);  // v's bias
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_ATTPROJW] + 9 * Cp + 2),
                     wo + w.blk_off[BLK_ATTPROJW] + 9 * C + r * Cp + 2);
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_FCW] + 11 * C + 1),
                     wo + w.blk_off[BLK_FCW] + (r * F + 11) * C + 1);
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_FCPROJW] + 5 * F + 4),
                     wo + w.blk_off[BLK_FCPROJW] + 5 * 4 * C + r * F + 4);
    assert_int_equal(gpt_global_index(&l, lo + l.blk_off[BLK_ATTPROJB] + 6), wo + w.blk_off[BLK_ATTPROJB] + 6);
    assert_int_equal(gpt_global_index(&l, l.emb_off[EMB_WTE] + 3 * C + 8), (128 + 3) * C + 8);
    assert_int_equal(l.unit[u].count, 2 * C + 3 * Cp * C + 3 * Cp + C * Cp + C + 2 * C + F * C + F + C * F + C);
    assert_int_equal(gpt_tensor_split(&l, u, BLK_QKVB), TP_COLUMN);
    assert_int_equal(gpt_tensor_split(&l, u, BLK_FCPROJW), TP_ROW);
    assert_int_equal(gpt_tensor_split(&l, u, BLK_FCPROJB), TP_REPLICATED);
    assert_int_equal(gpt_tensor_split(&l, GPT_UNIT_EMBED, EMB_WTE), TP_VOCAB);
}

static void check_init(const GPTConfig *c, int tp) {
    GPTLayout w;
    gpt_layout(&w, c);
    float *whole = malloc(w.num_params * sizeof(float));
    gpt_init_values(&w, 77, 0, w.num_params, whole);
    for (int r = 0; r < tp; r++) {
        GPTLayout l;
        gpt_layout_tp(&l, c, tp, r);
        float *part = malloc((l.num_params + 64) * sizeof(float));
        gpt_init_values(&l, 77, 0, l.num_params + 64, part);  // 64 elements of shard padding
        for (size_t i = 0; i < l.num_params + 64; i++) {
            size_t g = i < l.num_params ? gpt_global_index(&l, i) : GPT_PADDING;
            float want = g == GPT_PADDING ? 0.0f : whole[g];
            if (memcmp(&part[i], &want, sizeof want) != 0)
                fail_msg("tp %d rank %d: element %zu starts at %g, its whole-model element at %g", tp, r, i, part[i], want);
        }
        size_t begin = l.num_params / 3, end = begin + 5000;  // a shard's range draws the same
        float *shard = malloc((end - begin) * sizeof(float));
        gpt_init_values(&l, 77, begin, end, shard);
        assert_memory_equal(shard, part + begin, (end - begin) * sizeof(float));
        free(shard);
        free(part);
    }
    free(whole);
}

static void test_init_follows_the_whole_model(void **state) {
    GPTConfig odd = config("small", 250, 0, 0), three = config("tiny", 256, 3, 48);
    check_init(&odd, 2);
    check_init(&odd, 4);
    check_init(&three, 3);
}

// The whole model's initial weights are drawn from each element's index in
// the unpadded model (wte of V rows): padding wte took no draw, so every real
// weight starts where it started before wte was padded, bit for bit, and the
// padding rows at zero. FNV-1a 64 of the real weights' fp32 bits in order,
// against the hash of the same model's weights before the padding (computed
// on the tree of 687bb11, whose wte had V rows).
static uint64_t real_weights_hash(const GPTConfig *c, uint64_t seed) {
    GPTLayout l;
    gpt_layout(&l, c);
    float *w = malloc(l.num_params * sizeof(float));
    gpt_init_values(&l, seed, 0, l.num_params, w);
    size_t C = c->channels, real = (size_t)c->vocab_size * C, stored = whole_rows(c) * C;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < l.num_params; i++) {
        if (i >= real && i < stored) {
            assert_true(w[i] == 0.0f);
            continue;
        }
        unsigned char b[4];
        memcpy(b, &w[i], 4);
        for (int k = 0; k < 4; k++) h = (h ^ b[k]) * 1099511628211ull;
    }
    free(w);
    return h;
}

static void test_init_unchanged_by_padding(void **state) {
    GPTConfig odd = config("small", 300, 0, 0), gpt2 = config("gpt2-124m", 0, 0, 64);
    gpt2.num_layers = 1;
    gpt2.num_heads = 4;
    assert_int_equal(real_weights_hash(&odd, 1337), 0x690fbfb9d72f22faull);   // small, V 300 (384 rows)
    assert_int_equal(real_weights_hash(&gpt2, 1337), 0x6ff3f8ef4eaa1e8aull);  // gpt2-124m V, L 1, C 64
}

static void test_replicated_ranges(void **state) {
    GPTConfig c = config("small", 250, 0, 0);
    GPTLayout l;
    gpt_layout_tp(&l, &c, 2, 0);
    int L = c.num_layers;
    Range r[64];
    // wpe with block 0's ln1; per block ln2 after the attention bias; the MLP
    // bias with the next block's ln1 (the last with the final layernorm)
    int n = gpt_replicated_ranges(&l, r, 64);
    assert_int_equal(n, 1 + 2 * L);
    char *mark = calloc(l.num_params, 1);
    size_t covered = 0;
    for (int k = 0; k < n; k++) {
        if (k > 0) assert_true(r[k].offset > r[k - 1].offset + r[k - 1].count);  // merged, in order
        memset(mark + r[k].offset, 1, r[k].count);
        covered += r[k].count;
    }
    assert_int_equal(covered, replicated_params(&c));
    for (int u = 0; u < l.num_units; u++) {
        int nt = u == 0 ? EMB_NTENSORS : u == gpt_unit_head(&l) ? HEAD_NTENSORS : BLK_NTENSORS;
        const size_t *off = u == 0 ? l.emb_off : u == gpt_unit_head(&l) ? l.head_off : l.blk_off;
        for (int t = 0; t < nt; t++)
            for (size_t i = l.unit[u].offset + off[t]; i < l.unit[u].offset + off[t + 1]; i++)
                assert_int_equal(mark[i], gpt_tensor_split(&l, u, t) == TP_REPLICATED);
    }
    Range few[2];
    assert_int_equal(gpt_replicated_ranges(&l, few, 2), n);  // the count, however few fit
    assert_memory_equal(few, r, sizeof few);
    free(mark);
}

static void layout_tp3_of_4_heads(void) {
    GPTConfig c = config("small", 0, 0, 0);
    GPTLayout l;
    gpt_layout_tp(&l, &c, 3, 0);
}

static void test_tp_must_divide_heads(void **state) {
    char *err = NULL;
    int status = run_child(layout_tp3_of_4_heads, &err);
    if (status != 2 || !strstr(err, "--tp 3 does not divide --heads 4") || strchr(err, '\n') != err + strlen(err) - 1)
        fail_msg("expected exit 2 and one line about --tp 3 and 4 heads; got %d:\n%s", status, err);
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp1_is_the_whole_layout),
        cmocka_unit_test(test_parts_cover_the_whole_model),
        cmocka_unit_test(test_split_follows_megatron),
        cmocka_unit_test(test_init_follows_the_whole_model),
        cmocka_unit_test(test_vocabulary_is_padded_to_128),
        cmocka_unit_test(test_init_unchanged_by_padding),
        cmocka_unit_test(test_replicated_ranges),
        cmocka_unit_test(test_tp_must_divide_heads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

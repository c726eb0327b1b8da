// ds_config_keys.c: what each key of a DeepSpeed config means here (see
// ds_config.h): the flag it sets and how its units convert, the switches
// that are checked, and the keys known to have no knob in the workbench.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "check.h"
#include "ds_config_keys.h"

// ---- setting a flag ----

// Flags of the stages' own (the shared ones every trainer has): which stages
// declare them, so a key whose flag this binary lacks can say where it works.
static const struct {
    const char *flag, *stages;
} STAGE_FLAGS[] = {
    {"bucket-mb", "zero2 zero3 cpu_offload infinity"},
    {"prefetch", "zero3 infinity"},
    {"nvme-path", "infinity"},
    {"offload-params", "infinity"},
    {"offload-optimizer", "infinity"},
    {"sub-group-mb", "infinity"},
    {"aio-block-kb", "infinity"},
    {"aio-queue-depth", "infinity"},
    {"partition-activations", "3d_parallel"},
    {"quantize-weights", "zero3"},
    {"hpz-size", "zero3"},
    {"quantize-grads", "zero3"},
};

static void append(char *to, size_t n, const char *word) {
    size_t len = strlen(to);
    snprintf(to + len, n - len, "%s%s", len ? ", " : "", word);
}

// "ignored by zero1: sets --bucket-mb, a knob of zero2, zero3, cpu_offload"
// (and of the stages this build does not have yet).
static void ignored_elsewhere(DsApply *a, const char *key, const char *flag) {
    char built[200] = "", future[200] = "";
    for (size_t i = 0; i < sizeof STAGE_FLAGS / sizeof STAGE_FLAGS[0]; i++) {
        if (strcmp(STAGE_FLAGS[i].flag, flag) != 0) continue;
        char list[200];
        snprintf(list, sizeof list, "%s", STAGE_FLAGS[i].stages);
        for (char *save = NULL, *b = strtok_r(list, " ", &save); b; b = strtok_r(NULL, " ", &save)) {
            const DsStage *st = ds_stage_of(b);
            char named[64];
            snprintf(named, sizeof named, "%s (stage %s)", b, st ? st->id : "?");
            if (st && ds_stage_built(st)) append(built, sizeof built, b);
            else append(future, sizeof future, named);
        }
    }
    if (!built[0] && !future[0])
        settings_key(a->s, key, "ignored by %s: sets --%s of the trainers", a->binary, flag);
    else if (!future[0])
        settings_key(a->s, key, "ignored by %s: sets --%s, a knob of %s", a->binary, flag, built);
    else if (!built[0])
        settings_key(a->s, key, "ignored by %s: sets --%s, a knob of %s, which this build does not have yet",
                     a->binary, flag, future);
    else
        settings_key(a->s, key, "ignored by %s: sets --%s, a knob of %s (and of %s, not in this build yet)",
                     a->binary, flag, built, future);
}

static FlagSpec *spec(DsApply *a, const char *flag) {
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->specs[i].name, flag) == 0) return &a->specs[i];
    return NULL;
}

int ds_set_flag(DsApply *a, const char *key, const char *flag, const char *text, SettingFrom from,
                    const char *why) {
    FlagSpec *f = spec(a, flag);
    if (!f) {
        if (key) ignored_elsewhere(a, key, flag);
        return 0;
    }
    if (f->type == FLAG_STRING) text = settings_keep(a->s, text);
    char err[256];
    if (flags_parse_value(f, text, err, sizeof err)) ds_fail(a->ds, key ? key : why, "%s", err);
    if (from == FROM_CONFIG && f->given) *f->given = 1;
    settings_mark(a->s, flag, from, "%s", why);
    if (key) settings_key(a->s, key, "--%s %s", flag, text);
    return 1;
}

// x as the shortest text that reads back as the same double (3e-4 prints as
// 0.0003, not 0.00029999999999999997), so the flag gets the key's value exactly.
static const char *exact_text(double x, char *buf, size_t n) {
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    return buf;
}

static int is_one_of(const char *s, const char *list) {
    char copy[200];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = NULL, *w = strtok_r(copy, " |", &save); w; w = strtok_r(NULL, " |", &save))
        if (strcmp(w, s) == 0) return 1;
    return 0;
}

// ---- optimizer ----

void ds_apply_optimizer(DsApply *a) {
    json_t *type = ds_lookup(a->ds, "optimizer.type");
    if (!type || ds_is_auto(type)) {
        if (ds_lookup(a->ds, "optimizer.params"))
            ds_fail(a->ds, "optimizer.type", "missing: name the optimizer (\"AdamW\") for its params to mean something");
        return;
    }
    const char *t = ds_string(a->ds, "optimizer.type", type);
    if (strcasecmp(t, "AdamW") != 0 && strcasecmp(t, "Adam") != 0)
        ds_fail(a->ds, "optimizer.type", "%s is not implemented here: every trainer updates with AdamW (\"AdamW\", "
                "or \"Adam\" in its default adam_w_mode)", t);
    settings_key(a->s, "optimizer.type", "checked: AdamW; the params not given take DeepSpeed's defaults");
    // DeepSpeed's FusedAdam defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0
    static const char *const DEFAULTS[][2] = {
        {"lr", "0.001"}, {"beta1", "0.9"}, {"beta2", "0.999"}, {"adam-eps", "1e-08"}, {"weight-decay", "0"}};
    for (int i = 0; i < 5; i++) ds_set_flag(a, NULL, DEFAULTS[i][0], DEFAULTS[i][1], FROM_DS_DEFAULT, "optimizer.type AdamW");
    const char *key = "optimizer.params.betas";
    json_t *betas = ds_lookup(a->ds, key);
    if (betas && ds_is_auto(betas))
        settings_key(a->s, key, "auto: --beta1 and --beta2 keep the command line's values or the defaults above");
    if (!betas || ds_is_auto(betas)) return;
    if (!json_is_array(betas) || json_array_size(betas) != 2)
        ds_fail(a->ds, key, "expected a list of two numbers [beta1, beta2], got %s", ds_kind(betas));
    for (int i = 0; i < 2; i++) {
        double b = ds_number(a->ds, key, json_array_get(betas, (size_t)i), 0);
        if (!(b >= 0 && b < 1)) ds_fail(a->ds, key, "beta%d %g is outside [0, 1)", i + 1, b);
        char text[32], why[64];
        exact_text(b, text, sizeof text);
        snprintf(why, sizeof why, "%s[%d]", key, i);
        ds_set_flag(a, NULL, i ? "beta2" : "beta1", text, FROM_CONFIG, why);
    }
    settings_key(a->s, key, "--beta1 and --beta2");
}

// ---- scheduler ----

#define DS_SCHEDULES "WarmupLR WarmupDecayLR WarmupCosineLR"
#define DS_MAX_LR_DEFAULT 0.001  // WarmupLR's and WarmupDecayLR's warmup_max_lr

// WarmupLR and WarmupDecayLR ramp from warmup_min_lr to warmup_max_lr (and
// WarmupDecayLR back down to warmup_min_lr); here the start and end are
// fractions of --lr, so warmup_min_lr becomes warmup_min_lr / warmup_max_lr.
static void apply_warmup_min_lr(DsApply *a) {
    const char *key = "scheduler.params.warmup_min_lr";
    json_t *v = ds_lookup(a->ds, key);
    if (v && ds_is_auto(v))
        settings_key(a->s, key, "auto: --warmup-start-frac keeps the command line's value or the default");
    if (!v || ds_is_auto(v)) return;
    if (!a->scheduler || strcmp(a->scheduler, "WarmupCosineLR") == 0)
        ds_fail(a->ds, key, "is not a parameter of %s (WarmupCosineLR starts at warmup_min_ratio)",
                a->scheduler ? a->scheduler : "a config without scheduler.type");
    double lo = ds_number(a->ds, key, v, 0), hi = DS_MAX_LR_DEFAULT;
    json_t *max = ds_lookup(a->ds, "scheduler.params.warmup_max_lr");
    if (max && !ds_is_auto(max)) hi = ds_number(a->ds, "scheduler.params.warmup_max_lr", max, 0);
    if (!(lo >= 0 && lo <= hi)) ds_fail(a->ds, key, "%g must be between 0 and warmup_max_lr %g", lo, hi);
    char text[32], why[96];
    exact_text(hi > 0 ? lo / hi : 0.0, text, sizeof text);
    snprintf(why, sizeof why, "%s %g / warmup_max_lr %g", key, lo, hi);
    ds_set_flag(a, NULL, "warmup-start-frac", text, FROM_CONFIG, why);
    if (strcmp(a->scheduler, "WarmupDecayLR") == 0) ds_set_flag(a, NULL, "min-lr-frac", text, FROM_CONFIG, why);
    settings_key(a->s, key, "--warmup-start-frac %s (a fraction of --lr)", text);
}

void ds_apply_scheduler(DsApply *a) {
    json_t *type = ds_lookup(a->ds, "scheduler.type");
    if (!type || ds_is_auto(type)) {
        if (ds_lookup(a->ds, "scheduler.params"))
            ds_fail(a->ds, "scheduler.type", "missing: name the schedule (%s) for its params to mean something",
                    DS_SCHEDULES);
        return;
    }
    const char *t = ds_string(a->ds, "scheduler.type", type);
    if (!is_one_of(t, DS_SCHEDULES))
        ds_fail(a->ds, "scheduler.type", "%s is not implemented here: choose WarmupLR, WarmupDecayLR or "
                "WarmupCosineLR", t);
    a->scheduler = t;
    ds_set_flag(a, "scheduler.type", "lr-schedule", t, FROM_CONFIG, "scheduler.type");
    char why[64];
    snprintf(why, sizeof why, "scheduler.type %s", t);
    // DeepSpeed's defaults for the parameters the config leaves out
    ds_set_flag(a, NULL, "warmup", "1000", FROM_DS_DEFAULT, why);
    ds_set_flag(a, NULL, "warmup-type", "log", FROM_DS_DEFAULT, why);
    ds_set_flag(a, NULL, "warmup-start-frac", "0", FROM_DS_DEFAULT, why);
    if (strcmp(t, "WarmupCosineLR") == 0) {
        ds_set_flag(a, NULL, "min-lr-frac", "0.0001", FROM_DS_DEFAULT, why);
    } else {
        // the rate ramps to warmup_max_lr whatever the optimizer's lr says
        ds_set_flag(a, NULL, "lr", "0.001", FROM_DS_DEFAULT, why);
        ds_set_flag(a, NULL, "min-lr-frac", "0", FROM_DS_DEFAULT, why);
    }
    apply_warmup_min_lr(a);
}

// ---- keys that set one flag ----

typedef struct Rule {
    const char *key, *flag;
    char kind;           // 'i' a whole number, 'n' a number, 's' a string
    double lo, hi;       // the key's valid values (numbers), lo excluded when lo_open
    int lo_open;
    double scale;        // the flag's value = the key's x scale (0: as written)
    const char *unit;    // how the scale converts, for the record
    const char *only;    // the schedules whose parameter it is (NULL: any config)
    const char *values;  // strings: the valid ones
} Rule;

#define BIG 1e15
static const Rule RULES[] = {
    {.key = "train_batch_size", .flag = "global-batch", .kind = 'i', .lo = 1, .hi = INT_MAX},
    {.key = "train_micro_batch_size_per_gpu", .flag = "batch", .kind = 'i', .lo = 1, .hi = INT_MAX},
    {.key = "gradient_accumulation_steps", .flag = "grad-accum", .kind = 'i', .lo = 1, .hi = INT_MAX},
    {.key = "gradient_clipping", .flag = "grad-clip", .kind = 'n', .lo = 0, .hi = BIG},
    {.key = "steps_per_print", .flag = "print-every", .kind = 'i', .lo = 1, .hi = INT_MAX},
    {.key = "seed", .flag = "seed", .kind = 'i', .lo = 0, .hi = INT_MAX},
    {.key = "optimizer.params.lr", .flag = "lr", .kind = 'n', .lo = 0, .hi = BIG, .lo_open = 1},
    {.key = "optimizer.params.eps", .flag = "adam-eps", .kind = 'n', .lo = 0, .hi = 1, .lo_open = 1},
    {.key = "optimizer.params.weight_decay", .flag = "weight-decay", .kind = 'n', .lo = 0, .hi = BIG},
    {.key = "scheduler.params.warmup_num_steps", .flag = "warmup", .kind = 'i', .lo = 0, .hi = INT_MAX,
     .only = DS_SCHEDULES},
    {.key = "scheduler.params.warmup_type", .flag = "warmup-type", .kind = 's', .only = DS_SCHEDULES,
     .values = "log linear"},
    {.key = "scheduler.params.total_num_steps", .flag = "schedule-steps", .kind = 'i', .lo = 1, .hi = INT_MAX,
     .only = "WarmupDecayLR WarmupCosineLR"},
    {.key = "scheduler.params.warmup_max_lr", .flag = "lr", .kind = 'n', .lo = 0, .hi = BIG, .lo_open = 1,
     .only = "WarmupLR WarmupDecayLR"},
    {.key = "scheduler.params.warmup_min_ratio", .flag = "warmup-start-frac", .kind = 'n', .lo = 0, .hi = 1,
     .only = "WarmupCosineLR"},
    {.key = "scheduler.params.cos_min_ratio", .flag = "min-lr-frac", .kind = 'n', .lo = 0, .hi = 1,
     .only = "WarmupCosineLR"},
    {.key = "zero_optimization.reduce_bucket_size", .flag = "bucket-mb", .kind = 'n', .lo = 0, .hi = BIG,
     .lo_open = 1, .scale = 2e-6, .unit = "parameters x 2 bytes (bf16) / 1e6 = MB"},
    {.key = "zero_optimization.sub_group_size", .flag = "sub-group-mb", .kind = 'n', .lo = 0, .hi = BIG,
     .lo_open = 1, .scale = 12e-6, .unit = "parameters x 12 bytes (fp32 master, m, v) / 1e6 = MB"},
    {.key = "zero_optimization.offload_optimizer.nvme_path", .flag = "nvme-path", .kind = 's'},
    {.key = "zero_optimization.offload_param.nvme_path", .flag = "nvme-path", .kind = 's'},
    {.key = "zero_optimization.offload_param.device", .flag = "offload-params", .kind = 's',
     .values = "none cpu nvme"},
    {.key = "aio.block_size", .flag = "aio-block-kb", .kind = 'i', .lo = 1024, .hi = 1 << 30, .scale = 1.0 / 1024,
     .unit = "bytes / 1024 = KB"},
    {.key = "aio.queue_depth", .flag = "aio-queue-depth", .kind = 'i', .lo = 1, .hi = INT_MAX},
};
#undef BIG

// The value of a rule's key as the flag's text, checked against the rule.
static void rule_text(DsApply *a, const Rule *r, const json_t *v, char *text, size_t n) {
    if (r->kind == 's') {
        const char *s = ds_string(a->ds, r->key, v);
        if (r->values && !is_one_of(s, r->values)) ds_fail(a->ds, r->key, "'%s': choose one of %s", s, r->values);
        snprintf(text, n, "%s", s);
        return;
    }
    double x = ds_number(a->ds, r->key, v, r->kind == 'i');
    if (x < r->lo || (r->lo_open && x == r->lo))
        ds_fail(a->ds, r->key, "%.17g is impossible: give %s %g", x, r->lo_open ? "more than" : "at least", r->lo);
    if (x > r->hi) ds_fail(a->ds, r->key, "%.17g is more than %g, the most it can be here", x, r->hi);
    if (r->scale && r->kind == 'i' && fmod(x * r->scale, 1.0) != 0)
        ds_fail(a->ds, r->key, "%.17g is not a whole number of %s", x, r->unit);
    if (r->kind == 'i' && !r->scale) snprintf(text, n, "%lld", (long long)x);
    else exact_text(r->scale ? x * r->scale : x, text, n);
}

// stage3_prefetch_bucket_size counts parameters; --prefetch counts units,
// whose size is known only with the model (ds_config_after_model).
static void apply_prefetch(DsApply *a) {
    const char *key = "zero_optimization.stage3_prefetch_bucket_size";
    json_t *v = ds_lookup(a->ds, key);
    if (!v || ds_is_auto(v)) return;
    double x = ds_number(a->ds, key, v, 0);
    if (!(x >= 0 && x <= 1e15)) ds_fail(a->ds, key, "%g is impossible: give 0 or more parameters", x);
    if (!spec(a, "prefetch")) {
        ignored_elsewhere(a, key, "prefetch");
        return;
    }
    settings_mark(a->s, "prefetch", FROM_CONFIG, "%s %.0f parameters", key, x);
    settings_find(a->s, "prefetch")->config_value = x;
    settings_key(a->s, key, "--prefetch: the blocks whose parameters fit in %.0f", x);
}

void ds_apply_rules(DsApply *a) {
    // WarmupLR and WarmupDecayLR set the rate themselves (warmup_max_lr)
    const char *ramp = a->scheduler && strcmp(a->scheduler, "WarmupCosineLR") ? a->scheduler : NULL;
    for (size_t i = 0; i < sizeof RULES / sizeof RULES[0]; i++) {
        const Rule *r = &RULES[i];
        json_t *v = ds_lookup(a->ds, r->key);
        if (!v) continue;
        if (ramp && strcmp(r->key, "optimizer.params.lr") == 0) {
            settings_key(a->s, r->key, "ignored: %s ramps the rate to scheduler.params.warmup_max_lr", ramp);
            continue;
        }
        if (ds_is_auto(v)) {
            settings_key(a->s, r->key, "auto: --%s keeps the command line's value or its default", r->flag);
            continue;
        }
        if (r->only && !(a->scheduler && is_one_of(a->scheduler, r->only)))
            ds_fail(a->ds, r->key, "is not a parameter of %s (it belongs to %s)",
                    a->scheduler ? a->scheduler : "a config without scheduler.type", r->only);
        char text[256], why[160];
        rule_text(a, r, v, text, sizeof text);
        const Setting *prev = settings_find(a->s, r->flag);
        if (prev && prev->from == FROM_CONFIG && strcmp(r->flag, "nvme-path") == 0 &&
            strcmp(*(const char *const *)prev->flag.dst, text) != 0)
            ds_fail(a->ds, r->key, "differs from %s: infinity keeps every swap file under one --nvme-path", prev->why);
        if (r->scale) snprintf(why, sizeof why, "%s (%s)", r->key, r->unit);
        else snprintf(why, sizeof why, "%s", r->key);
        ds_set_flag(a, r->key, r->flag, text, FROM_CONFIG, why);
    }
    apply_prefetch(a);
}

// ---- switches and keys without a knob ----

typedef struct Check {
    const char *key;
    int need;            // the value the trainers honour (1, 0), or -1: either
    const char *ok;      // what the workbench does
    const char *refuse;  // why the other value cannot run (need >= 0)
} Check;

static const Check CHECKS[] = {
    {.key = "optimizer.params.adam_w_mode", .need = 1, .ok = "AdamW, decoupled weight decay",
     .refuse = "Adam with L2 regularization is not implemented; the update is AdamW (decoupled weight decay)"},
    {.key = "optimizer.params.bias_correction", .need = 1, .ok = "m and v are corrected for their bias",
     .refuse = "the AdamW here always corrects m and v for their bias"},
    {.key = "optimizer.params.amsgrad", .need = 0, .ok = "plain AdamW", .refuse = "AMSGrad is not implemented"},
    {.key = "zero_optimization.overlap_comm", .need = -1,
     .ok = "zero2, zero3, cpu_offload and infinity always overlap their bucketed reduce-scatter with backward; "
           "dp_baseline and zero1 reduce after it"},
    {.key = "zero_optimization.offload_optimizer.pin_memory", .need = -1, .ok = "the host buffers are always pinned"},
    {.key = "zero_optimization.offload_param.pin_memory", .need = -1, .ok = "the host buffers are always pinned"},
    {.key = "wall_clock_breakdown", .need = -1,
     .ok = "always measured: the end-of-run table splits a step into compute, communication (exposed and "
           "hidden), copies, host optimizer and file I/O"},
};

static const struct {
    const char *key, *why;
} NO_KNOB[] = {
    {"zero_optimization.allgather_bucket_size", "the updated shard is all-gathered in one call"},
    {"zero_optimization.allgather_partitions", "the updated shards are always all-gathered"},
    {"zero_optimization.reduce_scatter", "zero2 and the stages after it always reduce-scatter the gradients"},
    {"zero_optimization.stage3_max_live_parameters", "zero3 keeps live the units in use and --prefetch ahead"},
    {"zero_optimization.stage3_max_reuse_distance", "zero3 releases a unit right after it is used"},
    {"zero_optimization.stage3_param_persistence_threshold", "zero3 gathers every unit, however small"},
    {"zero_optimization.offload_optimizer.buffer_count", "infinity swaps through three pinned sub-group slots"},
    {"zero_optimization.offload_param.buffer_count", "infinity's parameters move a unit at a time"},
    {"zero_optimization.offload_param.buffer_size", "infinity's parameters move a unit at a time"},
    {"aio.thread_count", "one submitting thread per rank"},
    {"aio.single_submit", "requests are submitted in batches"},
    {"aio.overlap_events", "completions are always reaped while new requests go in"},
};

void ds_apply_checks(DsApply *a) {
    for (size_t i = 0; i < sizeof CHECKS / sizeof CHECKS[0]; i++) {
        const Check *c = &CHECKS[i];
        json_t *v = ds_lookup(a->ds, c->key);
        if (!v || ds_is_auto(v)) continue;
        int on = ds_bool(a->ds, c->key, v);
        if (c->need >= 0 && on != c->need) ds_fail(a->ds, c->key, "%s: %s", on ? "true" : "false", c->refuse);
        settings_key(a->s, c->key, "checked: %s", c->ok);
    }
    for (size_t i = 0; i < sizeof NO_KNOB / sizeof NO_KNOB[0]; i++)
        if (ds_lookup(a->ds, NO_KNOB[i].key)) settings_key(a->s, NO_KNOB[i].key, "ignored: %s", NO_KNOB[i].why);
}

// ---- ZeRO++ (zero3's switches; memory_math plans with them) ----

void ds_apply_zeropp(DsApply *a) {
    static const struct {
        const char *key, *flag;
        int count;  // a number of ranks (1: off), or a switch
    } KEYS[] = {{"zero_optimization.zero_quantized_weights", "quantize-weights", 0},
                {"zero_optimization.zero_hpz_partition_size", "hpz-size", 1},
                {"zero_optimization.zero_quantized_gradients", "quantize-grads", 0}};
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++) {
        const char *key = KEYS[i].key, *flag = KEYS[i].flag;
        json_t *v = ds_lookup(a->ds, key);
        if (!v || ds_is_auto(v)) continue;
        char text[32] = "on";
        int on = 0;
        if (KEYS[i].count) {
            double k = ds_number(a->ds, key, v, 1);
            if (k < 1 || k > 1 << 20) ds_fail(a->ds, key, "%.17g ranks: give 1 (none) or more, up to %d", k, 1 << 20);
            on = k > 1;
            snprintf(text, sizeof text, "%.0f", k);
        } else {
            on = ds_bool(a->ds, key, v);
        }
        if (!on) {
            settings_key(a->s, key, "checked: off, as without the config (--%s not set)", flag);
            continue;
        }
        // a run without it would not be the run the config describes
        if (!spec(a, flag))
            ds_fail(a->ds, key, "is ZeRO++, which only zero3 (stage 04) has here: run zero3 with this config, or "
                    "set it to %s", KEYS[i].count ? "1" : "false");
        ds_set_flag(a, key, flag, text, FROM_CONFIG, key);
    }
}

void ds_config_after_model(Settings *s, const GPTLayout *l) {
    Setting *p = settings_find(s, "prefetch");
    if (!p || p->from != FROM_CONFIG) return;
    size_t block = l->unit[gpt_unit_block(0)].count;
    double units = floor(p->config_value / (double)block);
    if (units > l->num_units) units = l->num_units;
    *(int *)p->flag.dst = (int)units;
    size_t len = strlen(p->why);
    snprintf(p->why + len, sizeof p->why - len, " / %zu per block = %.0f units", block, units);
}

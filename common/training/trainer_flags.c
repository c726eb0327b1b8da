// trainer_flags.c: the flags every trainer shares, their defaults, and the
// checks that turn bad input into one clear line and exit status 2.
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "ds_config.h"
#include "llmc.h"
#include "flags.h"
#include "trainer.h"

// Ranges of the shared flags beyond the model's limits (gpt.h): a step count
// whose per-step records fit in memory (8 arrays of 8 bytes a step), micro-
// batches (TRAIN_MAX_GRAD_ACCUM) and validation batches that keep row
// counters far below 2^63, and a budget whose byte count fits in 64 bits. The
// learning rate and weight decay become fp32 step constants (AdamWStep), so
// the rate is at most FLT_MAX.
#define MAX_STEPS TRAIN_MAX_STEPS  // train_limits.h
#define MAX_EVAL_BATCHES (1 << 20)
#define MAX_HBM_GB 1e6

static void set_defaults(TrainConfig *c) {
    memset(c, 0, sizeof *c);
    c->model = "small";
    c->seq_len = 0;  // the model's context, at most 256
    c->batch = 4;
    c->grad_accum = 1;
    c->steps = 20;
    c->warmup = 2;
    c->eval_every = 0;
    c->eval_batches = 4;
    c->seed = 1337;
    c->lr = 1e-3;
    c->min_lr_frac = 0.1;
    c->weight_decay = 0.0;
    c->grad_clip = 1.0;
    c->device = "auto";
    c->comm = "auto";
    c->beta1 = 0.9;
    c->beta2 = 0.95;
    c->adam_eps = 1e-8;
    c->lr_schedule = "cosine";
    c->warmup_type = "log";  // DeepSpeed's default; our cosine's warm-up is linear
    c->data_order = "permuted";
    c->recompute = "none";
    c->attention = "flash";
    c->precision = "bf16";
    c->initial_scale_power = 16;  // DeepSpeed's defaults (fp16 block)
    c->loss_scale_window = 1000;
    c->hysteresis = 2;
    c->min_loss_scale = 1;
    c->print_every = 1;
}

// A refusal names a value as it was given: the config key that set it, the
// flag, or the flag's default.
static const char *named(const TrainConfig *c, const char *flag, double value, char *buf, size_t n) {
    const Setting *x = settings_find(&c->settings, flag);
    if (x && x->from == FROM_CONFIG) snprintf(buf, n, "%s %g (in %s)", x->why, value, c->settings.config_path);
    else snprintf(buf, n, "--%s %g%s", flag, value, x && x->from == FROM_DEFAULT ? " (the default)" : "");
    return buf;
}

// --inject-overflow: 1-based steps of this run's --steps, each named once.
static void check_inject_overflow(const TrainConfig *c) {
    const char *list = c->inject_overflow;
    for (const char *p = list; p && *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > MAX_STEPS || (*end && *end != ',') || (*end == ',' && !end[1]))
            fail_usage("--inject-overflow %s: give 1-based step numbers separated by commas (3,4)", list);
        if (k > c->steps)
            fail_usage("--inject-overflow %s: step %ld is past --steps %d, so it would never overflow: name steps "
                       "up to %d", list, k, c->steps, c->steps);
        for (const char *q = list; q < p;) {
            char *after;
            if (strtol(q, &after, 10) == k)
                fail_usage("--inject-overflow %s: step %ld is named twice; name each step once", list, k);
            q = after + 1;
        }
        p = *end ? end + 1 : end;
    }
}

// --precision and fp16's loss scaling, whose flags mean nothing in bf16.
static void check_precision(TrainConfig *c) {
    if (strcmp(c->precision, "bf16") && strcmp(c->precision, "fp16"))
        fail_usage("--precision %s: choose bf16 (8 exponent bits, no loss scaling) or fp16 (IEEE half, with loss "
                   "scaling)", c->precision);
    c->half = strcmp(c->precision, "fp16") == 0 ? HALF_FP16 : HALF_BF16;
    static const char *const scaling[] = {"loss-scale", "initial-scale-power", "loss-scale-window", "hysteresis",
                                          "min-loss-scale", "inject-overflow"};
    for (size_t i = 0; c->half == HALF_BF16 && i < sizeof scaling / sizeof scaling[0]; i++) {
        const Setting *x = settings_find(&c->settings, scaling[i]);
        if (x && x->from == FROM_COMMAND_LINE)
            fail_usage("--%s sets fp16's loss scaling; bf16 needs none (add --precision fp16)", scaling[i]);
        // a config's fp16 block with "enabled": "auto", or overridden by --precision bf16
        if (x && x->from == FROM_CONFIG)
            settings_key(&c->settings, x->why, "ignored: the run is bf16, which needs no loss scaling");
    }
    check_inject_overflow(c);
    const char *accum = c->grad_accum_dtype ? c->grad_accum_dtype : c->precision;
    if (strcmp(accum, "fp32") && strcmp(accum, c->precision))
        fail_usage("--grad-accum-dtype %s: choose fp32 (an fp32 accumulator beside the gradients) or %s, the "
                   "format of --precision %s", accum, c->precision, c->precision);
    c->grad_accum_fp32 = strcmp(accum, "fp32") == 0;
    if (c->half != HALF_FP16) return;
    char scale[PATH_MAX + 512], minimum[PATH_MAX + 512];  // a key's name and the config's path, whole
    named(c, "min-loss-scale", c->min_loss_scale, minimum, sizeof minimum);
    if (c->loss_scale > 0 && c->loss_scale < c->min_loss_scale)
        fail_usage("%s is below %s: give a static scale at least the minimum",
                   named(c, "loss-scale", c->loss_scale, scale, sizeof scale), minimum);
    // the dynamic scale starts at 2^K and never goes below the minimum: a minimum above the start has no room
    if (c->loss_scale == 0 && c->min_loss_scale > ldexp(1.0, c->initial_scale_power))
        fail_usage("%s is above the first dynamic scale 2^%d = %g, set by %s: give a minimum at most the first scale",
                   minimum, c->initial_scale_power, ldexp(1.0, c->initial_scale_power),
                   named(c, "initial-scale-power", c->initial_scale_power, scale, sizeof scale));
}

// The flags of the schedules, the optimizer and the formats users bring.
static void check_formats(const TrainConfig *c) {
    const Settings *s = &c->settings;
    int ours = strcmp(c->lr_schedule, "cosine") == 0;
    if (!ours && strcmp(c->lr_schedule, "WarmupLR") && strcmp(c->lr_schedule, "WarmupDecayLR") &&
        strcmp(c->lr_schedule, "WarmupCosineLR"))
        fail_usage("--lr-schedule %s: choose cosine, WarmupLR, WarmupDecayLR or WarmupCosineLR", c->lr_schedule);
    if (strcmp(c->warmup_type, "log") && strcmp(c->warmup_type, "linear"))
        fail_usage("--warmup-type %s: choose log or linear", c->warmup_type);
    // the optimizer takes the rate in fp32, where a value below FLT_MIN is subnormal or 0: no update
    char lr[PATH_MAX + 512];
    if (c->lr < FLT_MIN)
        fail_usage("%s is below %g, the smallest normal fp32 number: the optimizer computes in fp32, where this "
                   "rate is 0 or keeps few digits, so the run would learn nothing; give at least %g",
                   named(c, "lr", c->lr, lr, sizeof lr), FLT_MIN, FLT_MIN);
    if (ours && (settings_given(s, "warmup-type") || settings_given(s, "warmup-start-frac")))
        fail_usage("--warmup-type and --warmup-start-frac shape DeepSpeed's schedules; the cosine schedule warms up "
                   "linearly from lr/warmup (add --lr-schedule WarmupCosineLR)");
    int horizon = c->schedule_steps > 0 ? c->schedule_steps : c->steps;
    if (!strcmp(c->lr_schedule, "WarmupCosineLR") && horizon <= (c->warmup > 2 ? c->warmup : 2))
        fail_usage("--schedule-steps %d: WarmupCosineLR's cosine needs more steps than the warm-up (%d); "
                   "DeepSpeed's total_num_steps counts both", horizon, c->warmup > 2 ? c->warmup : 2);
    // the ranges allow a beta of 1, which would never forget: the bound is open there
    if (c->beta1 >= 1 || c->beta2 >= 1)
        fail_usage("--beta1 %g, --beta2 %g: the betas are below 1", c->beta1, c->beta2);
    if (strcmp(c->data_order, "permuted") && strcmp(c->data_order, "sequential"))
        fail_usage("--data-order %s: choose permuted or sequential (llm.c's)", c->data_order);
    if (gpt_recompute_of(c->recompute) < 0)
        fail_usage("--recompute %s: choose none (keep every activation), selective (recompute the attention "
                   "probabilities) or full (keep each block's input, run its forward again)", c->recompute);
    if (gpt_attention_of(c->attention) < 0)
        fail_usage("--attention %s: choose flash (tiles, online softmax: no (T,T) matrix is kept) or materialized "
                   "(the (T,T) probabilities kept for backward)", c->attention);
    if (c->offload_activations && strcmp(c->recompute, "full") != 0)
        fail_usage("--offload-activations moves the blocks' saved inputs to the host, and only --recompute full "
                   "keeps each block's input alone (here --recompute %s): add --recompute full", c->recompute);
    if (c->init_from && c->resume)
        fail_usage("--init-from and --resume both set the weights: a checkpoint of ours already holds them");
}

// `v` with each byte that is not part of a UTF-8 character as \xNN (malloc'd).
static char *shown_escaped(const char *v) {
    char *out = xmalloc(4 * strlen(v) + 1), *o = out;
    while (*v) {
        size_t ok = flags_utf8_prefix(v);
        memcpy(o, v, ok);
        o += ok;
        v += ok;
        if (*v) o += sprintf(o, "\\x%02x", (unsigned char)*v++);
    }
    *o = 0;
    return out;
}

// The --json record holds every setting as JSON text, which is UTF-8: a
// string that is not (a file name in Latin-1) is refused before the run,
// where it failed the record after it.
static void check_json_text(const Settings *s, const char *json) {
    for (int i = 0; json && i < s->n; i++) {
        const FlagSpec *f = &s->item[i].flag;
        const char *v = f->type == FLAG_STRING ? *(const char *const *)f->dst : NULL;
        if (!v || !v[flags_utf8_prefix(v)]) continue;
        fail_usage("--%s %s is not UTF-8 text, and the --json record holds every setting as JSON text, which must "
                   "be: give it a name in UTF-8 (rename the file), or leave out --json", f->name, shown_escaped(v));
    }
}

void train_config_parse(TrainConfig *c, void *stage_ctx, int argc, char **argv, const Strategy *s) {
    set_defaults(c);
    FlagSpec shared[] = {
        {.name = "model", .type = FLAG_STRING, .dst = &c->model, .meta = "NAME",
         .help = "model preset: tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m"},
        {.name = "layers", .type = FLAG_INT, .dst = &c->layers, .meta = "N",
         .help = "override the preset's transformer blocks", .shown_default = "the preset's",
         .min = 1, .max = GPT_MAX_UNITS - 2},
        {.name = "d-model", .type = FLAG_INT, .dst = &c->d_model, .meta = "N",
         .help = "override the preset's channels", .shown_default = "the preset's",
         .min = 1, .max = GPT_MAX_CHANNELS},
        {.name = "heads", .type = FLAG_INT, .dst = &c->heads, .meta = "N",
         .help = "override the preset's attention heads (must divide --d-model)", .shown_default = "the preset's",
         .min = 1, .max = GPT_MAX_HEADS},
        {.name = "vocab", .type = FLAG_INT, .dst = &c->vocab, .meta = "N",
         .help = "override the preset's vocabulary (byte-level text needs >= 256); wte is stored with it rounded up "
                 "to a multiple of 128 rows, the padding zero and left out of the loss",
         .shown_default = "the preset's",
         .min = 2, .max = GPT_MAX_VOCAB},
        {.name = "seq-len", .type = FLAG_INT, .dst = &c->seq_len, .meta = "T", .help = "tokens per sequence",
         .shown_default = "the model's context, at most 256",
         .min = 1, .max = GPT_MAX_CONTEXT},
        {.name = "context", .type = FLAG_INT, .dst = &c->context, .meta = "N",
         .help = "the model's context: positions in its table (wpe, N x d-model params), the longest --seq-len",
         .shown_default = "the preset's, or --seq-len where that is longer",
         .min = 1, .max = GPT_MAX_CONTEXT},
        {.name = "batch", .type = FLAG_INT, .dst = &c->batch, .meta = "B",
         .help = "micro-batch: sequences per rank per forward/backward",
         .min = 1, .max = GPT_MAX_BATCH},
        {.name = "grad-accum", .type = FLAG_INT, .dst = &c->grad_accum, .meta = "K",
         .help = "micro-batches accumulated per optimizer step",
         .min = 1, .max = TRAIN_MAX_GRAD_ACCUM},
        {.name = "global-batch", .type = FLAG_INT, .dst = &c->global_batch, .meta = "G",
         .help = "sequences per optimizer step, G = batch x grad-accum x ranks: sets the one of those not given",
         .shown_default = "batch x ranks x grad-accum",
         .min = 1, .max = INT_MAX},
        {.name = "steps", .type = FLAG_INT, .dst = &c->steps, .meta = "N", .help = "optimizer steps to run",
         .min = 1, .max = MAX_STEPS},
        {.name = "lr", .type = FLAG_DOUBLE, .dst = &c->lr, .meta = "X", .help = "peak learning rate (AdamW)",
         .min = 0, .min_open = 1, .max = FLT_MAX},
        {.name = "warmup", .type = FLAG_INT, .dst = &c->warmup, .meta = "N",
         .help = "warm-up steps, then the decay of --lr-schedule",
         .min = 0, .max = INT_MAX},
        {.name = "weight-decay", .type = FLAG_DOUBLE, .dst = &c->weight_decay, .meta = "X",
         .help = "AdamW decoupled weight decay",
         .min = 0, .max = 1},
        {.name = "beta1", .type = FLAG_DOUBLE, .dst = &c->beta1, .meta = "X", .help = "AdamW's first-moment decay",
         .min = 0, .max = 1},
        {.name = "beta2", .type = FLAG_DOUBLE, .dst = &c->beta2, .meta = "X", .help = "AdamW's second-moment decay",
         .min = 0, .max = 1},
        {.name = "adam-eps", .type = FLAG_DOUBLE, .dst = &c->adam_eps, .meta = "X",
         .help = "AdamW's epsilon (added to sqrt(v))",
         .min = 0, .min_open = 1, .max = 1},
        {.name = "lr-schedule", .type = FLAG_STRING, .dst = &c->lr_schedule, .meta = "NAME",
         .help = "cosine (warm-up, cosine to lr x min-lr-frac), or DeepSpeed's WarmupLR, WarmupDecayLR, WarmupCosineLR"},
        {.name = "warmup-type", .type = FLAG_STRING, .dst = &c->warmup_type, .meta = "log|linear",
         .help = "the warm-up curve of DeepSpeed's schedules"},
        {.name = "warmup-start-frac", .type = FLAG_DOUBLE, .dst = &c->warmup_start_frac, .meta = "F",
         .help = "DeepSpeed's schedules: the rate at the warm-up's start, a fraction of --lr",
         .min = 0, .max = 1},
        {.name = "min-lr-frac", .type = FLAG_DOUBLE, .dst = &c->min_lr_frac, .meta = "F",
         .help = "the rate at the end of the decay, a fraction of --lr (not WarmupLR's)",
         .min = 0, .max = 1},
        {.name = "schedule-steps", .type = FLAG_INT, .dst = &c->schedule_steps, .meta = "N",
         .help = "steps the decay spans (DeepSpeed's total_num_steps)", .shown_default = "--steps",
         .min = 0, .max = MAX_STEPS},
        {.name = "grad-clip", .type = FLAG_DOUBLE, .dst = &c->grad_clip, .meta = "X",
         .help = "clip the global gradient norm to X (0 = off)",
         .min = 0, .max = INFINITY},
        {.name = "seed", .type = FLAG_INT, .dst = &c->seed, .meta = "N",
         .help = "initial weights (same for every rank count and stage)",
         .min = 0, .max = INT_MAX},
        {.name = "data", .type = FLAG_STRING, .dst = &c->data, .meta = "PATH",
         .help = "text file, folder of text, or llm.c uint16 token shards (default: built-in corpus)"},
        {.name = "data-order", .type = FLAG_STRING, .dst = &c->data_order, .meta = "permuted|sequential",
         .help = "rows of the data: spread over the corpus, or llm.c's order (the i-th run of B*T+1 tokens)"},
        {.name = "recompute", .type = FLAG_STRING, .dst = &c->recompute, .meta = "none|selective|full",
         .help = "what each block keeps for its backward: everything; all but the attention probabilities "
                 "(recomputed from q, k, v); only its input (its forward runs again before its backward)"},
        {.name = "attention", .type = FLAG_STRING, .dst = &c->attention, .meta = "flash|materialized",
         .help = "FlashAttention (tiles and an online softmax; keeps each row's log-sum-exp), or the textbook "
                 "form (keeps the (T,T) probabilities)"},
        {.name = "offload-activations", .type = FLAG_BOOL, .dst = &c->offload_activations,
         .help = "with --recompute full: the blocks' saved inputs live in pinned host memory, down in forward "
                 "and back one unit ahead of backward (DeepSpeed's cpu_checkpointing)"},
        {.name = "precision", .type = FLAG_STRING, .dst = &c->precision, .meta = "bf16|fp16",
         .help = "params and grads in 16 bits (fp32 master, m, v): bf16, or fp16 with loss scaling"},
        {.name = "grad-accum-dtype", .type = FLAG_STRING, .dst = &c->grad_accum_dtype, .meta = "bf16|fp16|fp32",
         .help = "the sum of a step's micro-batch gradients: in --precision's 16 bits, or in an fp32 accumulator "
                 "(+4 bytes per gradient element)", .shown_default = "--precision's"},
        {.name = "loss-scale", .type = FLAG_DOUBLE, .dst = &c->loss_scale, .meta = "S",
         .help = "fp16: a static loss scale S, or 0 for dynamic scaling (DeepSpeed's fp16.loss_scale)",
         .min = 0, .max = 1e30},
        {.name = "initial-scale-power", .type = FLAG_INT, .dst = &c->initial_scale_power, .meta = "K",
         .help = "fp16, dynamic: the first scale is 2^K", .min = 0, .max = 64},
        {.name = "loss-scale-window", .type = FLAG_INT, .dst = &c->loss_scale_window, .meta = "N",
         .help = "fp16, dynamic: double the scale after N steps without an overflow", .min = 1, .max = INT_MAX},
        {.name = "hysteresis", .type = FLAG_INT, .dst = &c->hysteresis, .meta = "N",
         .help = "fp16, dynamic: halve the scale at the N-th overflow since it last rose", .min = 1, .max = INT_MAX},
        {.name = "min-loss-scale", .type = FLAG_DOUBLE, .dst = &c->min_loss_scale, .meta = "S",
         .help = "fp16, dynamic: the scale never goes below S; an overflow there ends the run",
         .min = 0, .min_open = 1, .max = 1e30},
        {.name = "inject-overflow", .type = FLAG_STRING, .dst = &c->inject_overflow, .meta = "STEPS",
         .help = "fp16, a test hook: at these steps (1-based, comma-separated) the last rank's backward is seeded "
                 "with infinity, so its gradients overflow"},
        {.name = "init-from", .type = FLAG_STRING, .dst = &c->init_from, .meta = "FILE",
         .help = "start from an llm.c GPT-2 checkpoint: its shape is the model, its weights the initial ones"},
        {.name = "export-llmc", .type = FLAG_STRING, .dst = &c->export_llmc, .meta = "FILE",
         .help = "at the end, write the trained model as an llm.c GPT-2 checkpoint (fp32, version 3); FILE is a "
                 "regular file or a new name (never a link, device or folder)"},
        {.name = "eval-every", .type = FLAG_INT, .dst = &c->eval_every, .meta = "N",
         .help = "validation loss every N steps and at the end (0 = only at the end)",
         .min = 0, .max = INT_MAX},
        {.name = "eval-batches", .type = FLAG_INT, .dst = &c->eval_batches, .meta = "N",
         .help = "global batches (G sequences each) of held-out data per validation",
         .min = 1, .max = MAX_EVAL_BATCHES},
        {.name = "device", .type = FLAG_STRING, .dst = &c->device, .meta = "auto|cpu|cuda",
         .help = "where the model runs"},
        {.name = "comm", .type = FLAG_STRING, .dst = &c->comm, .meta = "auto|mpi|nccl",
         .help = "collectives backend"},
        {.name = "hbm-gb", .type = FLAG_DOUBLE, .dst = &c->hbm_gb, .meta = "GB",
         .help = "device memory budget per rank in GB (1e9 bytes); 0 = none on cpu, on cuda the card (shared equally by ranks on one GPU)",
         .min = 0, .max = MAX_HBM_GB},
        {.name = "json", .type = FLAG_STRING, .dst = &c->json, .meta = "FILE",
         .help = "append one JSON object for this run (to a regular file or a new name: a symbolic link is "
                 "refused, not followed)"},
        {.name = "trace", .type = FLAG_STRING, .dst = &c->trace, .meta = "FILE",
         .help = "write every rank's timeline as Chrome-trace JSON (Perfetto opens it; a regular file or a new "
                 "name, never a link)"},
        {.name = "contiguous-buffers", .type = FLAG_BOOL, .dst = &c->contiguous_buffers,
         .help = "ZeRO-R's defragmentation: the saved activations, the recompute's working set and the unit "
                 "gradients in regions allocated once at the start, written in place (without it each is "
                 "allocated as it is produced, between short-lived buffers, and the device's arena fragments)"},
        {.name = "tiled-loss", .type = FLAG_INT, .dst = &c->tiled_loss, .meta = "K",
         .help = "the LM head, softmax and cross-entropy over K chunks of a micro-batch's tokens: one chunk's "
                 "logits live at a time (B·T·Vp/K of them, not B·T·Vp per micro-batch in flight), computed again "
                 "in backward; 0: the logits whole, kept from forward to backward",
         .min = 0, .max = GPT_MAX_TOKENS},
        {.name = "tiled-mlp", .type = FLAG_INT, .dst = &c->tiled_mlp, .meta = "K",
         .help = "each block's MLP over K chunks of a micro-batch's tokens: one chunk's fc and GELU outputs live "
                 "at a time, none kept for backward, which computes each chunk's again (0: the MLP whole)",
         .min = 0, .max = GPT_MAX_TOKENS},
        {.name = "memory-timeline", .type = FLAG_STRING, .dst = &c->memory_timeline, .meta = "FILE",
         .help = "write one step's device and pinned allocations, by category and phase, as Chrome-trace JSON "
                 "(Perfetto stacks the categories; a regular file or a new name, never a link); a rank that runs "
                 "out of memory writes its own up to the failure"},
        {.name = "memory-timeline-step", .type = FLAG_INT, .dst = &c->memory_timeline_step, .meta = "N",
         .help = "the step --memory-timeline records (1 = the first; 0 = the last)",
         .min = 0, .max = INT_MAX},
        {.name = "save", .type = FLAG_STRING, .dst = &c->save, .meta = "DIR",
         .help = "write a sharded checkpoint at the end (and every --save-every steps); DIR is locked for the "
                 "run (DIR/lock, never a link)"},
        {.name = "save-every", .type = FLAG_INT, .dst = &c->save_every, .meta = "N",
         .help = "checkpoint every N steps (needs --save)",
         .min = 0, .max = INT_MAX},
        {.name = "resume", .type = FLAG_STRING, .dst = &c->resume, .meta = "DIR",
         .help = "continue from the checkpoint in DIR (same stage, ranks and model)"},
        {.name = "progress-thread", .type = FLAG_INT, .dst = &c->progress_us, .meta = "US",
         .help = "a thread enters MPI's progress engine every US microseconds, so nonblocking collectives "
                 "advance during compute (0 = none: only the MPI calls between the units move them)",
         .min = 0, .max = 1000000},
        {.name = "quiet", .type = FLAG_BOOL, .dst = &c->quiet,
         .help = "no per-step lines (the header, the end-of-run tables and the summary stay)"},
        {.name = "print-every", .type = FLAG_INT, .dst = &c->print_every, .meta = "N",
         .help = "a step line every N steps (and the last)",
         .min = 1, .max = INT_MAX},
        {.name = "deepspeed-config", .type = FLAG_STRING, .dst = &c->deepspeed_config, .meta = "FILE",
         .help = "DeepSpeed's ds_config.json: its values are the defaults of the matching flags"},
        {.name = "verbose-config", .type = FLAG_BOOL, .dst = &c->verbose_config,
         .help = "print every setting and where it came from (default, config key, command line)"},
    };
    enum { NSHARED = sizeof shared / sizeof shared[0] };
    // the stage's own flags follow the shared ones (the core knows none by name)
    FlagSpec specs[NSHARED + STRATEGY_MAX_FLAGS];
    memcpy(specs, shared, sizeof shared);
    int nstage = s->flags ? s->flags(stage_ctx, specs + NSHARED) : 0;
    CHECK(nstage >= 0 && nstage <= STRATEGY_MAX_FLAGS, "%s declares %d flags; at most %d", s->name, nstage,
          STRATEGY_MAX_FLAGS);
    char usage[512];
    snprintf(usage, sizeof usage,
             "usage: mpirun -np N ./%s [options]\n\n%s\n"
             "Every rank trains the same GPT-2 model on its rows of the same global batch;\n"
             "rank 0 prints a line per step and, at the end, measured memory beside the formula.",
             s->name, s->summary);
    // the config's values become the defaults; the command line overrides them
    settings_begin(&c->settings, specs, NSHARED + nstage);
    DsConfig ds;
    ds_config_load(&ds, flags_value(argc, argv, "deepspeed-config"));
    ds_config_check_binary(&ds, s->name);
    ds_config_apply(&ds, specs, NSHARED + nstage, &c->settings, s->name);
    ds_config_free(&ds);
    flags_parse(argc, argv, specs, NSHARED + nstage, usage);
    settings_after_parse(&c->settings, specs, NSHARED + nstage);
    check_json_text(&c->settings, c->json);
    check_formats(c);
    check_precision(c);

    if (c->save_every > 0 && !c->save) fail_usage("--save-every %d needs --save DIR to say where", c->save_every);
    if (settings_given(&c->settings, "memory-timeline-step") && !c->memory_timeline)
        fail_usage("--memory-timeline-step %d needs --memory-timeline FILE to say where", c->memory_timeline_step);
    if (c->memory_timeline_step > c->steps)
        fail_usage("--memory-timeline-step %d is past --steps %d: give a step from 1 to %d (0: the last)",
                   c->memory_timeline_step, c->steps, c->steps);
    if (c->memory_timeline && c->memory_timeline_step == 0) c->memory_timeline_step = c->steps;
    if (strcmp(c->device, "auto") && strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        fail_usage("--device %s: choose auto, cpu or cuda", c->device);
    if (strcmp(c->comm, "auto") && strcmp(c->comm, "mpi") && strcmp(c->comm, "nccl"))
        fail_usage("--comm %s: choose auto, mpi or nccl", c->comm);
}

// --init-from: the checkpoint's header is the model's shape.
static void model_from_llmc(TrainConfig *c, GPTConfig *out) {
    static const char *const SHAPE[] = {"model", "layers", "d-model", "heads", "vocab"};
    for (int i = 0; i < 5; i++)
        if (settings_given(&c->settings, SHAPE[i]))
            fail_usage("--init-from %s takes the model's shape from the file; leave out --%s", c->init_from, SHAPE[i]);
    LlmcHeader h;
    char err[512];
    if (llmc_read_header(c->init_from, &h, err, sizeof err)) fail_usage("%s", err);
    *out = h.cfg;
    c->model = "llm.c checkpoint";
    if (c->context && c->context != h.cfg.max_seq_len)
        fail_usage("--context %d: %s was trained with a context of %d positions (its wpe rows); leave out --context",
                   c->context, c->init_from, h.cfg.max_seq_len);
    if (c->seq_len > h.cfg.max_seq_len)
        fail_usage("--seq-len %d is longer than %s's context of %d positions; give --seq-len %d or less", c->seq_len,
                   c->init_from, h.cfg.max_seq_len, h.cfg.max_seq_len);
}

void train_config_model(TrainConfig *c, GPTConfig *out) {
    if (c->init_from) {
        model_from_llmc(c, out);
    } else {
        if (!gpt_preset(c->model, out)) fail_usage("--model %s: unknown; choose one of %s", c->model, gpt_preset_names());
        if (c->layers) out->num_layers = c->layers;
        if (c->d_model) out->channels = c->d_model;
        if (c->heads) out->num_heads = c->heads;
        if (c->vocab) out->vocab_size = c->vocab;
        if (c->context) {
            out->max_seq_len = c->context;
        } else if (c->seq_len > out->max_seq_len) {
            settings_mark(&c->settings, "context", FROM_DERIVED, "--seq-len %d, longer than %s's %d", c->seq_len,
                          c->model, out->max_seq_len);
            out->max_seq_len = c->seq_len;
        }
    }
    if (c->seq_len == 0) {
        c->seq_len = out->max_seq_len < 256 ? out->max_seq_len : 256;
        settings_mark(&c->settings, "seq-len", FROM_DERIVED, "the model's context %d, at most 256", out->max_seq_len);
    }
    if (c->seq_len > out->max_seq_len)
        fail_usage("--seq-len %d is longer than --context %d; give a --context of at least %d", c->seq_len,
                   out->max_seq_len, c->seq_len);
}

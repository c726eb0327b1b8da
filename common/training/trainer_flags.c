// trainer_flags.c: the flags every trainer shares, their defaults, and the
// checks that turn bad input into one clear line and exit status 2.
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "flags.h"
#include "trainer.h"

// Ranges of the shared flags beyond the model's limits (gpt.h): a step count
// whose per-step records fit in memory (8 arrays of 8 bytes a step), micro-
// batches (TRAIN_MAX_GRAD_ACCUM) and validation batches that keep row
// counters far below 2^63, and a budget whose byte count fits in 64 bits. The
// learning rate and weight decay become fp32 step constants (AdamWStep), so
// the rate is at most FLT_MAX.
#define MAX_STEPS 10000000
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
         .help = "override the preset's vocabulary (byte-level text needs >= 256)",
         .shown_default = "the preset's",
         .min = 2, .max = GPT_MAX_VOCAB},
        {.name = "seq-len", .type = FLAG_INT, .dst = &c->seq_len, .meta = "T", .help = "tokens per sequence",
         .shown_default = "the model's context, at most 256",
         .min = 1, .max = GPT_MAX_CONTEXT},
        {.name = "batch", .type = FLAG_INT, .dst = &c->batch, .meta = "B",
         .help = "micro-batch: sequences per rank per forward/backward",
         .min = 1, .max = GPT_MAX_BATCH},
        {.name = "grad-accum", .type = FLAG_INT, .dst = &c->grad_accum, .meta = "K",
         .help = "micro-batches accumulated per optimizer step",
         .min = 1, .max = TRAIN_MAX_GRAD_ACCUM},
        {.name = "global-batch", .type = FLAG_INT, .dst = &c->global_batch, .meta = "G",
         .help = "sequences per optimizer step; sets --grad-accum = G / (batch x ranks)",
         .shown_default = "batch x ranks x grad-accum",
         .min = 1, .max = INT_MAX},
        {.name = "steps", .type = FLAG_INT, .dst = &c->steps, .meta = "N", .help = "optimizer steps to run",
         .min = 1, .max = MAX_STEPS},
        {.name = "lr", .type = FLAG_DOUBLE, .dst = &c->lr, .meta = "X", .help = "peak learning rate (AdamW)",
         .min = 0, .min_open = 1, .max = FLT_MAX},
        {.name = "warmup", .type = FLAG_INT, .dst = &c->warmup, .meta = "N",
         .help = "linear warm-up steps, then cosine decay to lr/10",
         .min = 0, .max = INT_MAX},
        {.name = "weight-decay", .type = FLAG_DOUBLE, .dst = &c->weight_decay, .meta = "X",
         .help = "AdamW decoupled weight decay",
         .min = 0, .max = 1},
        {.name = "grad-clip", .type = FLAG_DOUBLE, .dst = &c->grad_clip, .meta = "X",
         .help = "clip the global gradient norm to X (0 = off)",
         .min = 0, .max = INFINITY},
        {.name = "seed", .type = FLAG_INT, .dst = &c->seed, .meta = "N",
         .help = "initial weights (same for every rank count and stage)",
         .min = 0, .max = INT_MAX},
        {.name = "data", .type = FLAG_STRING, .dst = &c->data, .meta = "PATH",
         .help = "text file, folder of text, or llm.c uint16 token shards (default: built-in corpus)"},
        {.name = "eval-every", .type = FLAG_INT, .dst = &c->eval_every, .meta = "N",
         .help = "validation loss every N steps and at the end (0 = only at the end)",
         .min = 0, .max = INT_MAX},
        {.name = "eval-batches", .type = FLAG_INT, .dst = &c->eval_batches, .meta = "N",
         .help = "global micro-batches of held-out data per validation",
         .min = 1, .max = MAX_EVAL_BATCHES},
        {.name = "device", .type = FLAG_STRING, .dst = &c->device, .meta = "auto|cpu|cuda",
         .help = "where the model runs"},
        {.name = "comm", .type = FLAG_STRING, .dst = &c->comm, .meta = "auto|mpi|nccl",
         .help = "collectives backend"},
        {.name = "hbm-gb", .type = FLAG_DOUBLE, .dst = &c->hbm_gb, .meta = "GB",
         .help = "device memory budget per rank in GB (1e9 bytes); 0 = none on cpu, on cuda the card (shared equally by ranks on one GPU)",
         .min = 0, .max = MAX_HBM_GB},
        {.name = "json", .type = FLAG_STRING, .dst = &c->json, .meta = "FILE",
         .help = "append one JSON object for this run"},
        {.name = "trace", .type = FLAG_STRING, .dst = &c->trace, .meta = "FILE",
         .help = "write every rank's timeline as Chrome-trace JSON (Perfetto opens it)"},
        {.name = "save", .type = FLAG_STRING, .dst = &c->save, .meta = "DIR",
         .help = "write a sharded checkpoint at the end (and every --save-every steps)"},
        {.name = "save-every", .type = FLAG_INT, .dst = &c->save_every, .meta = "N",
         .help = "checkpoint every N steps (needs --save)",
         .min = 0, .max = INT_MAX},
        {.name = "resume", .type = FLAG_STRING, .dst = &c->resume, .meta = "DIR",
         .help = "continue from the checkpoint in DIR (same stage, ranks and model)"},
        {.name = "progress-thread", .type = FLAG_INT, .dst = &c->progress_us, .meta = "US",
         .help = "a thread enters MPI's progress engine every US microseconds, so nonblocking collectives "
                 "advance during compute (0 = none: only the layer hooks' MPI calls move them)",
         .min = 0, .max = 1000000},
        {.name = "quiet", .type = FLAG_BOOL, .dst = &c->quiet,
         .help = "no per-step lines (the header, the end-of-run tables and the summary stay)"},
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
    flags_parse(argc, argv, specs, NSHARED + nstage, usage);

    if (c->save_every > 0 && !c->save) fail_usage("--save-every %d needs --save DIR to say where", c->save_every);
    if (strcmp(c->device, "auto") && strcmp(c->device, "cpu") && strcmp(c->device, "cuda"))
        fail_usage("--device %s: choose auto, cpu or cuda", c->device);
    if (strcmp(c->comm, "auto") && strcmp(c->comm, "mpi") && strcmp(c->comm, "nccl"))
        fail_usage("--comm %s: choose auto, mpi or nccl", c->comm);
}

void train_config_model(TrainConfig *c, GPTConfig *out) {
    if (!gpt_preset(c->model, out)) fail_usage("--model %s: unknown; choose one of %s", c->model, gpt_preset_names());
    if (c->layers) out->num_layers = c->layers;
    if (c->d_model) out->channels = c->d_model;
    if (c->heads) out->num_heads = c->heads;
    if (c->vocab) out->vocab_size = c->vocab;
    if (c->seq_len == 0) c->seq_len = out->max_seq_len < 256 ? out->max_seq_len : 256;
    if (c->seq_len > out->max_seq_len)
        fail_usage("--seq-len %d is longer than %s's context of %d tokens", c->seq_len, c->model, out->max_seq_len);
}

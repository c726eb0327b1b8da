// trainer_flags.c: the flags every trainer shares, their defaults, and the
// checks that turn bad input into one clear line and exit status 2.
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "flags.h"
#include "trainer.h"

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
        {"model", FLAG_STRING, &c->model, "NAME", "model preset: tiny, small, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m", 0, NULL},
        {"layers", FLAG_INT, &c->layers, "N", "override the preset's transformer blocks", 0, "the preset's"},
        {"d-model", FLAG_INT, &c->d_model, "N", "override the preset's channels", 0, "the preset's"},
        {"heads", FLAG_INT, &c->heads, "N", "override the preset's attention heads (must divide --d-model)", 0, "the preset's"},
        {"vocab", FLAG_INT, &c->vocab, "N", "override the preset's vocabulary (byte-level text needs >= 256)", 0, "the preset's"},
        {"seq-len", FLAG_INT, &c->seq_len, "T", "tokens per sequence", 0, "the model's context, at most 256"},
        {"batch", FLAG_INT, &c->batch, "B", "micro-batch: sequences per rank per forward/backward", 0, NULL},
        {"grad-accum", FLAG_INT, &c->grad_accum, "K", "micro-batches accumulated per optimizer step", 0, NULL},
        {"global-batch", FLAG_INT, &c->global_batch, "G", "sequences per optimizer step; sets --grad-accum = G / (batch x ranks)", 0, "batch x ranks x grad-accum"},
        {"steps", FLAG_INT, &c->steps, "N", "optimizer steps to run", 0, NULL},
        {"lr", FLAG_DOUBLE, &c->lr, "X", "peak learning rate (AdamW)", 0, NULL},
        {"warmup", FLAG_INT, &c->warmup, "N", "linear warm-up steps, then cosine decay to lr/10", 0, NULL},
        {"weight-decay", FLAG_DOUBLE, &c->weight_decay, "X", "AdamW decoupled weight decay", 0, NULL},
        {"grad-clip", FLAG_DOUBLE, &c->grad_clip, "X", "clip the global gradient norm to X (0 = off)", 0, NULL},
        {"seed", FLAG_INT, &c->seed, "N", "initial weights (same for every rank count and stage)", 0, NULL},
        {"data", FLAG_STRING, &c->data, "PATH", "text file, folder of text, or llm.c uint16 token shards (default: built-in corpus)", 0, NULL},
        {"eval-every", FLAG_INT, &c->eval_every, "N", "validation loss every N steps and at the end (0 = only at the end)", 0, NULL},
        {"eval-batches", FLAG_INT, &c->eval_batches, "N", "global micro-batches of held-out data per validation", 0, NULL},
        {"device", FLAG_STRING, &c->device, "auto|cpu|cuda", "where the model runs", 0, NULL},
        {"comm", FLAG_STRING, &c->comm, "auto|mpi|nccl", "collectives backend", 0, NULL},
        {"hbm-gb", FLAG_DOUBLE, &c->hbm_gb, "GB", "device memory budget per rank in GB (1e9 bytes); 0 = none on cpu, on cuda the card (shared equally by ranks on one GPU)", 0, NULL},
        {"json", FLAG_STRING, &c->json, "FILE", "append one JSON object for this run", 0, NULL},
        {"trace", FLAG_STRING, &c->trace, "FILE", "write every rank's timeline as Chrome-trace JSON (Perfetto opens it)", 0, NULL},
        {"save", FLAG_STRING, &c->save, "DIR", "write a sharded checkpoint at the end (and every --save-every steps)", 0, NULL},
        {"save-every", FLAG_INT, &c->save_every, "N", "checkpoint every N steps (needs --save)", 0, NULL},
        {"resume", FLAG_STRING, &c->resume, "DIR", "continue from the checkpoint in DIR (same stage, ranks and model)", 0, NULL},
        {"quiet", FLAG_BOOL, &c->quiet, NULL, "no per-step lines (the header, the end-of-run tables and the summary stay)", 0, NULL},
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

    if (c->batch < 1) fail_usage("--batch %d: need at least 1 sequence per rank", c->batch);
    if (c->seq_len < 0) fail_usage("--seq-len %d: need at least 1 token", c->seq_len);
    if (c->grad_accum < 1) fail_usage("--grad-accum %d: need at least 1 micro-batch per step", c->grad_accum);
    if (c->steps < 1) fail_usage("--steps %d: need at least 1 step", c->steps);
    if (c->warmup < 0 || c->eval_every < 0 || c->save_every < 0 || c->eval_batches < 1)
        fail_usage("--warmup, --eval-every and --save-every must be >= 0 and --eval-batches >= 1");
    if (!(c->lr > 0)) fail_usage("--lr %g: the learning rate must be positive", c->lr);
    if (c->hbm_gb < 0) fail_usage("--hbm-gb %g: the budget cannot be negative", c->hbm_gb);
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

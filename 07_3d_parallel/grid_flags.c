// grid_flags.c: stage 07's flags and their refusals (see parallel3d.h).
#include <string.h>
#include "check.h"
#include "parallel3d.h"

int grid_flags(void *ctx, FlagSpec *out) {
    Stage *z = ctx;
    z->tp = 1;
    z->pp = 1;
    z->schedule_name = "1f1b";
    z->cp = 1;
    z->cp_mode = "ulysses";
    z->virtual_stages = 1;
    out[0] = (FlagSpec){.name = "tp", .type = FLAG_INT, .dst = &z->tp, .meta = "T",
                        .help = "tensor-parallel ranks (adjacent): each block's heads and MLP split over T",
                        .min = 1, .max = GPT_MAX_HEADS};  // T divides the heads
    out[1] = (FlagSpec){.name = "pp", .type = FLAG_INT, .dst = &z->pp, .meta = "P",
                        .help = "pipeline stages of contiguous blocks (embeddings first, head last); "
                                "dp = ranks / (T x P)",
                        .min = 1, .max = GPT_MAX_UNITS - 2};  // at most a block per stage
    out[2] = (FlagSpec){.name = "schedule", .type = FLAG_STRING, .dst = &z->schedule_name,
                        .meta = "1f1b|afab|interleaved|zb-h1",
                        .help = "pipeline schedule: one forward one backward, all forwards then all backwards, "
                                "interleaved (--virtual-stages chunks per stage, Megatron-LM's virtual pipeline), or "
                                "zero bubble (1F1B with the backward split into B and W, the Ws in 1F1B's idle "
                                "slots); micro-batches = --grad-accum"};
    out[3] = (FlagSpec){.name = "partition-activations", .type = FLAG_BOOL, .dst = &z->partition_activations,
                        .help = "with --recompute full and --tp > 1: each tp rank keeps 1/T of every block's saved "
                                "input, all-gathered before the block recomputes (DeepSpeed's partition_activations)"};
    out[4] = (FlagSpec){.name = "sequence-parallel", .type = FLAG_BOOL, .dst = &z->sequence_parallel,
                        .help = "with --tp > 1: the residual stream and the layernorms split over the tp ranks by "
                                "the tokens; f and g become all-gather and reduce-scatter (Korthikanti et al.)"};
    out[5] = (FlagSpec){.name = "print-schedule", .type = FLAG_BOOL, .dst = &z->print_schedule,
                        .help = "draw the pipeline schedule of --pp stages and --grad-accum micro-batches as a table, "
                                "one row per stage (F i, B i on a clock where a backward takes two slots), with each "
                                "stage's micro-batches in flight and the bubble, then exit without training"};
    out[6] = (FlagSpec){.name = "cp", .type = FLAG_INT, .dst = &z->cp, .meta = "C",
                        .help = "context parallel: each sequence split over C ranks by its positions (adjacent "
                                "replicas), the attention by --cp-mode; ZeRO-1 shards over dp x cp; "
                                "dp = ranks / (T x C x P)",
                        .min = 1, .max = GPT_MAX_HEADS};  // T·C divides the heads
    out[7] = (FlagSpec){.name = "cp-mode", .type = FLAG_STRING, .dst = &z->cp_mode, .meta = "ulysses|ring",
                        .help = "how --cp splits the attention: ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023: "
                                "all-to-alls of q, k, v and the output around each block's attention; T x C divides "
                                "the heads) or ring (ring attention, Liu et al. 2023: each rank two zigzag chunks of "
                                "the sequence, the keys and values passed around the cp ranks, the partial results "
                                "merged by their log-sum-exp)"};
    out[8] = (FlagSpec){.name = "virtual-stages", .type = FLAG_INT, .dst = &z->virtual_stages, .meta = "V",
                        .help = "with --schedule interleaved: chunks of layers per stage, stage s holding chunks s, "
                                "s + P, ... (Megatron-LM's virtual pipeline)",
                        .min = 1, .max = GPT_MAX_CHUNKS};
    return 9;
}

void grid_check_cp_flags(const Trainer *t, const Stage *z, const TrainConfig *cfg) {
    if (strcmp(z->cp_mode, "ulysses") != 0 && strcmp(z->cp_mode, "ring") != 0)
        fail_usage("--cp-mode %s: choose ulysses or ring", z->cp_mode);
    if (z->cp > 1 && strcmp(cfg->attention, "flash") != 0)
        fail_usage("--cp %d runs each block's attention core as flash attention over the whole sequence; "
                   "--attention %s is not supported with it: give --attention flash", z->cp, cfg->attention);
}

// Sequence parallelism and partitioned checkpoints split tensors over the
// tp ranks by their B·T tokens; partitioned checkpoints split the blocks'
// saved inputs, which only full recompute keeps alone, and sequence
// parallelism splits those already.
void grid_check_activation_flags(const Trainer *t, const Stage *z) {
    long tokens = (long)t->cfg.batch * t->cfg.seq_len;
    if (z->sequence_parallel && z->grid.tp == 1)
        fail_usage("--sequence-parallel splits the tensors between the tensor-parallel regions over the --tp ranks: "
                   "give --tp 2 or more");
    if (z->sequence_parallel && tokens % z->grid.tp)
        fail_usage("--sequence-parallel: --batch %d x --seq-len %d = %ld tokens do not split over --tp %d; give a "
                   "batch or sequence length whose product is a multiple of it", t->cfg.batch, t->cfg.seq_len,
                   tokens, z->grid.tp);
    if (z->sequence_parallel && z->partition_activations)
        fail_usage("--sequence-parallel already keeps 1/T of every block's input on each tp rank: leave out "
                   "--partition-activations");
    if (!z->partition_activations) return;
    if (strcmp(t->cfg.recompute, "full") != 0)
        fail_usage("--partition-activations splits the blocks' saved inputs over the tp ranks, and only "
                   "--recompute full keeps each block's input alone (here --recompute %s): add --recompute full",
                   t->cfg.recompute);
    if (z->grid.tp == 1)
        fail_usage("--partition-activations splits each saved input over the tensor-parallel ranks: give --tp 2 "
                   "or more");
    if ((long)t->cfg.batch * t->cfg.seq_len % z->grid.tp)
        fail_usage("--partition-activations: --batch %d x --seq-len %d = %ld tokens do not split over --tp %d; "
                   "give a batch or sequence length whose product is a multiple of it", t->cfg.batch,
                   t->cfg.seq_len, (long)t->cfg.batch * t->cfg.seq_len, z->grid.tp);
}

Schedule grid_schedule_of(const char *name) {
    if (strcmp(name, "1f1b") == 0) return SCHEDULE_1F1B;
    if (strcmp(name, "afab") == 0) return SCHEDULE_AFAB;
    if (strcmp(name, "zb-h1") == 0) return SCHEDULE_ZB_H1;
    if (strcmp(name, "interleaved") == 0) return SCHEDULE_INTERLEAVED;
    fail_usage("--schedule %s: choose 1f1b, afab, zb-h1 or interleaved", name);
}

// step_memory_spec.c: what a step's formula timeline starts from
// (step_memory.h's StepMemorySpec): the blocks that live through the step,
// each stated as the code that allocates it takes it (one per state, the
// fp32 accumulator, the checkpoint store or the contiguous regions, the
// backward's and the kernels' scratch, what the device held, a stage's
// buffers); and the shape of zero3's step. step_memory.c walks the step
// from here.
#include "act_math.h"
#include "check.h"
#include "mem_math.h"
#include "step_memory.h"

void step_memory_fixed(StepMemorySpec *s, MemCategory c, double bytes) {
    if (bytes <= 0) return;
    CHECK(s->nfixed < STEP_MAX_FIXED, "step_memory_fixed: more than %d blocks through the step", STEP_MAX_FIXED);
    s->fixed[s->nfixed].cat = c;
    s->fixed[s->nfixed++].bytes = bytes;
}

// The fp32 unit gradients with contiguous buffers, two blocks: the largest
// unit of the range but the embeddings, and the embeddings' (tied wte)
// where the range has them or the head.
static void contiguous_grads(StepMemorySpec *s, const GPTLayout *l, const GPTPlan *p) {
    double largest = 0;
    for (int u = p->first_unit > 1 ? p->first_unit : 1; u <= p->last_unit; u++)
        if ((double)l->unit[u].count > largest) largest = (double)l->unit[u].count;
    int embed = p->first_unit == GPT_UNIT_EMBED || p->last_unit == gpt_unit_head(l);
    step_memory_fixed(s, CAT_WORKSPACE, 4.0 * largest);
    step_memory_fixed(s, CAT_WORKSPACE, embed ? 4.0 * (double)l->unit[GPT_UNIT_EMBED].count : 0);
}

// Each device category's states (one block each), so many bytes more
static void states_fixed(StepMemorySpec *s, const StateBytes *sb) {
    for (int c = 0; c <= CAT_LAST_STATE; c++) step_memory_fixed(s, (MemCategory)c, sb->bytes[TIER_DEVICE][c]);
}

void step_memory_base(StepMemorySpec *s, StageId formula, const GPTLayout *l, const GPTPlan *p, int act_bytes,
                      size_t state_params, int dp_ranks, int grad_accum_fp32, int micro_batches, double kernel_scratch,
                      double held) {
    memset(s, 0, sizeof *s);
    s->layout = l;
    s->plan = *p;
    s->act_bytes = act_bytes;
    s->micro_batches = micro_batches;
    s->shape = STEP_WHOLE;
    StateBytes sb, acc = {0};
    stage_state_bytes(formula, state_params, dp_ranks, &sb);
    states_fixed(s, &sb);
    if (grad_accum_fp32) stage_add_grad_accum(formula, state_params, dp_ranks, &acc);  // a block of its own
    states_fixed(s, &acc);
    ActFormula f = act_formula(l, p, act_bytes);
    ActUnits a = act_units(l, p, act_bytes);
    step_memory_fixed(s, CAT_ACTIVATIONS, p->contiguous ? f.saved : a.store);
    if (p->contiguous) step_memory_fixed(s, CAT_ACT_WORKING, f.working);
    step_memory_fixed(s, CAT_WORKSPACE, act_backward_scratch(l, p, act_bytes));
    step_memory_fixed(s, CAT_WORKSPACE, kernel_scratch);
    step_memory_fixed(s, CAT_WORKSPACE, held);  // the device's own (cuBLASLt's workspace): one block
    if (p->contiguous) contiguous_grads(s, l, p);
}

void step_memory_buckets(StepMemorySpec *s, double bucket_mb, const Partition *part) {
    size_t cap = zero_bucket_elems(bucket_mb, part), recv = zero_bucket_recv_elems(cap, part);
    for (int k = 0; k < 2; k++) {
        step_memory_fixed(s, CAT_COMM, (double)cap * sizeof(bf16));
        step_memory_fixed(s, CAT_COMM, (double)recv * sizeof(bf16));
    }
}

void step_memory_gathered(StepMemorySpec *s, int prefetch, double bucket_mb, const Partition *part) {
    s->shape = STEP_GATHERED;
    s->prefetch = prefetch;
    for (int u = 0; u < s->layout->num_units; u++)
        s->gathered[0][u] = s->gathered[1][u] = (double)s->layout->unit[u].count * sizeof(bf16);
    step_memory_buckets(s, bucket_mb, part);
}

// The buffers stage_buffer_bytes counts, as the blocks the stages allocate
void step_memory_stage_defaults(StepMemorySpec *s, StageId formula, const Partition *part) {
    if (stage_gathers_params(formula)) {
        step_memory_gathered(s, ZERO_PREFETCH_DEFAULT, 0, part);
        return;
    }
    switch (formula) {
    case STAGE_ZERO1: step_memory_fixed(s, CAT_COMM, (double)part->shard * sizeof(bf16)); break;  // the reduced shard
    case STAGE_ZERO2:
    case STAGE_OFFLOAD:
    case STAGE_OFFLOAD_DPU: step_memory_buckets(s, 0, part); break;
    default: break;
    }
}


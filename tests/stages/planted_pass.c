// planted_pass.c: dp_baseline with its micro-batch step planted with a
// mistake about the pass it is handed (test_protocol runs them). The
// Makefile builds it once per mistake, PLANT naming it, with
// stage_main.c naming the strategy below.
#include "../../01_dp_baseline/dp_baseline.c"

// PLANT 1: the evaluation treated as a training step (mb->backward ignored);
// PLANT 2: backward for the step's last micro-batch only (the others' lost).
static double planted_forward_backward(Trainer *t, const MicroBatches *mb) {
    GPT *g = &t->model;
    const bf16 *embed = replicated_unit_params(t, GPT_UNIT_EMBED);
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) gpt_unit_forward(g, u, 0, replicated_unit_params(t, u), embed);
        gpt_slot_loss_queue(g, 0);
#if PLANT == 2
        if (i != mb->count - 1) continue;
#endif
        for (int u = g->L.num_units - 1; u >= 0; u--)
            replicated_add_grads(t, u, gpt_unit_backward(g, u, 0, replicated_unit_params(t, u), embed),
                                 micro_turn(mb, i));
    }
    if (mb->backward) all_reduce_grads(t);
    return gpt_losses_take(g);
}

const Strategy strategy_planted = {
    .name = "planted",
    .summary = "dp_baseline with a mistake about the pass planted in its micro-batch step (a test's).",
    .formula = STAGE_DP,
    .states = {.params = STATE_FULL, .grads = STATE_FULL, .optim = STATE_FULL,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_DEVICE, .optim_tier = TIER_DEVICE},
    .forward_backward = planted_forward_backward,
    .grad_norm_sq = grad_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
};

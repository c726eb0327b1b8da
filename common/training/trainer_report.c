// trainer_report.c: the one place where the report meets the Trainer. The
// report (report.h) reads no Trainer: before step 1 it is handed the run's
// facts, copied from the Trainer, and its taps, pointers to what changes as
// the run goes; at the end the stage's own rows are handed to it as a
// callback, since only the Trainer knows the stage.
#include <stdio.h>
#include "trainer.h"

// What ran, fixed by now: the flags are parsed, the stage has placed this
// rank and set its formulas up, the budget is counted and the data is open.
static RunFacts run_facts(const Trainer *t) {
    const TrainConfig *c = &t->cfg;
    RunFacts run = {
        .stage = t->strategy->name, .model = c->model, .data_desc = t->data.desc, .json = c->json,
        .settings = &c->settings, .grid = t->grid,
        .ranks = t->world.size, .dp_ranks = t->dp->size,
        .batch = c->batch, .seq_len = c->seq_len, .grad_accum = c->grad_accum,
        .tokens_per_step = (double)trainer_data_replicas(t) * c->batch * c->seq_len * c->grad_accum,
        .steps = c->steps, .print_every = c->print_every, .quiet = c->quiet, .progress_us = c->progress_us,
        .half = c->half, .loss_scaling = t->scaler.enabled, .loss_scale_dynamic = t->scaler.dynamic,
        .grad_accum_fp32 = c->grad_accum_fp32,
        .formula = t->formula, .grads_tier = t->states.grads_tier,
        .state_params = t->state_params, .model_params = t->model_params,
        .layout = &t->layout, .plan = t->plan,
        .comm_formula_bytes = t->comm_formula_bytes, .comm_formula_text = t->comm_formula_text,
        .device_need = t->device_need,
    };
    for (int k = 0; k < CAT_COUNT; k++) run.buffer_formula_bytes[k] = t->buffer_formula_bytes[k];
    return run;
}

void trainer_report_init(Trainer *t) {
    RunFacts run = run_facts(t);
    ReportTaps taps = {.world = &t->world, .dev = &t->dev, .trace = &t->trace,
                       .recompute = &t->model.recompute_work, .loss_scale = &t->scaler.scale,
                       .skipped_steps = &t->scaler.skipped, .timeline = &t->timeline_check,
                       .step_formula = &t->step_formula};
    report_init(&t->report, &run, &taps, t->step);
}

static void stage_rows(void *arg, FILE *json) {
    Trainer *t = arg;
    if (t->strategy->report) t->strategy->report(t, json);
}

int trainer_report_finish(Trainer *t) { return report_finish(&t->report, stage_rows, t); }

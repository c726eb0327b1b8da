// report_json.c: the run's --json record (see report_summary.h): one JSON
// object per run, appended, with the settings and the stage's own members.
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "out_file.h"
#include "report_summary.h"
#include "trace.h"

static void json_phase(FILE *f, MemPhase p) {
    fprintf(f, "{\"kind\":\"%s\",\"micro\":%d,\"unit\":%d}", mem_phase_kind_name(p.kind), p.micro, p.unit);
}

// The memory's phase boundaries beside the formula's timeline (step_memory.c).
static void json_timeline(FILE *f, const Summary *s) {
    const TimelineCheck *c = &s->timeline;
    fprintf(f, ",\"memory_timeline\":{\"modelled\":%s", c->not_modelled ? "false" : "true");
    if (c->not_modelled) {
        fprintf(f, ",\"not_modelled\":");
        json_write_string(f, c->not_modelled);
        fprintf(f, "}");
        return;
    }
    fprintf(f, ",\"boundaries\":%d,\"steps_checked\":%ld,\"equal_on_every_rank\":%s,\"formula_peak\":%.0f,"
               "\"formula_arena_peak\":%.0f,\"arena_peak_allocated\":%.0f,\"arena_peak_equal_on_every_rank\":%s,"
               "\"formula_high_water\":%.0f,\"high_water_equal_on_every_rank\":%s,"
               "\"formula_peak_phase\":", c->boundaries, c->steps_checked, s->timeline_rank < 0 ? "true" : "false",
            s->timeline_peak, s->formula_arena_peak, s->arena_peak_allocated, s->arena_peak_equal ? "true" : "false",
            s->formula_high_water, s->high_water_equal ? "true" : "false");
    json_phase(f, c->peak_phase);
    if (s->timeline_rank >= 0) {
        fprintf(f, ",\"first_difference\":{\"rank\":%d,\"step\":%ld,\"boundary\":%d,\"phase\":", s->timeline_rank,
                c->bad_step, c->bad_boundary);
        json_phase(f, c->bad_phase);
        fprintf(f, ",\"category\":");
        if (c->bad_cat >= 0) json_write_string(f, mem_category_name((MemCategory)c->bad_cat));
        else fprintf(f, "null");
        fprintf(f, ",\"measured\":%.0f,\"formula\":%.0f}", c->bad_measured, c->bad_formula);
    }
    // the last step's boundaries by category (bytes), measured and the
    // formula's, of each rank that differs from a lower one: what
    // plot_runs.py draws as the step's timeline
    fprintf(f, ",\"categories\":[");
    for (int k = 0; k < CAT_COUNT; k++) fprintf(f, "%s\"%s\"", k ? "," : "", mem_category_name((MemCategory)k));
    fprintf(f, "],\"panels\":[");
    for (int p = 0; p < s->npanels; p++) {
        const TimelinePanel *q = &s->panels[p];
        fprintf(f, "%s{\"of_rank\":%d,\"formula_peak\":%.0f,\"formula_peak_phase\":", p ? "," : "", q->rank,
                q->peak);
        json_phase(f, q->peak_phase);
        fprintf(f, ",\"formula_peak_bytes\":[");
        for (int k = 0; k < CAT_COUNT; k++) fprintf(f, "%s%.0f", k ? "," : "", q->peak_bytes[k]);
        for (int which = 0; which < 2; which++) {
            const MemBoundary *b = which ? q->formula : q->measured;
            int n = which ? q->nformula : q->n;
            fprintf(f, "],\"%s\":[", which ? "formula" : "measured");
            for (int i = 0; i < n; i++) {
                fprintf(f, "%s{\"phase\":", i ? "," : "");
                json_phase(f, b[i].phase);
                fprintf(f, ",\"bytes\":[");
                for (int k = 0; k < CAT_COUNT; k++) fprintf(f, "%s%zu", k ? "," : "", b[i].device[k]);
                fprintf(f, "]}");
            }
        }
        fprintf(f, "]}");
    }
    fprintf(f, "]}");
}

static void json_mem(FILE *f, const Summary *s) {
    HalfFormat half = s->run->half;
    fprintf(f, "\"mem\":{");
    for (int i = 0; i < TIER_COUNT; i++) {
        fprintf(f, "%s\"%s\":{", i ? "," : "", mem_tier_name(i));
        for (int c = 0; c < CAT_COUNT; c++)
            fprintf(f, "%s\"%s\":{\"current\":%.0f,\"peak\":%.0f}", c ? "," : "", report_category_name(half, c),
                    s->cur[i][c], s->peak[i][c]);
        fprintf(f, ",\"peak_total\":%.0f}", s->tier_peak[i]);
    }
    fprintf(f, "},\"mem_formula\":{");
    for (int i = 0; i < TIER_COUNT; i++) {
        fprintf(f, "%s\"%s\":{", i ? "," : "", mem_tier_name(i));
        for (int c = 0; c <= CAT_LAST_STATE; c++)
            fprintf(f, "%s\"%s\":%.0f", c ? "," : "", report_category_name(half, c), s->formula.bytes[i][c]);
        fprintf(f, ",\"total\":%.0f}", s->formula.tier_total[i]);
    }
    fprintf(f, ",\"padding_params\":%.0f,\"activations\":%.0f,\"act_working\":%.0f,\"act_offloaded\":%.0f}",
            s->formula.padding_params, s->acts.saved, s->acts.working, s->acts.offloaded);
    const ArenaStats *a = &s->arena;
    fprintf(f, ",\"arena\":{\"reserved\":%zu,\"align\":%zu,\"guard\":%zu,\"rank\":%d,\"allocated_at_peak\":%zu,"
               "\"blocks_at_peak\":%d,\"free_at_peak\":%zu,\"free_blocks_at_peak\":%d,\"largest_free_at_peak\":%zu,"
               "\"fragmentation_at_peak\":%.6f,\"high_water\":%.0f}",
            a->reserved, ARENA_ALIGN, ARENA_GUARD, s->arena_rank, a->allocated, a->blocks - a->free_blocks,
            a->free_bytes, a->free_blocks, a->largest_free, arena_fragmentation(a), s->arena_high_water);
    json_timeline(f, s);
}

// What the budget check counted before the run (trainer_budget.c).
static void json_need(FILE *f, const RunDeviceBytes *r) {
    fprintf(f, ",\"device_need\":{\"states\":%.0f,\"activations\":%.0f,\"workspace\":%.0f,\"kernel_scratch\":%.0f,"
               "\"stage_buffers\":%.0f,\"held\":%.0f,\"total\":%.0f}",
            r->states, r->activations, r->workspace, r->kernel_scratch, r->stage_buffers, r->held, r->total);
}

static void json_array(FILE *f, const char *name, const double *x, long n) {
    fprintf(f, "\"%s\":[", name);
    for (long i = 0; i < n; i++) {
        if (isfinite(x[i])) fprintf(f, "%s%.9g", i ? "," : "", x[i]);
        else fprintf(f, "%snull", i ? "," : "");  // an fp16 overflow's norm: JSON has no inf
    }
    fprintf(f, "]");
}

// --precision and, in fp16, each step's loss scale, the skipped steps and
// those whose gradients were all 0 (1-based), and how many applied an update
static void json_precision(FILE *f, const Summary *s) {
    const Report *r = s->r;
    fprintf(f, ",\"precision\":\"%s\"", half_format_name(s->run->half));
    if (!s->run->loss_scaling) return;
    fprintf(f, ",\"loss_scale_dynamic\":%s,", s->run->loss_scale_dynamic ? "true" : "false");
    json_array(f, "loss_scales", r->loss_scale, r->n);
    fprintf(f, ",\"skipped_steps\":[");
    for (long i = 0, k = 0; i < r->n; i++)
        if (r->skipped[i]) fprintf(f, "%s%ld", k++ ? "," : "", r->first_step + i + 1);
    fprintf(f, "],\"skipped_total\":%ld,\"final_loss_scale\":%.9g", *r->taps.skipped_steps, *r->taps.loss_scale);
    // a step whose gradients were all 0: the scale underflowed them (report.c's count_scaling)
    fprintf(f, ",\"zero_grad_steps\":[");
    for (long i = 0, k = 0; i < r->n; i++)
        if (!r->skipped[i] && r->grad_norm[i] == 0) fprintf(f, "%s%ld", k++ ? "," : "", r->first_step + i + 1);
    fprintf(f, "],\"applied_steps\":%ld", r->n - s->skipped_steps);
}

static const char *const xfer_key[XFER_COUNT] = {"d2h", "h2d", "nvme_read", "nvme_write"};

// The run: what ran, on what, and each step's loss, time, norm and rate.
static void json_run(FILE *f, const Summary *s) {
    const Report *r = s->r;
    const RunFacts *run = s->run;
    const Device *dev = r->taps.dev;
    const GPTConfig *m = &run->layout->cfg;
    // the device's name carries OPENBLAS_CORETYPE, and the model's is a flag: escaped, as every string
    fprintf(f, "{\"stage\":");
    json_write_string(f, run->stage);
    fprintf(f, ",\"ranks\":%d,\"device\":", run->ranks);
    json_write_string(f, dev->name);
    fprintf(f, ",\"comm\":\"%s\",\"mpi_single_copy\":", r->taps.world->backend == COMM_NCCL ? "nccl" : "mpi");
    json_write_string(f, comm_single_copy());
    fprintf(f, ",\"gpu_sharers\":%d,\"model\":", dev->sharers);
    json_write_string(f, run->model);
    fprintf(f, ",\"layers\":%d,\"d_model\":%d,\"heads\":%d,\"vocab\":%d,\"vocab_padded\":%d,\"context\":%d,\"params\":%zu,"
               "\"batch\":%d,\"seq_len\":%d,\"grad_accum\":%d,\"global_batch_tokens\":%.0f,\"first_step\":%ld,"
               "\"steps\":%ld,",
            m->num_layers, m->channels, m->num_heads, m->vocab_size, gpt_vocab_padded(m->vocab_size, 1), m->max_seq_len,
            run->model_params, run->batch, run->seq_len, run->grad_accum, run->tokens_per_step, r->first_step, r->n);
    json_array(f, "losses", r->loss, r->n);
    fprintf(f, ",");
    json_array(f, "step_ms", r->step_ms, r->n);
    fprintf(f, ",");
    json_array(f, "grad_norms", r->grad_norm, r->n);
    fprintf(f, ",");
    json_array(f, "lrs", r->lr, r->n);
    json_precision(f, s);
    if (isnan(r->val_loss)) fprintf(f, ",\"val_loss\":null");
    else fprintf(f, ",\"val_loss\":%.9g", r->val_loss);
}

// Throughput and FLOPs, the model's and the hardware's.
static void json_throughput(FILE *f, const Summary *s) {
    const RunFacts *run = s->run;
    const Device *dev = s->r->taps.dev;
    fprintf(f, ",\"tokens_per_s\":%.3f,\"step_ms_median\":%.3f,\"flops_per_token\":%.6g,\"gflops_per_rank\":%.4f,",
            s->tokens_per_s, s->step_ms_median, s->flops_per_token, s->gflops_per_rank);
    fprintf(f, "\"recompute\":\"%s\",\"attention\":\"%s\",\"hw_flops_per_token\":%.6g,\"hw_gflops_per_rank\":%.4f,",
            gpt_recompute_name(run->plan.recompute), gpt_attention_name(run->plan.attention), s->hw_flops_per_token,
            s->hw_gflops_per_rank);
    const RecomputeWork *w = s->r->taps.recompute;
    if (run->plan.recompute != GPT_RECOMPUTE_NONE)  // rank 0's, counted from the kernels it ran (kernel_meter.c)
        fprintf(f, "\"recompute_work\":{\"blocks\":%ld,\"kernels\":%ld,\"flops\":%.0f,\"kernels_per_block_formula\":%d,"
                   "\"flops_per_block_formula\":%.0f,\"overwrote\":%s%s%s},",
                w->blocks, w->kernels, w->flops, recompute_kernels_per_block(run->layout, &run->plan),
                recompute_flops_per_block(run->layout, &run->plan), w->overwrote ? "\"" : "",
                w->overwrote ? w->overwrote : "null", w->overwrote ? "\"" : "");
    if (dev->peak_flops > 0)
        fprintf(f, "\"mfu\":%.5f,\"hfu\":%.5f,", s->gflops_per_rank * 1e9 / dev->peak_flops,
                s->hw_gflops_per_rank * 1e9 / dev->peak_flops);
    else fprintf(f, "\"mfu\":null,\"hfu\":null,");
}

// Bytes moved: between ranks by operation, between tiers, the activation checkpoints'.
static void json_traffic(FILE *f, const Summary *s) {
    fprintf(f, ",\"comm_bytes_per_step\":%.0f,\"comm_formula_bytes_per_step\":%.0f,\"eval_comm_bytes\":%.0f,",
            s->comm_bytes_step, s->comm_formula_bytes, s->eval_comm_bytes);
    fprintf(f, "\"comm_bytes_by_op_per_step\":{");
    for (int op = 0; op < OP_COUNT; op++)
        fprintf(f, "%s\"%s\":%.0f", op ? "," : "", comm_op_name((CommOp)op), s->op_bytes_step[op]);
    fprintf(f, "},");
    fprintf(f, "\"transfer_bytes_per_step\":{");
    for (int k = 0; k < XFER_COUNT; k++)
        fprintf(f, "%s\"%s\":{\"counted\":%.0f,\"formula\":%.0f}", k ? "," : "", xfer_key[k], s->xfer_step[k],
                s->xfer_formula[k]);
    fprintf(f, "},");
    fprintf(f, "\"offload_activations\":%s,\"act_offload_bytes_per_step\":{\"to_host\":%.0f,\"to_device\":%.0f,"
               "\"formula\":%.0f},", s->run->plan.offload_activations ? "true" : "false", s->act_down, s->act_up,
            s->act_formula);
}

// With the two step times that compute and the transfer (the copies between
// tiers) would give (report_print.c: print_swap_formulas): the sum, and the larger.
static void json_times(FILE *f, const StepTimes *x) {
    fprintf(f, "\"times_ms_per_step\":{\"step\":%.4f,\"compute\":%.4f,\"comm\":%.4f,\"comm_exposed\":%.4f,"
               "\"comm_hidden\":%.4f,\"copy\":%.4f,\"copy_hidden\":%.4f,\"host_optimizer\":%.4f,"
               "\"host_optimizer_hidden\":%.4f,\"io\":%.4f,\"io_hidden\":%.4f,\"act_copy\":%.4f,"
               "\"act_copy_hidden\":%.4f,\"compute_plus_transfer\":%.4f,\"max_compute_transfer\":%.4f}",
            x->step, x->compute, x->comm, x->exposed, x->comm_hidden, x->copy, x->copy_hidden, x->host,
            x->host_hidden, x->io, x->io_hidden, x->act_copy, x->act_copy_hidden, x->compute + x->copy,
            fmax(x->compute, x->copy));
}

FILE *json_begin(const Summary *s, JsonRecord *rec) {
    memset(rec, 0, sizeof *rec);
    rec->f = open_memstream(&rec->text, &rec->bytes);
    CHECK(rec->f, "--json: open_memstream failed; hint: the host is out of memory");
    FILE *f = rec->f;
    json_run(f, s);
    json_throughput(f, s);
    json_mem(f, s);
    json_need(f, &s->run->device_need);
    json_traffic(f, s);
    json_times(f, &s->times);
    settings_json(s->run->settings, f);
    return f;
}

int json_end(const Summary *s, JsonRecord *rec) {
    const RunFacts *run = s->run;
    fprintf(rec->f, "}\n");
    int bad = ferror(rec->f) != 0;
    bad |= fclose(rec->f) != 0;
    CHECK(!bad, "--json: the record could not be built in memory; hint: the host is out of memory");
    bad = out_file_append_whole(run->json, rec->text, rec->bytes) != 0;
    free(rec->text);
    if (!bad) return 0;
    if (errno == ELOOP || errno == EINVAL)
        fprintf(stderr, "%s: error: --json %s: cannot append (%s); the run's record was not written\n", run->stage,
                run->json, errno == ELOOP ? "it became a symbolic link during the run, which outputs never follow"
                                          : "it is no longer a regular file");
    else
        fprintf(stderr, "%s: error: --json %s: writing failed (%s); the run's record was not written\n", run->stage,
                run->json, strerror(errno));
    return 1;
}

// cpu_offload: ZeRO-Offload (Ren et al., ATC 2021) on top of ZeRO-2. The bf16
// params stay on the device (2Ψ); the fp32 master, m and v of the rank's
// shard (12Ψ/N) and its reduced gradient shard (2Ψ/N) live in pinned host
// memory, where a SIMD CPU Adam updates them. The step is pipelined as the
// paper schedules it (sections 4.1-4.2), in sub-groups: this rank's slice of
// each unit.
//   1. Gradients leave in zero2's buckets; as each bucket's reduce-scatter
//      finishes, this rank's part goes down to the host on the copy stream
//      while backward goes on.
//   2. The CPU Adam, on a host thread, takes up a sub-group as soon as its
//      gradients are all on the host: during backward, where the step's
//      gradient scale is known before it ends (--grad-clip 0, bf16);
//      otherwise once the global norm is, in the order the next forward
//      reads the units.
//   3. Each sub-group's new bf16 params go up and are all-gathered as soon
//      as they are ready, so the next forward waits only for its first
//      unit's params.
//
// --dpu, the paper's one-step delayed parameter update: after --dpu-warmup
// ordinary steps, the CPU Adam of step i runs on a host thread while the
// device computes step i+1 with the parameters of step i-1. Master, m and v
// stay exact; only the device copy lags one step. Step i+1's gradients
// arrive in a second host shard while step i's are being applied.
#include "shard_update.h"
#include "check.h"
#include "cpu_offload.h"
#include "kernels.h"

// ---- set-up: the sub-groups ----

// Sub-group u is this rank's slice of unit u. The shard's padding past Ψ
// (zeros that stay zero) rides with the last unit's slice, so the shard
// goes up whole, 2Ψ_pad/N a step.
static void make_sub_groups(Trainer *t, Stage *z) {
    int U = t->layout.num_units;
    z->group_first = xcalloc((size_t)U, sizeof(size_t));
    z->group_count = xcalloc((size_t)U, sizeof(size_t));
    z->grad_need = xcalloc((size_t)U, sizeof(size_t));
    for (int u = 0; u < U; u++) {
        size_t first = 0, n = partition_overlap(&t->part, unit_range(t, u), t->dp->rank, &first);
        z->group_first[u] = n ? first - t->part.begin : 0;
        z->group_count[u] = z->grad_need[u] = n;
    }
    size_t psi = t->layout.num_params, end = t->part.begin + t->part.shard;
    if (end > psi) {  // this rank holds padding: from the last unit's slice (or the padding's start) to its end
        size_t from = z->group_count[U - 1] ? z->group_first[U - 1] : (psi > t->part.begin ? psi - t->part.begin : 0);
        z->group_first[U - 1] = from;
        z->group_count[U - 1] = t->part.shard - from;
    }
}

static void sub_groups_free(Stage *z) {
    free(z->group_first);
    free(z->group_count);
    free(z->grad_need);
    free(z->grad_in);
    free(z->handed);
    free(z->handover);
}

// ---- 2. the CPU Adam on a sub-group as soon as its gradients are in ----

// Run by the device once the copy stream has brought the sub-group's last
// gradients down (a host function: no device or MPI call here).
static void hand_over(void *arg) {
    GroupHandover *h = arg;
    adam_queue_push(&h->z->adam, h->k);
}

// HostGrads' notice of a reduced part queued for the host, flat elements
// [first, first + count): the sub-groups it completes go to the CPU Adam
// once the copy stream has done it.
static void gradients_arrived(Trainer *t, size_t first, size_t count, void *arg) {
    Stage *z = arg;
    if (!z->eager) return;
    size_t lo = first - t->part.begin, hi = lo + count;
    for (int u = 0; u < t->layout.num_units; u++) {
        size_t a = z->group_first[u], b = a + z->grad_need[u];
        if (z->handed[u] || b <= lo || a >= hi) continue;
        z->grad_in[u] += (b < hi ? b : hi) - (a > lo ? a : lo);
        if (z->grad_in[u] < z->grad_need[u]) continue;
        z->handed[u] = 1;
        z->handed_early += !z->flushing;
        dev_host_fn(&t->dev, STREAM_COPY, hand_over, &z->handover[u]);
    }
}

static AdamPass adam_pass(Trainer *t, Stage *z, const AdamWStep *s) {
    return (AdamPass){.master = t->st.master.ptr, .m = t->st.m.ptr, .v = t->st.v.ptr, .grads = t->st.grads.ptr,
                      .params_out = z->params_out[0].ptr, .step = *s, .path = cpu_adam_best_path(),
                      .threads = z->host_threads};
}

// Before the last micro-batch's backward: where the step's gradient scale
// does not wait for the global norm (no clipping; bf16, no loss scale to
// check for overflow), its Adam hyper-parameters are known now, and each
// sub-group can start as soon as its gradients are in.
static void start_eager(Trainer *t, Stage *z) {
    if (z->dpu || t->cfg.grad_clip > 0 || t->scaler.enabled) return;
    z->eager_step = adamw_step_params(&t->cfg, t->step - t->scaler.skipped, 1.0f);
    AdamPass pass = adam_pass(t, z, &z->eager_step);
    adam_queue_begin(&z->adam, &pass);
    int U = t->layout.num_units;
    memset(z->grad_in, 0, (size_t)U * sizeof(size_t));
    memset(z->handed, 0, (size_t)U);
    z->eager = 1;
    z->steps_eager++;
}

// ---- 3. the new params up, unit by unit, as the next forward reads them ----

// SliceReady: a sub-group's new params are final once the CPU Adam is done
// with it (the delayed update's newest shard is final as a whole).
static int slice_ready(void *arg, int u, int wait) {
    Stage *z = arg;
    if (z->dpu) return 1;
    if (wait) adam_queue_wait(&z->adam, u);
    return adam_queue_done(&z->adam, u);
}

// The newest shard up into this rank's slice of the device params on the
// copy stream, and all-gathered, unit by unit as the next forward reads
// them; under --dpu the next CPU Adam writes the other buffer meanwhile.
static void upload_params(Trainer *t, Stage *z) {
    param_refresh_start(&z->refresh, t, z->params_out[z->newest].ptr, slice_ready, z);
    if (z->params_out[1].ptr) z->fill = z->newest ^ 1;
    z->upload_due = 0;
}

static void before_unit(Trainer *t, Stage *z, int u) {
    param_refresh_unit(&z->refresh, t, u);
    if (!z->dpu) adam_queue_trace(&z->adam, &t->trace, "cpu adam");
}

// ---- 1. the micro-batch step: zero2's, with the parts going down to the host ----

// The buckets' reduced parts go down to the host shard as they arrive
// (host_grads.c), while backward goes on; in the last micro-batch each
// sub-group complete on the host may start its update at once.
static double forward_backward(Trainer *t, const MicroBatches *mb) {
    Stage *z = t->sctx;
    GPT *g = &t->model;
    const bf16 *embed = replicated_unit_params(t, GPT_UNIT_EMBED);  // the head reads wte too (tied)
    for (int i = 0; i < mb->count; i++) {
        trainer_micro_batch_to_slot(t, mb, i, 0);
        for (int u = 0; u < g->L.num_units; u++) {
            before_unit(t, z, u);  // the last update's params of this unit are up (the next ones going)
            gpt_unit_forward(g, u, 0, replicated_unit_params(t, u), embed);
        }
        gpt_slot_loss_queue(g, 0);
        if (!mb->backward) continue;
        if (i == mb->count - 1) start_eager(t, z);
        for (int u = g->L.num_units - 1; u >= 0; u--) {
            grad_shard_progress(&z->grads, t);  // MPI moves the buckets in flight only inside its calls
            const float *grads = gpt_unit_backward(g, u, 0, replicated_unit_params(t, u), embed);
            grad_shard_add_unit(&z->grads, t, u, grads, micro_turn(mb, i));  // a full bucket leaves now
        }
        z->flushing = 1;
        grad_shard_flush(&z->grads, t);
        z->flushing = 0;
    }
    return gpt_losses_take(g);  // the one wait for the loss, once per step
}

// ---- the update ----

// Every sub-group not yet taken up goes to the CPU Adam, in forward order,
// and the new params start up as they come; nothing here waits for them.
static void pipelined_update(Trainer *t, Stage *z, const AdamWStep *s) {
    if (z->eager)
        CHECK(!memcmp(&z->eager_step, s, sizeof *s), "step %ld: the sub-groups started during backward used other "
              "Adam hyper-parameters than the step's (lr %g, scale %g)", t->step + 1, s->lr, s->grad_scale);
    else {
        AdamPass pass = adam_pass(t, z, s);
        adam_queue_begin(&z->adam, &pass);
        memset(z->handed, 0, (size_t)t->layout.num_units);
    }
    for (int u = 0; u < t->layout.num_units; u++)
        if (z->group_count[u] && !z->handed[u]) {
            z->handed[u] = 1;
            adam_queue_push(&z->adam, u);
        }
    z->eager = 0;
    z->newest = 0;
    upload_params(t, z);
}

static AdamJob adam_job(Trainer *t, Stage *z, const bf16 *grads, const AdamWStep *s) {
    return (AdamJob){.master = t->st.master.ptr, .m = t->st.m.ptr, .v = t->st.v.ptr, .grads = grads,
                     .params_out = z->params_out[z->fill].ptr, .n = t->part.shard, .step = *s,
                     .path = cpu_adam_best_path(), .threads = z->host_threads};
}

static void run_adam(void *arg) {
    AdamJob *j = arg;
    cpu_adam_step(j->path, j->threads, j->master, j->m, j->v, j->grads, j->params_out, j->n, &j->step);
}

// The job started at the last step (--dpu): wait for it and put it on the
// host optimizer's row of the timeline.
static void collect_job(Trainer *t, Stage *z) {
    if (!z->pending) return;
    double t0, t1;
    host_worker_wait(&z->worker, &t0, &t1);
    trace_span(&t->trace, TRACE_TID_HOST, "cpu adam (delayed)", t0, t1, 0);
    z->pending = 0;
    z->newest = z->fill;
    z->upload_due = 1;
}

// The CPU Adam over the whole shard on this thread, now.
static void run_adam_here(Trainer *t, Stage *z, const AdamWStep *s) {
    z->job = adam_job(t, z, t->st.grads.ptr, s);
    double t0 = now_us();
    run_adam(&z->job);
    trace_span(&t->trace, TRACE_TID_HOST, "cpu adam", t0, now_us(), 0);
    z->newest = z->fill;
}

// LAB 05: delayed_update -- the CPU Adam of step i runs during step i+1
// The delayed update of step i (t->step), threaded: step i-1's update has run
// on the host thread during this step; collect it (collect_job) and send its
// params up (upload_params, when z->upload_due), for step i+1. Then start
// step i's update on the host thread (host_worker_start with run_adam on
// z->job, made by adam_job from these gradients, t->st.grads) and swap the
// two gradient shards (t->st.grads and z->grads_next) so step i+1's arrive
// in the other one while this one is read. Mark it pending (z->pending).
// Master, m and v stay exact; the device's params lag one step. The result
// must equal --dpu-serial's to the bit.
static void delayed_update(Trainer *t, Stage *z, const AdamWStep *s) {
    collect_job(t, z);
    if (z->upload_due) upload_params(t, z);  // goes up during the next forward; the job writes the other buffer
    z->job = adam_job(t, z, t->st.grads.ptr, s);
    Buf applied = t->st.grads;
    t->st.grads = z->grads_next;
    z->grads_next = applied;
    z->pending = 1;
    host_worker_start(&z->worker, run_adam, &z->job);
}
// LAB END

static void update(Trainer *t, const AdamWStep *s) {
    Stage *z = t->sctx;
    dev_sync(&t->dev, STREAM_COPY);  // the whole gradient shard is on the host, the last params up
    if (!z->dpu) {
        pipelined_update(t, z, s);
    } else if (t->step < z->dpu_warmup) {
        run_adam_here(t, z, s);
        upload_params(t, z);
    } else if (z->dpu_serial) {
        // the reference of the delayed update: apply now, show one step later
        if (z->upload_due) upload_params(t, z);
        run_adam_here(t, z, s);
        z->upload_due = 1;
    } else {
        delayed_update(t, z, s);
    }
}

// The update in flight done (its params on their way up reach the device:
// they are due); `to_device` also sends up what --dpu still holds back.
static void finish_update(Trainer *t, int to_device) {
    Stage *z = t->sctx;
    if (!z->dpu) {
        adam_queue_wait_all(&z->adam);
        adam_queue_trace(&z->adam, &t->trace, "cpu adam");
    }
    collect_job(t, z);
    param_refresh_finish(&z->refresh, t);
    if (to_device && z->upload_due) {
        upload_params(t, z);
        param_refresh_finish(&z->refresh, t);
    }
}

static void params_from_master(Trainer *t) {
    Stage *z = t->sctx;
    finish_update(t, 0);
    kernels_cpu.f32_to_half(&t->dev, z->params_out[z->fill].ptr, t->st.master.ptr, t->part.shard);
    z->newest = z->fill;
    upload_params(t, z);
    param_refresh_finish(&z->refresh, t);
}

// ---- set-up and teardown ----

static void setup(Trainer *t) {
    Stage *z = t->sctx;
    cpu_offload_note_settings(t, z);
    cpu_offload_split_threads(t, z);
    grad_shard_init(&z->grads, t, z->bucket_mb);
    host_grads_init(&z->host_grads, &z->grads, t);
    size_t bytes = t->part.shard * sizeof(bf16);
    for (int b = 0; b < (z->dpu ? 2 : 1); b++)
        z->params_out[b] = buf_alloc(&t->dev, TIER_PINNED, CAT_COMM, bytes, "updated bf16 shard");
    make_sub_groups(t, z);
    param_refresh_init(&z->refresh, t, z->group_first, z->group_count);
    int U = t->layout.num_units;
    if (!z->dpu) {
        z->grad_in = xcalloc((size_t)U, sizeof(size_t));
        z->handed = xcalloc((size_t)U, 1);
        z->handover = xcalloc((size_t)U, sizeof(GroupHandover));
        for (int u = 0; u < U; u++) z->handover[u] = (GroupHandover){z, u};
        adam_queue_init(&z->adam, U, z->group_first, z->group_count);
        z->host_grads.arrived = gradients_arrived;
        z->host_grads.arrived_arg = z;
    } else if (!z->dpu_serial) {
        z->grads_next = buf_alloc(&t->dev, TIER_PINNED, CAT_GRADS, bytes, "second gradient shard (--dpu)");
        dev_memset0(&t->dev, z->grads_next.ptr, z->grads_next.bytes, STREAM_COPY);
        host_worker_init(&z->worker);
    }
    dev_sync(&t->dev, STREAM_COPY);
}

// On the device only zero2's buckets: the other buffers are pinned host memory.
static double device_buffer_bytes(const void *ctx, const GPTLayout *l, const Partition *p) {
    const Stage *z = ctx;
    return zero_bucket_bytes(z->bucket_mb, p);
}

// The buckets' four blocks, through the step.
static void step_shape(const void *ctx, const Trainer *t, StepMemorySpec *s) {
    const Stage *z = ctx;
    step_memory_buckets(s, z->bucket_mb, &t->part);
}

static void teardown(Trainer *t) {
    Stage *z = t->sctx;
    if (!z->dpu) {
        adam_queue_wait_all(&z->adam);
        adam_queue_free(&z->adam);
    } else if (!z->dpu_serial) {
        collect_job(t, z);
        host_worker_free(&z->worker);
        buf_free(&t->dev, &z->grads_next);
    }
    param_refresh_free(&z->refresh, t);
    sub_groups_free(z);
    grad_shard_free(&z->grads, t);
    host_grads_free(&z->host_grads, t);
    for (int b = 0; b < 2; b++) buf_free(&t->dev, &z->params_out[b]);
    buf_free(&t->dev, &z->ckpt_params);
}

const Strategy strategy_cpu_offload = {
    .name = "cpu_offload",
    .summary = "ZeRO-Offload on top of ZeRO-2: fp32 master, m, v and the gradient shard in pinned host\n"
               "memory, updated by a SIMD CPU Adam sub-group by sub-group as their gradients arrive; bf16\n"
               "params on the device, each unit's sent up as soon as it is ready. --dpu delays the update by\n"
               "one step so the CPU Adam runs while the device computes the next step.",
    .formula = STAGE_OFFLOAD,
    .configure = cpu_offload_configure,
    // the optimizer states and the gradient shard leave the device for pinned host memory
    .states = {.params = STATE_FULL, .grads = STATE_SHARD, .optim = STATE_SHARD,
               .params_tier = TIER_DEVICE, .grads_tier = TIER_PINNED, .optim_tier = TIER_PINNED},
    .context_bytes = sizeof(Stage),
    .flags = cpu_offload_flags,
    .setup = setup,
    .device_buffer_bytes = device_buffer_bytes,
    .step_shape = step_shape,
    .forward_backward = forward_backward,
    .grad_norm_sq = host_grads_norm_sq,
    .update = update,
    .params_from_master = params_from_master,
    .finish_update = finish_update,
    .ckpt_out = cpu_offload_ckpt_out,
    .ckpt_in = cpu_offload_ckpt_in,
    .report = cpu_offload_report,
    .teardown = teardown,
};

"""mistakes.py: plausible wrong versions of each lab's functions, as a
student writes them from the handout (off by one, the wrong group or
buffer, a missing wait, a skipped step, a wrong memory category, waste that
keeps the bits), each as edits of the reference's text, with the checks to
grade it with (check_lab.py's keys) and the words a FAIL line must carry to
say what went wrong. plant.py grades them; tests/labs/test_lab_mistakes.c
runs it for every lab. This file holds lines of the answers: make_lab.py
leaves tests/labs/ out of every copy.
"""


def m(what, edits, only, says):
    return {"what": what, "edits": edits, "only": only, "says": says}


PS = "04_zero3/param_shard.c"
RC = "common/model/gpt_recompute.c"
RELEASE_IF = "        if (!read_soon(ps->prefetch, &t->layout, num_entries(ps), e, reads[i])) drop(ps, t, reads[i]);\n"
PREFETCH_LOOP = "    for (int k = 1; k <= ps->prefetch && e + k < num_entries(ps); k++) {\n"

LAB_04 = [
    # the six of issue 38, then others around prefetch, release and evaluation
    m("the gathered params never released during backward",
      [(PS, "    int n = entry_reads(&t->layout, e, reads);\n    for (int i = 0; i < n; i++)\n" + RELEASE_IF,
        "    int n = entry_reads(&t->layout, e, reads);\n    if (backward) return;\n    for (int i = 0; i < n; i++)\n"
        + RELEASE_IF)],
      "peaks,device_peak", ["FAIL  peak bytes", "more units stay gathered than --prefetch 2 keeps"]),
    m("no prefetch at all",
      [(PS, PREFETCH_LOOP, "    for (int k = 1; k <= 0 && e + k < num_entries(ps); k++) {\n")],
      "peaks,overlap", ["FAIL  gathers counted", "gathers started only when their entry needs them"]),
    m("the selective recompute writing its output over the saved attention output",
      [(RC, "attention_forward(g->dev, g->work->tmp, la->att,", "attention_forward(g->dev, la->atty, la->att,")],
      "recompute", ["FAIL  --recompute selective, materialized", "it wrote over la->atty, which the block kept"]),
    m("the full recompute running all of block_forward",
      [(RC, "        block_forward_inner(g, p, la, block_input(g, layer, s));", "        block_forward(g, p, layer, s);")],
      "recompute", ["FAIL  --recompute full", "it ran more than backward reads"]),
    m("only the unit's own params released, not the head's",
      [(PS, RELEASE_IF,
        "        if (!read_soon(ps->prefetch, &t->layout, num_entries(ps), e, reads[i])) drop(ps, t, u);\n")],
      "peaks,device_peak", ["FAIL  peak bytes", "releases only the entry's own unit"]),
    m("the gathered buffer counted as a communication buffer",
      [(PS, "TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16)", "TIER_DEVICE, CAT_COMM, r.count * sizeof(bf16)")],
      "peaks", ["FAIL  peak bytes", "the gathered units are counted as comm_buffers"]),
    m("the evaluation prefetching for a backward that never comes",
      [(PS, PREFETCH_LOOP, "    for (int k = 1; k <= ps->prefetch && e + k < 2 * t->layout.num_units; k++) {\n")],
      "eval", ["FAIL  an evaluation's traffic", "for a backward that never comes"]),
    m("the prefetch window one entry short (k < prefetch)",
      [(PS, PREFETCH_LOOP, "    for (int k = 1; k < ps->prefetch && e + k < num_entries(ps); k++) {\n")],
      "peaks", ["FAIL  peak bytes", "fewer units gathered at once than --prefetch 2 asks for"]),
    m("the full recompute handed no input (a crash inside block_recompute's call)",
      [(RC, "        block_forward_inner(g, p, la, block_input(g, layer, s));\n",
        "        block_forward_inner(g, p, la, NULL);\n")],
      "recompute", ["a run crashed", "SIGSEGV", "in block_recompute, one of lab 04's functions"]),
    m("the prefetch window one entry too long (k <= prefetch + 1)",
      [(PS, PREFETCH_LOOP, "    for (int k = 1; k <= ps->prefetch + 1 && e + k < num_entries(ps); k++) {\n")],
      "peaks", ["FAIL  peak bytes", "the prefetch reaches one entry too far"]),
    m("a unit released although the next entry reads it again",
      [(PS, RELEASE_IF, "        drop(ps, t, reads[i]);\n")],
      "comm,overlap", ["FAIL  bytes moved per step", "released while one of the next entries reads it"]),
    m("the prefetch indexed by unit, not by schedule entry",
      [(PS, "        int m = entry_reads(&t->layout, e + k, reads);",
        "        int m = entry_reads(&t->layout, u + k, reads);")],
      "overlap", ["FAIL  gathers counted", "a unit gathered again after it was released"]),
    m("the prefetched units waited for at once too",
      [(PS, "        for (int i = 0; i < m; i++) gather_for(ps, t, reads[i], e + k >= U);\n",
        "        for (int i = 0; i < m; i++) gather_for(ps, t, reads[i], e + k >= U);\n"
        "        for (int i = 0; i < m; i++) finish_gather(ps, t, reads[i]);\n")],
      "overlap", ["FAIL  gathers counted", "waited for at once"]),
    m("its own units never waited for",
      [(PS, "    for (int i = 0; i < n; i++) finish_gather(ps, t, reads[i]);\n", "")],
      "losses", ["FAIL  losses", "params used before they were gathered"]),
    m("hint 2 taken literally: the displacement is the flat index",
      [(PS, "        displs[q] = counts[q] ? first - r.offset : 0;", "        displs[q] = counts[q] ? first : 0;")],
      "losses", ["FAIL  losses", "a run failed", "lie past the buffer's", "not from the whole array's"]),
    m("the slice copied before its buffer is allocated",
      [(PS, "    lu->buf = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16), \"gathered unit params\");\n"
        "    int me = t->dp->rank;\n"
        "    bf16 *own = buf_part(&lu->buf, displs[me], counts[me], sizeof(bf16), \"this rank's slice of the gathered unit\");\n",
        "    int me = t->dp->rank;\n    bf16 *own = (bf16 *)lu->buf.ptr + displs[me];\n"),
       (PS, "    comm_all_gather(t->dp, lu->buf.ptr, counts, displs, DT_HALF, &lu->h);\n",
        "    lu->buf = buf_alloc(&t->dev, TIER_DEVICE, CAT_PARAMS, r.count * sizeof(bf16), \"gathered unit params\");\n"
        "    comm_all_gather(t->dp, lu->buf.ptr, counts, displs, DT_HALF, &lu->h);\n")],
      "losses", ["FAIL  losses", "a run crashed", "SIGSEGV", "one of lab 04's functions", "make sanitize"]),
    m("the displacement subtracted the wrong way round",
      [(PS, "        displs[q] = counts[q] ? first - r.offset : 0;", "        displs[q] = counts[q] ? r.offset - first : 0;")],
      "losses", ["FAIL  losses", "displacement is -", "negative"]),
    m("the slice copied from the shard's start",
      [(PS, "(const bf16 *)t->st.params.ptr + (first - t->part.begin)", "(const bf16 *)t->st.params.ptr")],
      "losses", ["FAIL  losses", "differs"]),
]

DP = "01_dp_baseline/dp_baseline.c"
ALLREDUCE = "    comm_all_reduce_sum(&t->world, t->st.grads.ptr, t->layout.num_params, DT_HALF, NULL);\n"
LAB_01 = [
    m("the all-reduce left out: each replica applies its own gradients",
      [(DP, ALLREDUCE, "")], "comm", ["FAIL  communication per step", "no collective issued"]),
    m("the gradients all-reduced twice",
      [(DP, ALLREDUCE, ALLREDUCE + ALLREDUCE)], "comm", ["FAIL  communication per step", "a collective issued twice"]),
    m("the norm summed over the ranks, which already hold the whole sum",
      [(DP, "    return t->dev.k->sum_squares_bf16(&t->dev, t->st.grads.ptr, t->layout.num_params);",
        "    return comm_sum_f64(&t->world, t->dev.k->sum_squares_bf16(&t->dev, t->st.grads.ptr, t->layout.num_params));")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the update's bf16 params not written (NULL for the output)",
      [(DP, "t->st.grads.ptr, t->st.params.ptr,\n                    t->layout.num_params, s);",
        "t->st.grads.ptr, NULL,\n                    t->layout.num_params, s);")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the update over a shard's length, not all Ψ",
      [(DP, "t->st.grads.ptr, t->st.params.ptr,\n                    t->layout.num_params, s);",
        "t->st.grads.ptr, t->st.params.ptr,\n                    t->part.shard, s);")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("a second copy of the gradients to all-reduce (the same bits, twice the bytes)",
      [(DP, ALLREDUCE, """    Buf copy = buf_alloc(&t->dev, TIER_DEVICE, CAT_GRADS, t->st.grads.bytes, "gradients to reduce");
    dev_copy(&t->dev, copy.ptr, t->st.grads.ptr, t->st.grads.bytes, STREAM_COMPUTE);
    comm_all_reduce_sum(&t->world, copy.ptr, t->layout.num_params, DT_HALF, NULL);
    dev_copy(&t->dev, t->st.grads.ptr, copy.ptr, t->st.grads.bytes, STREAM_COMPUTE);
    buf_free(&t->dev, &copy);
""")],
      "peaks,device_peak", ["FAIL  peak bytes", "device grads_bf16 peak", "a second copy"]),
]

Z1 = "02_zero1/zero1.c"
SU = "02_zero1/shard_update.c"
LAB_02 = [
    m("the all-gather of the updated params left out",
      [(Z1, "    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, own_param_slice(t), s);\n    all_gather_params(t);\n",
        "    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, own_param_slice(t), s);\n")],
      "comm", ["FAIL  communication per step", "a collective missing"]),
    m("every rank's slice gathered to displacement 0",
      [(SU, "        displs[q] = (size_t)q * t->part.shard;", "        displs[q] = 0;")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the norm of the own shard alone, not summed over the ranks",
      [(SU, "    return comm_sum_f64(t->dp, local);", "    return local;")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the updated shard written at the start of the params, not the rank's own slice",
      [(Z1, "    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, own_param_slice(t), s);",
        "    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, t->st.params.ptr, s);")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the shard updated from the local gradient, not the reduced one (the wrong buffer)",
      [(Z1, "    shard_adamw(t, ((Stage *)t->sctx)->reduced.ptr, own_param_slice(t), s);",
        "    shard_adamw(t, (const bf16 *)t->st.grads.ptr + t->part.begin, own_param_slice(t), s);")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("a second copy of the whole gradient to reduce-scatter (the same bits, more bytes)",
      [(Z1, "    comm_reduce_scatter_sum(t->dp, t->st.grads.ptr, z->reduced.ptr, counts, DT_HALF, NULL);\n",
        """    Buf copy = buf_alloc(&t->dev, TIER_DEVICE, CAT_GRADS, t->st.grads.bytes, "gradients to reduce");
    dev_copy(&t->dev, copy.ptr, t->st.grads.ptr, t->st.grads.bytes, STREAM_COMPUTE);
    comm_reduce_scatter_sum(t->dp, copy.ptr, z->reduced.ptr, counts, DT_HALF, NULL);
    buf_free(&t->dev, &copy);
""")],
      "peaks,device_peak", ["FAIL  peak bytes", "device grads_bf16 peak", "a second copy"]),
]

GS = "03_zero2/grad_shard.c"
LAUNCH = "    comm_reduce_scatter_sum(t->dp, bucket_at(gs, b, b->lo), b->recv.ptr, counts, DT_HALF, &b->h);\n"
ADD_PART = "    grads_add_half(t, t->dev.k, b->recv_first - t->part.begin, b->recv.ptr, b->recv_count, b->turn);\n"
LAB_03 = [
    m("a bucket's reduce-scatter waited for as soon as it is launched",
      [(GS, LAUNCH, LAUNCH + "    finish_bucket(gs, t, b);\n")],
      "overlap", ["FAIL  buckets leave during backward", "waited for at once"]),
    m("a bucket sent twice (the same bits, twice the bytes)",
      [(GS, LAUNCH, LAUNCH.replace("&b->h);", "NULL);") + LAUNCH)],
      "comm", ["FAIL  communication per step", "a collective issued twice"]),
    m("every micro-batch's part added, also the step's first (last step's gradients kept)",
      [(GS, ADD_PART, "    t->dev.k->add_bf16(&t->dev, (bf16 *)t->st.grads.ptr + (b->recv_first - t->part.begin), "
        "b->recv.ptr,\n                       b->recv_count);\n")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("rank 0's part noted on every rank (the wrong rank)",
      [(GS, "        if (q == t->dp->rank) b->recv_first = first;", "        if (q == 0) b->recv_first = first;")],
      "losses", ["FAIL  losses"]),
    m("the bucket not emptied after its launch",
      [(GS, "    b->lo = b->top = 0;\n}", "}")],
      "losses", ["FAIL  losses", "units must finish backward in reverse buffer order"]),
    m("a fresh receive buffer allocated at each launch, the old one never freed",
      [(GS, LAUNCH, "    b->recv = buf_alloc(&t->dev, TIER_DEVICE, CAT_COMM, b->recv.bytes, \"reduced bucket part\");\n"
        + LAUNCH)],
      "peaks,device_peak", ["FAIL  peak bytes", "device comm_buffers peak", "more than counted"]),
]

AVX2 = "common/device/cpu_adam_avx2.c"
AVX512 = "common/device/cpu_adam_avx512.c"
OFF = "05_cpu_offload/cpu_offload.c"


def both_tiles(old, new):
    """The same edit in the AVX2 and the AVX-512 loop (the one this CPU runs is the one graded)."""
    return [(AVX2, old.format(w="256"), new.format(w="256")), (AVX512, old.format(w="512"), new.format(w="512"))]


LAB_05 = [
    m("a reciprocal estimate in place of the division",
      both_tiles("_mm{w}_div_ps(mhat, _mm{w}_add_ps(_mm{w}_sqrt_ps(vhat), eps))",
                 "_mm{w}_mul_ps(mhat, _mm{w}_rcp14_ps(_mm{w}_add_ps(_mm{w}_sqrt_ps(vhat), eps)))")
      [1:] + [(AVX2, "_mm256_div_ps(mhat, _mm256_add_ps(_mm256_sqrt_ps(vhat), eps))",
               "_mm256_mul_ps(mhat, _mm256_rcp_ps(_mm256_add_ps(_mm256_sqrt_ps(vhat), eps)))")],
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the two bias corrections swapped",
      both_tiles("_mm{w}_div_ps(mi, bias_corr1);", "_mm{w}_div_ps(mi, bias_corr2);")
      + both_tiles("_mm{w}_div_ps(vi, bias_corr2);", "_mm{w}_div_ps(vi, bias_corr1);"),
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("eps inside the square root",
      both_tiles("_mm{w}_add_ps(_mm{w}_sqrt_ps(vhat), eps)", "_mm{w}_sqrt_ps(_mm{w}_add_ps(vhat, eps))"),
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the first moment decayed with beta2",
      both_tiles("_mm{w}_fmadd_ps(beta1, _mm{w}_loadu_ps(m + i)", "_mm{w}_fmadd_ps(beta2, _mm{w}_loadu_ps(m + i)"),
      "losses", ["FAIL  losses", "the update after it differs"]),
    m("the delayed update on the wrong step's gradients",
      [(OFF, "    z->job = adam_job(t, z, t->st.grads.ptr, s);\n    Buf applied",
        "    z->job = adam_job(t, z, z->grads_next.ptr, s);\n    Buf applied")],
      "knob", ["FAIL  with --dpu: losses", "the update after it differs"]),
    m("the last update's params never sent up",
      [(OFF, "    if (z->upload_due) upload_params(t, z);  // goes up during the next forward; the job writes the other buffer\n",
        "")],
      "knob", ["FAIL  with --dpu: losses", "the update after it differs"]),
    m("the update applied at once under --dpu, not delayed",
      [(OFF, "    host_worker_start(&z->worker, run_adam, &z->job);\n",
        "    host_worker_start(&z->worker, run_adam, &z->job);\n    collect_job(t, z);\n    upload_params(t, z);\n")],
      "knob", ["FAIL  with --dpu: losses", "the update after it differs"]),
]

SW = "06_infinity/swapper.c"
LAB_06 = [
    m("a sub-group read only when the work needs it (serial I/O)",
      [(SW, "            for (int j = k + 1; j < k + SWAP_SLOTS && j < sw->groups; j++)\n"
            "                if (!start_read(sw, j, 0)) break;\n", "")],
      "overlap", ["FAIL  sub-group reads asked for ahead", "serial I/O"]),
    m("the work handed the next sub-group's place in the shard (off by one)",
      [(SW, ".first = group_first(sw, k), .count = n,", ".first = group_first(sw, k + 1 < sw->groups ? k + 1 : k), .count = n,")],
      "losses", ["FAIL  losses"]),
    m("its own sub-group's read not waited for (asked for without blocking)",
      [(SW, "            start_read(sw, k, 1);\n", "            start_read(sw, k, 0);\n")],
      "overlap", ["FAIL  sub-group reads asked for ahead"]),
    m("the write-back started before the work on the sub-group",
      [(SW, "        work(&g, arg);\n        write_back(sw, s, k, what);\n",
        "        write_back(sw, s, k, what);\n        work(&g, arg);\n")],
      "losses", ["FAIL  losses", "are not what this run wrote there (checksum)"]),
    m("the work handed the next sub-group's slot",
      [(SW, "        SwapSlot *s = slot_of(sw, k);\n        if (what & SWAP_READ) {", "        SwapSlot *s = slot_of(sw, k + 1);\n        if (what & SWAP_READ) {")],
      "losses", ["FAIL  losses"]),
]

PL = "07_3d_parallel/pipeline.c"
SCHED = "common/training/pipe_schedule.c"
TP = "common/model/gpt_tp.c"
BL = "common/model/gpt_block.c"
WARMUP = "    int warmup = p->stages - p->stage - 1 < m ? p->stages - p->stage - 1 : m, steady = m - warmup;"
LAB_07 = [
    m("one warm-up forward too few",
      [(PL, WARMUP, "    int warmup = p->stages - p->stage - 2 < 0 ? 0 : (p->stages - p->stage - 2 < m ? "
                    "p->stages - p->stage - 2 : m), steady = m - warmup;")],
      "in_flight", ["FAIL  1F1B with m = 4 > P = 2"]),
    m("one warm-up forward too many",
      [(PL, WARMUP, "    int warmup = p->stages - p->stage < m ? p->stages - p->stage : m, steady = m - warmup;")],
      "in_flight", ["FAIL  1F1B with m = 4 > P = 2"]),
    m("Megatron's f and g swapped",
      [(BL, "    if (!g->plan.sequence_parallel) return ln;", "    if (!g->plan.sequence_parallel) { tp_sum(g, (act *)ln); return ln; }"),
       (BL, "        tp_sum(g, dc);\n", ""),
       (BL, "        tp_sum(g, out);  // g: all-reduce forward\n", ""),
       (BL, "    if (!g->plan.sequence_parallel) return dres;",
        "    if (!g->plan.sequence_parallel) { tp_sum(g, (act *)dres); return dres; }")],
      "f_and_g", ["FAIL  --tp 2 --pp 1", "the forward's sums are wrong"]),
    m("tp_sum over a tp rank's share of the elements, not all B·T·C",
      [(TP, "    size_t n = (size_t)g->plan.B * g->plan.T * g->L.cfg.channels;",
        "    size_t n = (size_t)g->plan.B * g->plan.T * g->L.cfg.channels / g->L.tp_size;")],
      "f_and_g", ["FAIL  --tp 2 --pp 1", "the forward's sums are wrong"]),
    m("tp_sum in 16 bits where the cpu's activations are fp32 (the wrong type)",
      [(TP, "g->dev->act_bytes == 4 ? DT_F32 : DT_HALF, NULL);", "DT_HALF, NULL);")],
      "f_and_g", ["FAIL  --tp 2 --pp 1", "the forward's sums are wrong"]),
    m("the row-parallel bias added on every rank before g's all-reduce",
      [(BL, "    d->k->matmul_forward(d, out, inp, w, NULL, BT, in, C, C);", "    d->k->matmul_forward(d, out, inp, w, bias, BT, in, C, C);")],
      "f_and_g", ["FAIL  --tp 2 --pp 1", "or the row-parallel biases"]),
    m("f's backward all-reducing under sequence parallelism too",
      [(BL, "    if (!g->plan.sequence_parallel) {\n        tp_sum(g, dc);\n        return dc;\n    }\n",
        "    if (1) {\n        tp_sum(g, dc);\n        return dc;\n    }\n")],
      "seq_par", ["FAIL  --sequence-parallel"]),
    m("a W run before its B (the weights' gradient ahead of the input's)",
      [(SCHED, "            } else if (nw[s] < nb[s]) {", "            } else if (nw[s] < nf[s]) {")],
      "zb_h1", ["FAIL  --schedule zb-h1", "before its B"]),
    m("the last micro-batch's W never run",
      [(SCHED, "            } else if (nw[s] < nb[s]) {", "            } else if (nw[s] < nb[s] && nw[s] < m - 1) {"),
       (SCHED, "    int left = 3 * m * P;", "    int left = (3 * m - 1) * P;")],
      "zb_h1", ["FAIL  --schedule zb-h1", "left unfinished"]),
    m("a chunk on the wrong stage (chunk k mod v, not (k / P) mod v)",
      [(SCHED, "            put(t, s, SCHED_F, interleaved_micro(t, k), k / P % v);\n            put(t, s, SCHED_B",
        "            put(t, s, SCHED_F, interleaved_micro(t, k), k % v);\n            put(t, s, SCHED_B"),
       (SCHED, "            put(t, s, SCHED_F, interleaved_micro(t, k), k / P % v);\n        }",
        "            put(t, s, SCHED_F, interleaved_micro(t, k), k % v);\n        }")],
      "interleaved", ["FAIL  --schedule interleaved"]),
]

RING = "common/model/gpt_ring.c"
LAB_07 += [
    m("the zigzag forgotten: rank r's chunks taken as 2r and 2r + 1, in order",
      [(RING, "    int q = c == 0 ? rank : 2 * r->cp - 1 - rank, k = e == 0 ? src : 2 * r->cp - 1 - src;",
        "    int q = 2 * rank + c, k = 2 * src + e;")],
      "ring", ["FAIL  --cp 4 --cp-mode ring", "the forward's attention is wrong"]),
    m("the diagonal chunk attended whole, the causal mask dropped inside it",
      [(RING, "    return k > q ? RING_SKIP : k == q ? RING_CAUSAL : RING_WHOLE;", "    return k > q ? RING_SKIP : RING_WHOLE;")],
      "ring", ["FAIL  --cp 4 --cp-mode ring", "the forward's attention is wrong"]),
    m("every block's result written over the chunk's (no log-sum-exp merge)",
      [(RING, "                                   p->la->att + (size_t)c * r->Tc, p->started[c]);",
        "                                   p->la->att + (size_t)c * r->Tc, 0);")],
      "ring", ["FAIL  --cp 4 --cp-mode ring", "the forward's attention is wrong"]),
]

ULYSSES = "common/model/gpt_ulysses.c"
LAB_07 += [
    # each rank sent a quarter of its positions with every channel, where it owes rank j the j-th
    # quarter of the channels at every position: as many bytes, in the place of heads
    m("the all-to-all swapping heads and positions (parts cut by position, not by channel)",
      [(ULYSSES, "        dev_copy_2d(d, send + j * part, p.Cc * p.ab, (const char *)local + j * p.Cc * p.ab, p.Cp * p.ab,\n"
                 "                    p.Cc * p.ab, p.rows, STREAM_COMPUTE);",
        "        dev_copy_2d(d, send + j * part, part / (size_t)p.B, (const char *)local + j * (part / (size_t)p.B),\n"
        "                    (size_t)p.cp * (part / (size_t)p.B), part / (size_t)p.B, (size_t)p.B, STREAM_COMPUTE);")],
      "ulysses", ["FAIL  --cp 4 --cp-mode ulysses", "the all-to-all from positions to heads"]),
]

MISTAKES = {"01": LAB_01, "02": LAB_02, "03": LAB_03, "04": LAB_04, "05": LAB_05, "06": LAB_06, "07": LAB_07}

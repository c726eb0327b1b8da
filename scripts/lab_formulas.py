"""lab_formulas.py: what check_lab.py holds a run's --json record to, beside
the formula each figure comes from, and the words that say what a mismatch
means. Each function takes a record (a dict) and returns findings: a list of
(what, measured, formula, why) tuples, empty when everything equals.

The formulas come from the record itself, where the stage computed them
before it ran (mem_formula, device_need: run_device_bytes, the gathers,
buckets and swap reads per micro-batch or pass, recompute_work's per block),
or, for the few buffers no record states, from the sizes below.
"""
STATE_CATS = ["params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v"]


def mb(x):
    return f"{x / 1e6:.6f} MB"


def ring(rec):
    """(N-1)/N: the ring's share of a collective's payload that each rank moves."""
    n = rec["ranks"]
    return (n - 1) / n


def gathered_peak(rec):
    """zero3's units gathered at once at its prefetch depth (0 for the stages that keep params whole)."""
    return (rec.get("gathers") or {}).get("peak_bytes_formula", 0)


def bucket_elems(rec):
    """03_zero2's bucket: --bucket-mb, or an eighth of the padded gradients at most 25 MB, at most the whole."""
    padded = rec["params"] + rec["mem_formula"]["padding_params"]
    given = ((rec.get("settings") or {}).get("bucket-mb") or {}).get("value", 0)
    cap = int(given * 1e6 / 2) if given else min(padded // 8, 25 * 1000 * 1000 // 2)
    return max(1, min(cap, padded))


def params_why(got, want, rec, comm_over):
    """Why the device's params_bf16 peak misses shard + the gathered units."""
    g = rec["gathers"]
    p = g["prefetch"]
    if got > want:
        dropped = ("a unit is dropped after the entry that reads it" if p == 0 else
                   f"a unit is dropped after the last of the next {p} entries that read it")
        unit = gathered_peak(rec) / (p + 1)  # about one entry's units
        if got - want <= 1.5 * unit:  # one unit too many: a window one too long, or one release short
            return (f"more units stay gathered than --prefetch {p} keeps, about one unit more: the prefetch reaches "
                    f"one entry too far (a window longer than --prefetch, or counted in units where the schedule's "
                    f"entries are meant), or one release is missing or releases only the entry's own unit (the "
                    f"head reads the embeddings too); {dropped}")
        return (f"more units stay gathered than --prefetch {p} keeps, more than one unit's worth: {dropped}; a "
                "release is missing, or releases only the entry's own unit (the head reads the embeddings too)")
    if comm_over == want - got:
        return ("the gathered units are counted as comm_buffers; they are parameters (CAT_PARAMS), which "
                "the units' peak counts")
    return (f"fewer units gathered at once than --prefetch {p} asks for: an entry's acquire gathers the units of "
            f"the next {p} entries too")


def peak_findings(rec, tiers):
    """Each category's peak on each tier against its formula; the device's categories all of them."""
    found, mem, formula, need = [], rec["mem"], rec["mem_formula"], rec["device_need"]
    gathered = gathered_peak(rec)
    comm_want = need["stage_buffers"] - gathered
    comm_over = mem["device"]["comm_buffers"]["peak"] - comm_want
    for tier in tiers:
        for cat in STATE_CATS:
            got, want = mem[tier][cat]["peak"], formula[tier][cat]
            if tier == "device" and cat == "params_bf16" and "gathers" in rec:
                want += gathered
                if got != want:
                    found.append((f"device params_bf16 peak", got, want, params_why(got, want, rec, comm_over)))
                continue
            if got != want:
                found.append((f"{tier} {cat} peak", got, want, f"{cat} past its formula: a second copy, or one "
                              f"kept in another tier's place" if got > want else f"{cat} under its formula"))
    device = [("activations", formula["activations"], "the saved activations (act_math.c)"),
              ("act_working", formula["act_working"], "the recompute's working set (act_math.c)"),
              ("comm_buffers", comm_want, "the stage's buffers less the gathered units (run_device_bytes)"),
              ("workspace", need["workspace"] + need["kernel_scratch"], "backward scratch + the kernels' scratch")]
    for cat, want, what in device:
        got = mem["device"][cat]["peak"]
        if got != want:
            why = (f"the gathered units are counted here: they are parameters (CAT_PARAMS)"
                   if cat == "comm_buffers" and gathered and got - want == gathered_peak_missing(rec)
                   else f"{what}: {'more' if got > want else 'less'} than counted")
            found.append((f"device {cat} peak", got, want, why))
    if rec["stage"] == "cpu_offload" and "pinned" in tiers:
        # the updated bf16 shard on its way up (two under --dpu: the one going up while the
        # host thread writes the next) and one bucket's reduced part to accumulate
        shard = (rec["params"] + formula["padding_params"]) // rec["ranks"]
        dpu = bool(((rec.get("settings") or {}).get("dpu") or {}).get("value", 0))
        want = (2 if dpu else 1) * 2 * shard + 2 * min(bucket_elems(rec), shard)
        got = mem["pinned"]["comm_buffers"]["peak"]
        if got != want:
            new = "2 x 2Ψ_pad/N for the two new shards of --dpu" if dpu else "2Ψ_pad/N for the new shard"
            found.append(("pinned comm_buffers peak", got, want, f"{new} + 2 min(cap, Ψ_pad/N) for a reduced part: "
                          "more or less than those"))
    return found


def gathered_peak_missing(rec):
    """How far the device's params_bf16 peak falls short of shard + the gathered units (0 when it does not)."""
    want = rec["mem_formula"]["device"]["params_bf16"] + gathered_peak(rec)
    return max(0, want - rec["mem"]["device"]["params_bf16"]["peak"])


def grid_peak_findings(rec):
    """A grid's ranks hold different parts: each rank's states and activations against its own formulas."""
    found = []
    for x in rec["grid"]["ranks"]:
        for what, key in (("states", "states"), ("activations", "activations"), ("act_working", "act_working")):
            if x[key] != x[key + "_formula"]:
                found.append((f"rank {x['rank']} (stage {x['stage']}) {what}", x[key], x[key + "_formula"],
                              f"{what} of this rank's part of the model"))
    return found


def device_peak_finding(rec, peaks):
    """The device peak over all categories against run_device_bytes, counted before the run started."""
    got, want = rec["mem"]["device"]["peak_total"], rec["device_need"]["total"]
    if got == want:
        return []
    where = "; ".join(f"{w} {g - f:+.0f} B" for w, g, f, _ in peaks if w.startswith("device")) or \
        "no single category's peak differs: they peak at different moments than counted"
    return [("device peak", got, want, f"{got - want:+.0f} B against what the run counted before it started "
             f"(run_device_bytes): {where}")]


def gather_comm_findings(rec):
    """zero3's bytes moved: the reduce-scatters' kΨ(N-1)/N and each gather of the schedule, to the byte."""
    g = rec["gathers"]
    k = rec["grad_accum"]
    rs = rec["comm_formula_bytes_per_step"] / 3  # 3kΨ(N-1)/N x 2 B: a third are the reduce-scatters
    ag_want = k * g["elems_per_micro_batch_formula"] * 2 * ring(rec)
    ag_got = rec["comm_bytes_by_op_per_step"]["all_gather"]
    found = []
    if abs(ag_got - ag_want) > 1:
        why = ("a unit released while one of the next entries reads it, and so gathered again for that entry"
               if ag_got > ag_want else
               "fewer bytes gathered than the schedule reads: a unit kept gathered past the entries that read it, or "
               "a slice left out of the gather")
        found.append(("all-gather bytes per step", ag_got, ag_want, why))
    rs_got = rec["comm_bytes_per_step"] - ag_got
    if abs(rs_got - rs) > 1:
        found.append(("reduce-scatter bytes per step", rs_got, rs, "the gradients' kΨ(N-1)/N x 2 B"))
    return found


def eval_findings(rec):
    """An evaluation runs forward only: its gathers are the forward's, no backward's."""
    g = rec["gathers"]
    want = g["eval_micro_batches"] * g["eval_elems_per_micro_batch_formula"] * 2 * ring(rec)
    got = rec["eval_comm_bytes"]
    if abs(got - want) <= 1:
        return []
    why = ("the evaluation gathered more than its forward reads: units for a backward that never comes (an "
           "evaluation's pass, param_shard_begin, ends the schedule after forward: num_entries), or units released "
           "before a next entry read them and gathered again" if got > want else
           "the evaluation gathered less than its forward reads")
    return [("evaluation bytes", got, want, why)]


def gathers_findings(rec):
    """zero3's overlap, counted: gathers issued per micro-batch, and those started ahead of their entry."""
    g = rec.get("gathers")
    if not g:
        return [("gathers", "none", "a \"gathers\" record", "the stage reported no gathers")]
    m, p = g["micro_batches"], g["prefetch"]
    found = []
    if g["issued"] != m * g["per_micro_batch_formula"]:
        found.append(("gathers issued per micro-batch", g["issued"] / m, g["per_micro_batch_formula"],
                      "a unit gathered again after it was released while the schedule still read it: released too "
                      "early, or its prefetch counted in units where the schedule's entries are meant"
                      if g["issued"] > m * g["per_micro_batch_formula"] else
                      "fewer gathers than the schedule's reads need"))
    if g["ahead"] != m * g["ahead_per_micro_batch_formula"]:
        why = (f"gathers started only when their entry needs them: with --prefetch {p} an entry's acquire starts "
               f"the next {p} entries' gathers before it waits for its own" if g["ahead"] < m *
               g["ahead_per_micro_batch_formula"] else
               f"gathers started ahead of use at --prefetch {p}, which asks for "
               f"{'none' if p == 0 else 'every one but the first entry'}")
        found.append(("gathers started while an earlier unit computed, per micro-batch", g["ahead"] / m,
                      g["ahead_per_micro_batch_formula"], why))
    if g.get("waited_early"):
        found.append(("gathers started ahead and waited for before their unit, per micro-batch",
                      g["waited_early"] / m, 0, "the prefetched gathers waited for at once (finish_gather on the next "
                      "entries' units too): they hide nothing; an entry waits only for the units it reads"))
    return found


def bucket_findings(rec):
    """zero2's overlap, counted: every bucket but the flush's leaves while backward still runs."""
    b = rec.get("buckets") or {}
    m, B = b.get("micro_batches", 0), b.get("per_micro_batch_formula", 0)
    if not m:
        return [("buckets", "none", "a \"buckets\" record", "the stage reported no buckets")]
    if b["launched"] == m * B and b["in_flight_in_backward"] == m * (B - 1):
        return []
    return [("buckets in flight during backward per micro-batch", f"{b['in_flight_in_backward'] / m:g} of "
             f"{b['launched'] / m:g}", f"{B - 1} of {B}", "a bucket's reduce-scatter waited for at once, or sent only "
             "after the whole backward: it must be left in flight while backward goes on")]


def swap_read_findings(rec):
    """infinity's overlap, counted: every sub-group's read asked for ahead of the work on it."""
    r = rec.get("swap_reads") or {}
    n, G = r.get("passes", 0), r.get("per_pass_formula", 0)
    if not n:
        return [("swap reads", "none", "a \"swap_reads\" record", "the stage reported no swap reads")]
    if r["waited"] == n * G and r["asked_ahead"] == n * G:
        return []
    return [("sub-group reads asked for ahead, per pass", f"{r['asked_ahead'] / n:g} of {r['waited'] / n:g}",
             f"{G} of {G}", "a read asked for only when it is needed is serial I/O: the pass asks for k + 1 before "
             "the work on k")]


def recompute_findings(rec):
    """The recompute's work per block, counted from its kernels, against the mode's formula."""
    w = rec.get("recompute_work")
    if not w:
        return [("recompute work", "none", "a \"recompute_work\" record", "the run reported no recompute")]
    found, n = [], max(w["blocks"], 1)
    if w["overwrote"]:
        found.append(("tensors written", w["overwrote"], "only what the block did not keep",
                      f"it wrote over {w['overwrote']}, which the block kept: the recompute's outputs go to the "
                      "working set (or the scratch g->work->tmp), never over what was saved"))
    kernels, flops = w["kernels"] / n, w["flops"] / n
    kf, ff = w["kernels_per_block_formula"], w["flops_per_block_formula"]
    if kernels != kf or abs(flops - ff) > 0.5:
        if kf == 0:
            why = ("nothing is recomputed here: this mode keeps what backward reads (flash attention keeps its "
                   "log-sum-exp, not the probabilities)")
        elif flops > ff:
            why = ("it ran more than backward reads: full recompute runs block_forward_inner (the block's forward up "
                   "to the MLP projection), not all of block_forward" if rec["recompute"] == "full" else
                   "it ran more than the attention forward")
        else:
            why = "it skipped work backward reads: what the mode did not keep must be computed again"
        found.append(("recompute per block", f"{kernels:g} kernels, {flops:.0f} FLOP", f"{kf} kernels, {ff:.0f} FLOP",
                      why))
    return found

"""lab_checks.py: which runs each lab's checks make and what each check holds
them to (check_lab.py runs them; lab_formulas.py has the formulas). A check
is (name, passed, measured, expected); where one fails, its measured side
says what the mismatch means.

Every lab runs its stage once as the main run (8 steps on small, 2 ranks;
07 on 4) and holds it to the reference's losses, the model states after the
step, every category's peak on every tier, the device peak against the
count made before the run, the bytes moved and between tiers, and the
overlap the technique promises; then with gradient accumulation, a resume,
and a second setting of the lab's own knob (03 the bucket size, 04 the
prefetch depth, 05 --dpu, 06 the sub-group size). Lab 04 adds the
evaluation's traffic and the recompute in its three modes; 07 the
micro-batches in flight, tensor parallelism on its own, and the interleaved
and zero-bubble tables as --print-schedule draws them.

A lab's checks are one fixed list (check_names): a run that fails or
crashes fails every check made of it, each under its own name, so a score's
denominator is the same for every submission of the lab.
"""
from lab_formulas import (bucket_findings, device_peak_finding, eval_findings, gather_comm_findings, gathers_findings,
                          grid_peak_findings, peak_findings, recompute_findings, swap_read_findings)

MODEL = "--model small --batch 4 --steps 8"
ACCUM = "--batch 2 --grad-accum 2"  # the same global batch in two micro-batches
# lab 07 at m = 4 micro-batches over P = 2 stages: 1F1B proper (at m <= P it is AFAB)
MANY_MICRO = "--batch 1 --grad-accum 4"
IN_FLIGHT = "1F1B with m = 4 > P = 2: micro-batches in flight per stage equal min(P - s, m)"
# lab 07's tensor parallelism apart from the pipeline: tp 2 x dp 2 on its 4 ranks
TP_ALONE = "--tp 2 --pp 1"
F_AND_G = f"{TP_ALONE} (Megatron's f and g): losses equal the reference's to the bit"
SEQ_PAR = "--sequence-parallel (f and g as all-gathers and reduce-scatters): losses equal the plain run's to the bit"
# lab 07's ring attention: every sequence over the 4 ranks, two zigzag chunks each
RING_FLAGS = "--cp 4 --cp-mode ring"
RING = f"{RING_FLAGS} (ring attention over 4 ranks): losses equal the reference's to the bit"
# lab 07's Ulysses: the same 4 ranks, each with every position of one head between the all-to-alls
ULYSSES_FLAGS = "--cp 4 --cp-mode ulysses"
ULYSSES = f"{ULYSSES_FLAGS} (DeepSpeed-Ulysses over 4 ranks): losses equal the reference's to the bit"
# lab 07's schedule tables past 1F1B, drawn (3d_parallel --print-schedule builds and checks them)
TABLES = {
    "interleaved": ("--pp 4 --grad-accum 8 --schedule interleaved --virtual-stages 2 --model small --layers 8",
                    "--schedule interleaved --virtual-stages 2 (P = 4, m = 8): the table is Megatron's"),
    "zb_h1": ("--pp 4 --grad-accum 8 --schedule zb-h1",
              "--schedule zb-h1 (P = 4, m = 8): every B before its W, no W left out, the reference's table"),
}
OVERLAP = {
    "03": "buckets leave during backward: per micro-batch all B = ceil(Ψ/cap) buckets but the last are left in "
          "flight while units still run backward",
    "04": "gathers counted: as many as the schedule's reads need, and at --prefetch P > 0 all but the first entry's "
          "started while an earlier unit computed",
    "06": "sub-group reads asked for ahead of their use: every sub-group of every update pass (the pass asks for "
          "k + 1 before the work on k)",
}
RECOMPUTE = {  # mode: (flags, the losses it must equal: key of expected.json)
    "selective": ("--recompute selective", "losses"),
    "selective, materialized attention": ("--recompute selective --attention materialized", "materialized_losses"),
    "full": ("--recompute full", "losses"),
}
KEYS = ["losses", "states", "peaks", "device_peak", "comm", "xfer", "overlap", "eval", "accum", "resume", "knob",
        "recompute", "in_flight", "f_and_g", "seq_par", "ring", "ulysses", "interleaved",
        "zb_h1"]
MAIN_KEYS = {"losses", "states", "peaks", "device_peak", "comm", "xfer", "overlap", "eval", "resume"}

# lab: (stage binary, the reference it must equal, extra flags of the main run, tiers holding states,
#       the knob's second setting (flags, its name, the losses it must equal: a key of expected.json) or None)
LABS = {
    "01": ("dp_baseline", "dp_baseline", "", ["device"], None),
    "02": ("zero1", "dp_baseline", "", ["device"], None),
    "03": ("zero2", "dp_baseline", "--bucket-mb 0.2", ["device"], ("--bucket-mb 0.5", "--bucket-mb 0.5", "losses")),
    "04": ("zero3", "dp_baseline", "--bucket-mb 0.2 --prefetch 2", ["device"],
           ("--bucket-mb 0.2 --prefetch 0", "--prefetch 0", "losses")),
    "05": ("cpu_offload", "zero2", "", ["device", "pinned"], ("--dpu --dpu-warmup 2", "--dpu", "dpu_losses")),
    # {nvme}: a folder for the swap files under the checks' own temporary
    # folder (in the lab's copy, on the disk the copy is on)
    "06": ("infinity", "zero3", "--nvme-path {nvme} --offload-params nvme --sub-group-mb 0.3",
           ["device", "pinned", "nvme"],
           ("--nvme-path {nvme} --offload-params nvme --sub-group-mb 1", "--sub-group-mb 1", "losses")),
    # the reference's own losses: tensor parallelism adds partial sums in
    # another order than dp_baseline, so the student's code is held to the
    # reference 3d_parallel's bits (1F1B and the f/g all-reduce)
    "07": ("3d_parallel", "3d_parallel", "--tp 2 --pp 2", ["device"], None),
}
RANKS = {"07": 4}  # tp 2 x pp 2; the others run on 2 ranks
# the transfers between tiers each lab's stage makes (the record's transfer_bytes_per_step): a check each
XFER = {"05": ("d2h", "h2d"), "06": ("d2h", "h2d", "nvme_read", "nvme_write")}
FIGURE_KEYS = ("peaks", "device_peak", "comm", "xfer", "overlap", "eval")
KNOB_FIGURES = {"peaks", "device_peak", "comm", "overlap"}


def said(findings):
    """Findings as the measured side of a check: each figure, its formula and what the difference means."""
    def figure(x, what):
        if not isinstance(x, (int, float)):
            return str(x)
        return f"{x:.0f} B" if "peak" in what or "bytes" in what else f"{x:g}"
    return "; ".join(f"{w} {figure(g, w)} against {figure(f, w)}: {why}" for w, g, f, why in findings)


def finding_check(name, findings, shown, want="as the formula"):
    """A check of findings: passed when there are none; `shown` says what equals what when it passes."""
    return (name, not findings, said(findings) or shown, want if findings else "the same")


def shown_of(rec, what):
    """What a passing check saw, in a few figures of the record."""
    if what == "peaks":
        return f"each equal; device params_bf16 {rec['mem']['device']['params_bf16']['peak']} B"
    if what == "device_peak":
        return f"{rec['mem']['device']['peak_total']} B"
    if what == "overlap":
        g, b, r = rec.get("gathers"), rec.get("buckets"), rec.get("swap_reads")
        if g:
            return f"{g['issued'] / g['micro_batches']:g} issued, {g['ahead'] / g['micro_batches']:g} ahead per micro-batch"
        if b:
            return f"{b['in_flight_in_backward'] / b['micro_batches']:g} of {b['launched'] / b['micro_batches']:g}"
        return f"{r['asked_ahead'] / r['passes']:g} of {r['waited'] / r['passes']:g} per pass"
    if what == "comm":
        return f"{rec['comm_bytes_per_step']:.0f} B"
    if what == "eval":
        return f"{rec['eval_comm_bytes']:.0f} B"
    w = rec["recompute_work"]
    return f"{w['kernels'] / max(w['blocks'], 1):g} kernels, {w['flops'] / max(w['blocks'], 1):.0f} FLOP per block"


def losses_check(name, rec, want):
    if "error" in rec:
        return (name, False, rec["error"], "the stage exits 0")
    if want is None:
        return (name, False, "nothing to compare with in .lab/expected.json", "a copy made by this make lab-NN")
    got = rec["losses"]
    if got == want:
        return (name, True, f"{got[-1]:.9g} at step {len(got)}", f"{want[-1]:.9g}")
    k = next(i for i in range(len(want)) if i >= len(got) or got[i] != want[i])
    # a step's loss is its forward's, before its update: step 1 reads the initial weights
    why = ("the forward of the initial weights differs: what a unit reads" if k == 0 else
           f"step {k} equal, so the update after it differs: the gradients it applies (their sum over the ranks, "
           "where they are added), their norm, or the optimizer")
    return (name, False, f"step {k + 1} differs: {got[k] if k < len(got) else 'missing'}: {why}", f"{want[k]:.9g}")


def figure_names(lab, only, label=""):
    """[(key, name)]: the checks run_figure_checks makes of one run's record, in order; the same whether the
    run passes, fails or crashes."""
    xfer_note = " (-1%..0: the head stays live)" if lab == "06" else ""
    names = [("peaks", "peak bytes by tier and category equal their formulas"),
             ("device_peak", "device peak equals what the run counted before it started"),
             ("comm", "bytes moved per step: kΨ(N-1)/N reduce-scattered and each gather of the schedule"
              if lab in ("04", "06") else "communication per step equals the formula")]
    names += [(f"xfer:{k}", f"{k} bytes per step equal the formula{xfer_note}") for k in XFER.get(lab, ())]
    names += [("overlap", OVERLAP.get(lab)),
              ("eval", "an evaluation's traffic is its forward's gathers" if lab == "04" else None)]
    return [(k, n + label) for k, n in names if k.split(":")[0] in only and n]


def failed(names, error, stage):
    """Each check of a run that failed or crashed, failed under its own name with the run's reason."""
    return [(n, False, error, f"{stage} exits 0") for n in names]


def run_figure_checks(lab, rec, only, label=""):
    """What one run's record shows against its formulas: peaks, device peak, bytes moved, overlap, evaluation."""
    tiers = LABS[lab][3]
    out = []
    for key, name in figure_names(lab, only, label):
        if key == "peaks":
            found = grid_peak_findings(rec) if lab == "07" else peak_findings(rec, tiers)
            out.append(finding_check(name, found, shown_of(rec, "peaks")))
        elif key == "device_peak":
            found = device_peak_finding(rec, [] if lab == "07" else peak_findings(rec, tiers))
            out.append(finding_check(name, found, shown_of(rec, "device_peak")))
        elif key == "comm" and lab in ("04", "06"):
            out.append(finding_check(name, gather_comm_findings(rec), shown_of(rec, "comm")))
        elif key == "comm":
            got, want = rec["comm_bytes_per_step"], rec["comm_formula_bytes_per_step"]
            ok = abs(got - want) <= 1
            why = "" if ok else ": " + ("no collective issued" if got == 0 else
                                        "more than the formula: a collective issued twice, or over more than its "
                                        "buffer" if got > want else
                                        "less than the formula: a collective missing, or over part of its buffer")
            out.append((name, ok, f"{got:.0f} B{why}", f"{want:.0f} B"))
        elif key.startswith("xfer:"):
            out.append(xfer_check(lab, name, rec.get("transfer_bytes_per_step", {}).get(key[5:])))
        elif key == "overlap":
            found = {"03": bucket_findings, "04": gathers_findings, "06": swap_read_findings}[lab](rec)
            out.append(finding_check(name, found, shown_of(rec, "overlap"), "the counts' formula"))
        elif key == "eval":
            out.append(finding_check(name, eval_findings(rec), shown_of(rec, "eval")))
    return out


def xfer_check(lab, name, v):
    """One transfer's bytes per step (v: the record's {counted, formula}) against its formula."""
    if v is None:
        return (name, False, "not in the run's record", "the bytes the formula gives")
    # zero3's head stays live from the end of forward into backward, so off the device it is fetched
    # once where the formula counts two: up to 1% under
    got, want = v["counted"], v["formula"]
    ok = 0.99 * want <= got <= want + 1 if lab == "06" else abs(got - want) <= 1
    return (name, ok, f"{got:.0f} B", f"{want:.0f} B")


def main_names(lab, only):
    """The main run's checks by name, in order."""
    names = [("losses", f"losses equal {LABS[lab][1]}'s to the bit (8 steps, {RANKS.get(lab, 2)} ranks)"),
             ("states", "model-state bytes by tier and category equal the formula")]
    names += figure_names(lab, only)
    names.append(("resume", "resume from step 4 reproduces steps 5-8"))
    return [n for k, n in names if k.split(":")[0] in only]


def knob_names(lab):
    """The checks of the run at the knob's second setting, in order."""
    setting = LABS[lab][4][1]
    return ([f"with {setting}: losses equal the reference's to the bit"] +
            [n for _, n in figure_names(lab, KNOB_FIGURES, f" ({setting})")])


def check_names(lab, only=None):
    """Lab `lab`'s checks (those in `only`; all when None), by name, in order: one fixed list, whatever the
    runs do."""
    only = set(only or KEYS)
    stage = LABS[lab][0]
    names = main_names(lab, only) if only & MAIN_KEYS else []
    if "accum" in only:
        names.append(f"with {ACCUM}: losses equal the reference {stage}'s to the bit")
    if "knob" in only and LABS[lab][4]:
        names += knob_names(lab)
    if "recompute" in only and lab == "04":
        names += [recompute_name(mode) for mode in RECOMPUTE]
    if lab == "07":
        names += [n for k, n in (("in_flight", IN_FLIGHT), ("f_and_g", F_AND_G), ("seq_par", SEQ_PAR), ("ring", RING),
                                           ("ulysses", ULYSSES)) if k in only]
        names += [TABLES[k][1] for k in TABLES if k in only]
    return names


def reference_figures(lab, r):
    stage, ref, extra, tiers, knob = LABS[lab]
    expected = {"lab": lab, "stage": stage, "reference": ref,
                "losses": r.run(ref, MODEL + " " + (extra if ref == stage else "")).get("losses")}
    # gradient accumulation: the reference stage itself (its bf16 sums per
    # micro-batch round differently from dp_baseline's single sum)
    expected["accum_losses"] = r.run(stage, f"{MODEL} {extra} {ACCUM}").get("losses")
    if lab == "07":
        expected["tp_losses"] = r.run(stage, f"{MODEL} {TP_ALONE}").get("losses")
        expected["ring_losses"] = r.run(stage, f"{MODEL} {RING_FLAGS}").get("losses")
        expected["ulysses_losses"] = r.run(stage, f"{MODEL} {ULYSSES_FLAGS}").get("losses")
        for k, (flags, _) in TABLES.items():
            expected[k] = r.text(stage, f"{flags} --print-schedule").get("output")
    if lab == "05":
        expected["dpu_losses"] = r.run(stage, f"{MODEL} {knob[0]}").get("losses")
    if lab == "04":  # the textbook attention sums in another order than flash: its own losses
        expected["materialized_losses"] = r.run(stage, f"{MODEL} {extra} --attention materialized").get("losses")
    expected["reference_s"] = round(r.slowest_s, 2)  # sets the checks' time limits (TIME_FACTOR)
    return expected


def run_checks(lab, expected, r, only=None):
    """[(name, passed, measured, expected)] for lab `lab`, the checks in `only` (all when None)."""
    only = set(only or KEYS)
    stage, ref, extra, tiers, knob = LABS[lab]
    out = []
    save = r.tmp / "ck"
    if only & MAIN_KEYS:
        main = r.run(stage, f"{MODEL} {extra}" + (f" --save {save} --save-every 4" if "resume" in only else ""))
        if "error" in main:  # every check of the main run fails with the reason
            out += failed(main_names(lab, only), main["error"], stage)
        else:
            out += main_checks(lab, expected, r, main, only, save)
    if "accum" in only:
        out.append(losses_check(f"with {ACCUM}: losses equal the reference {stage}'s to the bit",
                                r.run(stage, f"{MODEL} {extra} {ACCUM}"), expected.get("accum_losses")))
    if "knob" in only and knob:
        out += knob_checks(lab, expected, r, knob)
    if "recompute" in only and lab == "04":
        out += recompute_checks(expected, r, extra)
    if lab == "07":
        out += grid_checks(expected, r, extra, only)
    if [c[0] for c in out] != check_names(lab, only):  # the grader's own fault: check_lab exits 3
        raise RuntimeError(f"lab {lab}'s checks ran as {[c[0] for c in out]}, not its fixed list "
                           f"{check_names(lab, only)}")
    return out


def main_checks(lab, expected, r, main, only, save):
    stage, ref, extra, tiers, knob = LABS[lab]
    out = []
    if "losses" in only:
        out.append(losses_check(main_names(lab, {"losses"})[0], main, expected.get("losses")))
    if "states" in only:
        bad = [(f"{t}/{c}", main["mem"][t][c]["current"], main["mem_formula"][t][c]) for t in tiers
               for c in ("params_bf16", "grads_bf16", "master_fp32", "adam_m", "adam_v")
               if main["mem"][t][c]["current"] != main["mem_formula"][t][c]]
        out.append(("model-state bytes by tier and category equal the formula", not bad,
                    ", ".join(f"{k} {g:.0f}" for k, g, _ in bad) or "all equal",
                    ", ".join(f"{k} {f:.0f}" for k, _, f in bad) or "all equal"))
    out += run_figure_checks(lab, main, only)
    if "resume" in only:
        resumed = r.run(stage, f"{MODEL} {extra} --resume {save}/step-00000004")
        out.append(losses_check("resume from step 4 reproduces steps 5-8", resumed, main["losses"][4:]))
    return out


def knob_checks(lab, expected, r, knob):
    """The lab's own knob at a second setting: the same figures against the formulas at that setting."""
    stage, (flags, setting, want) = LABS[lab][0], knob
    rec = r.run(stage, f"{MODEL} {flags}")
    names = knob_names(lab)
    if "error" in rec:  # its run failed: every check of it fails, each under its name
        return failed(names, rec["error"], stage)
    return [losses_check(names[0], rec, expected.get(want))] + run_figure_checks(lab, rec, KNOB_FIGURES,
                                                                                  f" ({setting})")


def recompute_name(mode):
    return f"--recompute {mode}: the losses to the bit, activations, and the work per block by the formula"


def recompute_checks(expected, r, extra):
    """block_recompute in each mode: the bits of the run it repeats, the bytes its mode keeps, and its work."""
    out = []
    for mode, (flags, want) in RECOMPUTE.items():
        rec = r.run("zero3", f"{MODEL} {extra} {flags}")
        name = recompute_name(mode)
        if "error" in rec:
            out.append((name, False, rec["error"], "zero3 exits 0"))
            continue
        loss = losses_check(name, rec, expected.get(want))
        acts = [(f"device {c} peak", rec["mem"]["device"][c]["peak"], rec["mem_formula"][c], "the mode keeps what "
                 "its formula says (act_math.c)") for c in ("activations", "act_working")
                if rec["mem"]["device"][c]["peak"] != rec["mem_formula"][c]]
        found = acts + recompute_findings(rec)
        if not loss[1]:
            found.insert(0, ("losses", loss[2], loss[3], "the recomputed tensors must be the forward's bits"))
        shown = f"the same losses; {shown_of(rec, 'recompute')}" if not found else ""
        out.append(finding_check(name, found, shown, "the same bits, bytes and work"))
    return out


def grid_checks(expected, r, extra, only):
    out = []
    if "in_flight" in only:  # 1F1B's warm-up: at m > P each stage s keeps min(P - s, m) micro-batches in flight
        rec = r.run("3d_parallel", f"{MODEL} {extra} {MANY_MICRO}")
        if "error" in rec:
            out.append((IN_FLIGHT, False, rec["error"], "3d_parallel exits 0"))
        else:
            ranks = rec["grid"]["ranks"]
            got = "/".join(str(int(x["peak_in_flight"])) for x in ranks if x["tp_rank"] == 0)
            want = "/".join(str(int(x["in_flight_formula"])) for x in ranks if x["tp_rank"] == 0)
            out.append((IN_FLIGHT, got == want, f"stages {got}", f"stages {want}"))
    if "f_and_g" in only:
        out.append(f_and_g_check(r.run("3d_parallel", f"{MODEL} {TP_ALONE}"), expected.get("tp_losses")))
    if "seq_par" in only:
        out.append(losses_check(SEQ_PAR, r.run("3d_parallel", f"{MODEL} {extra} --sequence-parallel"),
                                expected.get("losses")))
    if "ring" in only:
        out.append(ring_check(r.run("3d_parallel", f"{MODEL} {RING_FLAGS}"), expected.get("ring_losses")))
    if "ulysses" in only:
        out.append(ulysses_check(r.run("3d_parallel", f"{MODEL} {ULYSSES_FLAGS}"), expected.get("ulysses_losses")))
    for k, (flags, name) in TABLES.items():
        if k in only:
            out.append(table_check(name, r.text("3d_parallel", f"{flags} --print-schedule"), expected.get(k)))
    return out


def table_check(name, got, want):
    """A schedule's table as --print-schedule draws it, against the reference's: a table the check refuses
    (a B before its F, a W before its B, one left out, a deadlock) says so; another valid table names its
    first row that differs."""
    if want is None:
        return (name, False, f"no table in .lab/expected.json", "a copy made by this make lab-07")
    if "error" in got:
        return (name, False, got["error"], "the table drawn")
    if got["output"] == want:
        return (name, True, want.strip().splitlines()[-1], "the same table")
    mine, theirs = got["output"].splitlines(), want.splitlines()
    k = next(i for i in range(len(theirs)) if i >= len(mine) or mine[i] != theirs[i])
    return (name, False, f"another table: {mine[k] if k < len(mine) else 'no line'}",
            f"{theirs[k]} (and the reference's last line: {theirs[-1]})")


def forward_named_check(name, rec, want, forward):
    """losses_check, and where step 1 already differs (its loss reads the forward alone), what of the forward
    to look at: `forward`."""
    _, passed, measured, expected = losses_check(name, rec, want)
    if not passed and "error" not in rec and want is not None and rec["losses"][:1] != want[:1]:
        measured = f"step 1 differs ({rec['losses'][0]:.9g}): the forward's attention is wrong: {forward}"
    return (name, passed, measured, expected)


def ring_check(rec, want):
    """Lab 07's ring attention: step 1's loss reads the forward alone (which key chunks each query chunk meets,
    causally or whole, and how their results merge); a later step's also the backward's gradients."""
    return forward_named_check(RING, rec, want, "which key chunks a query chunk meets (the zigzag: chunks r and "
                               "2·cp - 1 - r), which of them causally, or how their results merge")


def ulysses_check(rec, want):
    """Lab 07's Ulysses: step 1's loss reads the forward alone, where the first all-to-all gives each rank every
    position of its heads; a later step's also the backward, which takes the output's gradient the same way."""
    return forward_named_check(ULYSSES, rec, want, "the all-to-all from positions to heads (rank j takes the j-th "
                               "Cp/cp channels of every row, and what comes from rank j is rank j's positions, j·T "
                               "onwards of each sequence)")


def f_and_g_check(rec, want):
    """Lab 07's tensor parallelism alone, naming the pass that differs: step 1's loss
    reads only the forward (g's all-reduce, f's identity); the later ones also the
    gradients of the backward before them (f's all-reduce, g's identity)."""
    if want is None:
        return (F_AND_G, False, "no tp_losses in .lab/expected.json", "a copy made by this make lab-07")
    if "error" in rec:
        return (F_AND_G, False, rec["error"], "3d_parallel exits 0")
    got = rec["losses"]
    if got == want:
        return (F_AND_G, True, f"{got[-1]:.9g} at step 8", f"{want[-1]:.9g}")
    k = next(i for i in range(len(want)) if i >= len(got) or got[i] != want[i])
    if k == 0:
        where = (f"step 1 differs ({got[0]:.9g}): the forward's sums are wrong (g all-reduces after a "
                 "row-parallel linear; f is the identity)")
    else:
        where = (f"step 1 equal, step {k + 1} differs: the backward's sums are wrong (f all-reduces the "
                 "column-parallel linear's input gradient; g is the identity), or the row-parallel biases, zero "
                 "until the first update (added once, after g's all-reduce)")
    return (F_AND_G, False, where, f"{want[min(k, len(want) - 1)]:.9g} at step {k + 1}")

// longest.c: memory_math --longest-seq: the longest sequence each stage's
// budget check admits. For --model, --batch, --ranks and --hbm-gb, each
// stage's run at T tokens is counted as its budget check counts it before
// step 1 (the formula's timeline of a step, timeline.c: model states,
// activations, workspace, scratch and buffers at once), with the context
// grown to T where T passes the preset's (wpe: T·C params); the longest T
// whose peak is within the budget is found by bisection (the peak grows with
// T). Three ways of running each stage: the run's own flags, --recompute
// full, and --recompute full with the loss and the MLPs in tiles (ALST).
// 3d_parallel's grid (pp 1, --tp as given) has a row for each sequence
// split that N allows: cp 2, 4 and 8 (and a --cp given) in each mode, its T
// a multiple of cp (of 2·cp for the ring); and one at --tp alone. The count
// is the budget check's: the bytes within the budget, and the region the
// step's blocks need where the device's arena places them (each rounded up
// to 4 kB pages, the holes between them included) within the cpu device's
// region (run_fits). Where holes make that region grow unevenly with T,
// the T found passes and T + 1 does not, but a longer T may pass again.
#include <stdio.h>
#include <string.h>
#include "memory_math.h"

#define TILES 8  // the tiled way's --tiled-loss and --tiled-mlp

typedef struct Way {
    const char *key;   // its JSON name
    const char *name;  // the flags it adds
    int own;           // the run's own --recompute and tiles
    GPTRecompute recompute;
    int tiles;
} Way;

static const Way ways[] = {
    {"own", "the run's flags", 1, GPT_RECOMPUTE_NONE, 0},
    {"full", "--recompute full", 0, GPT_RECOMPUTE_FULL, 0},
    {"full_tiled", "full, --tiled-loss 8 --tiled-mlp 8", 0, GPT_RECOMPUTE_FULL, TILES},
};
#define NWAYS (int)(sizeof ways / sizeof ways[0])

// The inputs of a run of T tokens the way w: the context T where T passes
// the model's (unless --context was given: then T is at most it).
static Inputs at_length(const Inputs *in, const Way *w, int T) {
    Inputs probe = *in;
    GPTConfig cfg = in->layout.cfg;
    if (T > cfg.max_seq_len) cfg.max_seq_len = T;
    gpt_layout(&probe.layout, &cfg);
    probe.psi = (double)probe.layout.num_params;
    probe.seq_len = T;
    probe.tp = 1;
    if (!w->own) {
        probe.recompute = w->recompute;
        probe.offload_activations = 0;
        // (a micro-batch shorter than the tiles has one token a chunk)
        probe.tiled_loss = probe.tiled_mlp = (long)in->batch * T < w->tiles ? in->batch * T : w->tiles;
    }
    return probe;
}

#define GRID_ROW ((StageId)-1)  // 3d_parallel's --tp/--cp grid

// ... and for the stage s (the grid: at --tp as given)
static Inputs probe_of(StageId s, const Inputs *in, const Way *w, int T) {
    Inputs probe = at_length(in, w, T);
    if (s == GRID_ROW) {
        probe.tp = in->tp;
        gpt_layout_tp(&probe.tp_layout, &probe.layout.cfg, in->tp, 0);
    }
    return probe;
}

static int fits(StageId s, const Inputs *in, const Way *w, int T, double budget) {
    Inputs probe = probe_of(s, in, w, T);
    RunDeviceBytes r = s == GRID_ROW ? run_grid_bytes(&probe) : run_stage_bytes(s, &probe);
    return run_fits_budget(&r, budget);
}

// What fills the memory at T the way w: the two largest categories at the
// step's peak, of the peak's total, and the phase it falls in.
static void filled_by(StageId s, const Inputs *in, const Way *w, int T, char *out, size_t n) {
    if (T < 1) {
        snprintf(out, n, "-");
        return;
    }
    Inputs probe = probe_of(s, in, w, T);
    MemPhase at;
    double bytes[CAT_COUNT], total = 0;
    step_peak_parts(s == GRID_ROW ? STAGE_ZERO1 : s, s == GRID_ROW, &probe, &at, bytes);
    int top[2] = {-1, -1};
    for (int c = 0; c < CAT_COUNT; c++) {
        total += bytes[c];
        if (top[0] < 0 || bytes[c] > bytes[top[0]]) top[1] = top[0], top[0] = c;
        else if (top[1] < 0 || bytes[c] > bytes[top[1]]) top[1] = c;
    }
    char where[96];
    snprintf(out, n, "%s %.1f + %s %.1f of %.1f MB, %s", mem_category_name((MemCategory)top[0]), bytes[top[0]] / 1e6,
             mem_category_name((MemCategory)top[1]), bytes[top[1]] / 1e6, total / 1e6,
             mem_phase_text(at, where, sizeof where));
}

// The longest T in [1, most] that fits (0: not even one token); the grid's
// a multiple of its C (n·C, n searched).
static int longest(StageId s, const Inputs *in, const Way *w, int most, double budget) {
    int q = s == GRID_ROW && in->cp > 1 ? in->cp * (in->cp_ring ? 2 : 1) : 1;  // ring: 2·C chunks
    most /= q;
    if (most < 1 || !fits(s, in, w, q, budget)) return 0;
    int lo = 1, hi = 2;  // lo fits; find an hi that does not, or the most
    while (hi <= most && fits(s, in, w, hi * q, budget)) lo = hi, hi *= 2;
    if (hi > most) {
        if (fits(s, in, w, most * q, budget)) return most * q;
        hi = most;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        if (fits(s, in, w, mid * q, budget)) lo = mid;
        else hi = mid;
    }
    return lo * q;
}

// A row of 3d_parallel at tp·cp (Ulysses, or the ring), the rest as given.
static void grid_row(Printer *p, const Inputs *in, int tp, int cp, int ring, int most, double budget) {
    Inputs grid = *in;
    grid.tp = tp;
    grid.cp = cp;
    grid.cp_ring = ring;
    char name[80];
    snprintf(name, sizeof name, "3d_parallel --tp %d --cp %d%s", tp, cp, cp > 1 && ring ? " --cp-mode ring" : "");
    Cell row[NWAYS + 2];
    row[0] = cell_str(name);
    for (int k = 0; k < NWAYS; k++) row[1 + k] = cell_num(longest(GRID_ROW, &grid, &ways[k], most, budget));
    char fill[160];
    filled_by(GRID_ROW, &grid, &ways[0], (int)row[1].v, fill, sizeof fill);
    row[1 + NWAYS] = cell_str(fill);
    printer_row(p, row);
}

void section_longest(Printer *p, const Inputs *in) {
    double budget = in->hbm_gb * 1e9;
    // the longest a flag allows: the context given, else the build's; a micro-batch of at most GPT_MAX_TOKENS
    int most = in->context_given ? in->layout.cfg.max_seq_len : GPT_MAX_CONTEXT;
    if ((double)most * in->batch > GPT_MAX_TOKENS) most = GPT_MAX_TOKENS / in->batch;
    char title[320];
    snprintf(title, sizeof title, "The longest sequence each stage's budget check admits in %g GB per rank at N = %d: %s, B = %d, "
             "the context grown to T where T passes %s's %d%s; counted as the trainers' budget check counts them "
             "(the formula's timeline of a step, on the cpu device), by bisection over T", in->hbm_gb, in->ranks,
             in->model, in->batch, in->model, in->layout.cfg.max_seq_len, in->context_given ? " (--context: at most it)" : "");
    printer_section(p, "longest_seq", title);
    Col cols[NWAYS + 2] = {{"stage", "stage", 44, NULL}};
    for (int k = 0; k < NWAYS; k++)
        cols[1 + k] = (Col){ways[k].key, ways[k].name, (int)strlen(ways[k].name), "%.0f"};
    cols[1 + NWAYS] = (Col){"filled_by", "what fills it at the run's T", 27, NULL};
    printer_table(p, "stages", cols, NWAYS + 2);
    for (int i = 0; i < measured_stage_count(); i++) {
        StageId s = measured_stage(i);
        Cell row[NWAYS + 2];
        row[0] = cell_str(stage_name(s));
        for (int k = 0; k < NWAYS; k++) row[1 + k] = cell_num(longest(s, in, &ways[k], most, budget));
        char fill[160];
        filled_by(s, in, &ways[0], (int)row[1].v, fill, sizeof fill);
        row[1 + NWAYS] = cell_str(fill);
        printer_row(p, row);
    }
    // 3d_parallel's grid (pp 1): at --tp alone, and with the sequence over
    // cp 2, 4 and 8 (and the --cp given) in each mode, where tp·cp divides N
    // (and, for Ulysses, the heads)
    if (in->tp > 1 && in->cp == 1) grid_row(p, in, in->tp, 1, 0, most, budget);
    int cps[4] = {2, 4, 8, in->cp}, n = in->cp == 2 || in->cp == 4 || in->cp == 8 ? 3 : 4;
    for (int k = 0; k < n; k++) {
        if (cps[k] < 2) continue;
        for (int ring = 0; ring < 2; ring++) {
            int split = in->tp * cps[k];
            if (in->ranks % split || (!ring && in->layout.cfg.num_heads % split)) continue;
            grid_row(p, in, in->tp, cps[k], ring, most, budget);
        }
    }
    printer_table_end(p);
    printer_note(p, "the run's flags: --recompute %s%s, --tiled-loss %d, --tiled-mlp %d; 0: not one token fits. A "
                 "trainer given --seq-len T and this budget passes its budget check at the T above and is refused "
                 "at T + 1 (3d_parallel at T + cp, or 2·cp for the ring; test_context, test_context_parallel, make "
                 "bench's section longest); it counts the bytes and the region the step's blocks need where the "
                 "device's arena places them: each rounded up to 4 kB pages, the free bytes left in holes between "
                 "them included (the step replayed through the arena, step_memory.c), so a run at T trains.",
                 gpt_recompute_name(in->recompute),
                 in->offload_activations ? " --offload-activations" : "", in->tiled_loss, in->tiled_mlp);
    printer_section_end(p);
}

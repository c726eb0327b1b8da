// ckpt_manifest.c: a checkpoint's manifest (see ckpt_manifest.h): the table
// of its lines, the text rank 0 writes, and the parse and checks of a resume.
#include "ckpt_manifest.h"
#include "gpt_grid.h"
#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "check.h"
#include "train_limits.h"

// The manifest's numeric lines. int fields are signed; 8-byte ones (long,
// uint64_t, size_t on LP64) unsigned; doubles are written with 17 significant
// digits, which read back to the same double. The group says what a mismatch means.
// GROUP_MATH: the settings of the update, which a resume may change (a
// note); GROUP_DATA: the data's identity, which it may not.
// Each field is read within [lo, hi] (OPEN_LO, OPEN_HI: that bound
// excluded): the range of the flag that sets it (trainer_flags.c), so that a
// damaged manifest is refused rather than trusted (a negative learning rate
// from skipped_steps past the step, a loss scale no flag allows).
enum { GROUP_RUN, GROUP_MODEL, GROUP_BATCH, GROUP_DATA, GROUP_MATH };
enum { OPEN_LO = 1, OPEN_HI = 2 };
typedef struct Field {
    const char *key;
    size_t off, size;
    int group, is_double;
    const char *flag;  // the flag that sets it (a GROUP_MATH change is noted by it)
    double lo, hi;
    int open;
} Field;
#define ANY 0, INFINITY  // a count or checksum: any value of its type
#define RANGE(...) __VA_ARGS__  // (lo, hi) without its parentheses
#define FIELD(key, member, group, flag, lo_hi) \
    {key, offsetof(CkptManifest, member), sizeof(((CkptManifest *)0)->member), group, 0, flag, RANGE lo_hi, 0}
#define FIELD_DOUBLE(key, member, group, flag, lo_hi, open) \
    {key, offsetof(CkptManifest, member), sizeof(double), group, 1, flag, RANGE lo_hi, open}
static const Field FIELDS[] = {
    FIELD("ranks", ranks, GROUP_RUN, NULL, (1, INT_MAX)),
    FIELD("step", step, GROUP_RUN, NULL, (0, TRAIN_MAX_STEPS)),
    FIELD("data_rows", data_rows, GROUP_RUN, NULL, (ANY)),
    FIELD("seed", seed, GROUP_RUN, "seed", (0, INT_MAX)),
    FIELD("rng_state", rng_state, GROUP_RUN, NULL, (ANY)),
    FIELD("max_seq_len", cfg.max_seq_len, GROUP_MODEL, "context", (1, GPT_MAX_CONTEXT)),
    FIELD("vocab_size", cfg.vocab_size, GROUP_MODEL, "vocab", (2, GPT_MAX_VOCAB)),
    FIELD("vocab_padded", vocab_padded, GROUP_MODEL, NULL, (2, INT_MAX)),
    FIELD("num_layers", cfg.num_layers, GROUP_MODEL, "layers", (1, GPT_MAX_UNITS - 2)),
    FIELD("num_heads", cfg.num_heads, GROUP_MODEL, "heads", (1, GPT_MAX_HEADS)),
    FIELD("channels", cfg.channels, GROUP_MODEL, "d-model", (1, GPT_MAX_CHANNELS)),
    FIELD("num_params", num_params, GROUP_MODEL, NULL, (1, INFINITY)),
    FIELD("batch", batch, GROUP_BATCH, "batch", (1, GPT_MAX_BATCH)),
    FIELD("seq_len", seq_len, GROUP_BATCH, "seq-len", (1, GPT_MAX_CONTEXT)),
    FIELD("grad_accum", grad_accum, GROUP_BATCH, "grad-accum", (1, TRAIN_MAX_GRAD_ACCUM)),
    FIELD("total_steps", total_steps, GROUP_MATH, "steps", (1, TRAIN_MAX_STEPS)),
    FIELD("warmup", warmup, GROUP_MATH, "warmup", (0, INT_MAX)),
    FIELD_DOUBLE("lr", lr, GROUP_MATH, "lr", (0, FLT_MAX), OPEN_LO),
    FIELD("data_tokens", data_tokens, GROUP_DATA, NULL, (ANY)),
    FIELD("data_checksum", data_checksum, GROUP_DATA, NULL, (ANY)),
    FIELD_DOUBLE("grad_clip", grad_clip, GROUP_MATH, "grad-clip", (0, INFINITY), 0),
    FIELD_DOUBLE("weight_decay", weight_decay, GROUP_MATH, "weight-decay", (0, 1), 0),
    FIELD_DOUBLE("beta1", beta1, GROUP_MATH, "beta1", (0, 1), OPEN_HI),
    FIELD_DOUBLE("beta2", beta2, GROUP_MATH, "beta2", (0, 1), OPEN_HI),
    FIELD_DOUBLE("adam_eps", adam_eps, GROUP_MATH, "adam-eps", (0, 1), OPEN_LO),
    FIELD_DOUBLE("min_lr_frac", min_lr_frac, GROUP_MATH, "min-lr-frac", (0, 1), 0),
    FIELD_DOUBLE("warmup_start_frac", warmup_start_frac, GROUP_MATH, "warmup-start-frac", (0, 1), 0),
    FIELD("schedule_steps", schedule_steps, GROUP_MATH, "schedule-steps", (0, TRAIN_MAX_STEPS)),
    // bf16 saves 1; fp16 its scale, which --loss-scale and --min-loss-scale cap at 1e30
    FIELD_DOUBLE("loss_scale", loss_scale, GROUP_RUN, "loss-scale", (0, 1e30), OPEN_LO),
    FIELD("scale_last_overflow", scale_last_overflow, GROUP_RUN, NULL, (-1, TRAIN_MAX_STEPS)),  // -1: none
    // overflows still tolerated: at most --hysteresis; 0, which a resume reads as a fresh --hysteresis, too
    FIELD("scale_hysteresis_left", scale_hysteresis_left, GROUP_RUN, NULL, (0, INT_MAX)),
    FIELD("skipped_steps", skipped_steps, GROUP_RUN, NULL, (0, TRAIN_MAX_STEPS)),
};
_Static_assert(sizeof FIELDS / sizeof FIELDS[0] <= 32, "manifest_parse marks the fields seen in 32 bits");

// The manifest's text lines besides `stage` and `grid`; GROUP_MATH ones are
// the settings named by `flag`, GROUP_RUN the data's path.
typedef struct TextField {
    const char *key;
    size_t off, size;
    int group;
    const char *flag;
    const char *names;  // the values its flag takes, "a|b|c" (NULL: any)
    const char *absent;  // what a manifest saved before the line existed meant (NULL: the line is required)
} TextField;
#define TEXT(key, member, group, flag, names) \
    {key, offsetof(CkptManifest, member), sizeof(((CkptManifest *)0)->member), group, flag, names, NULL}
#define TEXT_SINCE(key, member, group, flag, absent) \
    {key, offsetof(CkptManifest, member), sizeof(((CkptManifest *)0)->member), group, flag, NULL, absent}
static const TextField TEXTS[] = {
    TEXT("data", data, GROUP_RUN, NULL, NULL),
    TEXT("data_order", data_order, GROUP_MATH, "data-order", "permuted|sequential"),
    TEXT("lr_schedule", lr_schedule, GROUP_MATH, "lr-schedule", "cosine|WarmupLR|WarmupDecayLR|WarmupCosineLR"),
    TEXT("warmup_type", warmup_type, GROUP_MATH, "warmup-type", "log|linear"),
    TEXT("precision", precision, GROUP_MATH, "precision", "bf16|fp16"),
    // ZeRO++'s quantization (zero3), which changes every step's math: qwZ's
    // int8 weights in the forward and backward, qgZ's quantized gradients
    TEXT_SINCE("quantize_weights", quantize_weights, GROUP_MATH, "quantize-weights", "off"),
    TEXT_SINCE("quantize_grads", quantize_grads, GROUP_MATH, "quantize-grads", "off"),
    TEXT_SINCE("quant_block", quant_block, GROUP_MATH, "quant-block", "none"),
};
#define NTEXTS ((int)(sizeof TEXTS / sizeof TEXTS[0]))
static const char *text_of(const CkptManifest *m, int i) { return (const char *)m + TEXTS[i].off; }
#define NFIELDS ((int)(sizeof FIELDS / sizeof FIELDS[0]))
_Static_assert(sizeof(long) == 8 && sizeof(size_t) == 8, "manifest fields assume LP64");

static uint64_t field_get(const CkptManifest *m, int i) {
    const char *p = (const char *)m + FIELDS[i].off;
    if (FIELDS[i].size == sizeof(int)) return (uint64_t)(int64_t) * (const int *)p;
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

// Parses the value text; 1 when it is not a number of the field's kind
// (a whole number within its type, or a finite double).
static int field_set(CkptManifest *m, int i, const char *text) {
    char *p = (char *)m + FIELDS[i].off, *end;
    errno = 0;
    if (FIELDS[i].is_double) {
        double x = strtod(text, &end);
        *(double *)p = x;
        return end == text || *end != 0 || !isfinite(x);
    }
    if (FIELDS[i].size == sizeof(int)) {
        long x = strtol(text, &end, 10);
        *(int *)p = (int)x;
        return end == text || *end != 0 || errno != 0 || x < INT_MIN || x > INT_MAX;
    }
    *(uint64_t *)p = strtoull(text, &end, 10);
    return end == text || *end != 0 || errno != 0 || text[0] == '-';
}

static char *field_format(const CkptManifest *m, int i, char *buf) {  // buf of 32
    if (FIELDS[i].is_double) snprintf(buf, 32, "%.17g", *(const double *)((const char *)m + FIELDS[i].off));
    else if (FIELDS[i].size == sizeof(int)) snprintf(buf, 32, "%" PRId64, (int64_t)field_get(m, i));
    else snprintf(buf, 32, "%" PRIu64, field_get(m, i));
    return buf;
}

int ckpt_math_changes(const CkptManifest *got, const CkptManifest *expect, char *out, size_t n) {
    int changes = 0;
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < NFIELDS + NTEXTS; i++) {
        char a[256], b[256];
        const char *flag;
        if (i < NFIELDS) {
            if (FIELDS[i].group != GROUP_MATH || field_get(got, i) == field_get(expect, i)) continue;
            // doubles as %g: the note is read, the manifest keeps them exactly
            if (FIELDS[i].is_double) {
                snprintf(a, sizeof a, "%g", *(const double *)((const char *)got + FIELDS[i].off));
                snprintf(b, sizeof b, "%g", *(const double *)((const char *)expect + FIELDS[i].off));
            } else {
                field_format(got, i, a);
                field_format(expect, i, b);
            }
            flag = FIELDS[i].flag;
        } else {
            int k = i - NFIELDS;
            if (TEXTS[k].group != GROUP_MATH || strcmp(text_of(got, k), text_of(expect, k)) == 0) continue;
            snprintf(a, sizeof a, "%s", text_of(got, k));
            snprintf(b, sizeof b, "%s", text_of(expect, k));
            flag = TEXTS[k].flag;
        }
        if (len < n) len += (size_t)snprintf(out + len, n - len, "%s--%s %s -> %s", changes ? ", " : "", flag, a, b);
        changes++;
    }
    return changes;
}


// The manifest's text: a comment, stage and grid, every field and text line,
// then each rank's part line (malloc'd; *len bytes).
char *manifest_text(const CkptManifest *m, int ranks, const PartInfo *parts, size_t *len_out) {
    size_t cap = 8192 + 64 * (size_t)ranks, len = 0;
    char *text = xmalloc(cap);
    len += snprintf(text + len, cap - len, "# zero-workbench checkpoint manifest; a rank line "
                    "is: part checksum (FNV-1a 64 of its header, hex), part bytes\n"
                    "stage = %s\n", m->stage);
    if (m->grid[0]) len += snprintf(text + len, cap - len, "grid = %s\n", m->grid);
    CkptManifest copy = *m;
    copy.ranks = ranks;
    for (int i = 0; i < NFIELDS; i++)
        len += snprintf(text + len, cap - len, "%s = %s\n", FIELDS[i].key,
                        field_format(&copy, i, (char[32]){0}));
    for (int i = 0; i < NTEXTS; i++) {
        char one_line[256];  // a line of the manifest holds no line break
        snprintf(one_line, sizeof one_line, "%s", text_of(m, i));
        for (char *c = one_line; *c; c++)
            if (*c == '\n' || *c == '\r') *c = '?';
        len += snprintf(text + len, cap - len, "%s = %s\n", TEXTS[i].key, one_line);
    }
    for (int r = 0; r < ranks; r++)
        len += snprintf(text + len, cap - len, "rank-%05d.bin = %016" PRIx64 " %" PRIu64 "\n", r,
                        parts[r].checksum, parts[r].bytes);
    *len_out = len;
    return text;
}

static int missing(const char *dir, const char *key, char *msg) {
    return ckpt_msgf(msg, "checkpoint %s: manifest.txt has no '%s' line: it is damaged or not a "
                "zero-workbench checkpoint; use an earlier step folder or start fresh", dir, key);
}

// "checkpoint DIR: manifest.txt's WHAT: it is damaged; ..." into msg; returns 1.
__attribute__((format(printf, 3, 4))) static int damaged(const char *dir, char *msg, const char *what, ...) {
    char text[MSG_BYTES];
    va_list ap;
    va_start(ap, what);
    vsnprintf(text, sizeof text, what, ap);
    va_end(ap);
    return ckpt_msgf(msg, "checkpoint %s: manifest.txt's %s: it is damaged; use an earlier step folder or start "
                     "fresh", dir, text);
}

static int in_range(const CkptManifest *m, int i) {
    const Field *f = &FIELDS[i];
    double x = f->is_double ? *(const double *)((const char *)m + f->off)
               : f->size == sizeof(int) ? (double)(int64_t)field_get(m, i) : (double)field_get(m, i);
    return (f->open & OPEN_LO ? x > f->lo : x >= f->lo) && (f->open & OPEN_HI ? x < f->hi : x <= f->hi);
}

static int one_of(const char *value, const char *names) {
    size_t n = strlen(value);
    for (const char *p = names; p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL)
        if (n > 0 && strncmp(p, value, n) == 0 && (p[n] == 0 || p[n] == '|')) return 1;
    return 0;
}

// The grid line of a stage that splits the model: T x P x D = its ranks,
// T dividing the heads and P at most the layers (what 3d_parallel takes).
static int check_grid(const char *dir, const CkptManifest *m, char *msg) {
    int T, P, D;
    if (grid_parse(m->grid, &T, &P, &D) || (long long)T * P * D != m->ranks)  // what its parts hold
        return ckpt_msgf(msg, "checkpoint %s: manifest.txt's grid line (%s) is damaged or does not match its %d "
                         "ranks; use an earlier step folder or start fresh", dir, m->grid, m->ranks);
    if (m->cfg.num_heads % T != 0 || P > m->cfg.num_layers)
        return damaged(dir, msg, "grid line (%s) does not fit its model of %d heads and %d layers", m->grid,
                       m->cfg.num_heads, m->cfg.num_layers);
    return 0;
}

// Every field within its flag's range, every name one its flag takes, and
// what the ranges alone do not say: the fields against each other.
static int check_values(const char *dir, const CkptManifest *m, int part_lines, char *msg) {
    for (int i = 0; i < NFIELDS; i++) {
        if (in_range(m, i)) continue;
        const Field *f = &FIELDS[i];
        char value[32], flag[48] = "";
        if (f->flag) snprintf(flag, sizeof flag, ", the range of --%s", f->flag);
        if (f->is_double) snprintf(value, sizeof value, "%.10g", *(const double *)((const char *)m + f->off));
        else field_format(m, i, value);
        return damaged(dir, msg, "%s = %s is outside %c%.10g, %.10g%c%s", f->key, value,
                       f->open & OPEN_LO ? '(' : '[', f->lo, f->hi, f->open & OPEN_HI ? ')' : ']', flag);
    }
    for (int i = 0; i < NTEXTS; i++)
        if (TEXTS[i].names && !one_of(text_of(m, i), TEXTS[i].names))
            return damaged(dir, msg, "%s = %s is none of %s (what --%s takes)", TEXTS[i].key, text_of(m, i),
                           TEXTS[i].names, TEXTS[i].flag);
    if (part_lines != m->ranks)
        return damaged(dir, msg, "ranks = %d, but it lists %d parts", m->ranks, part_lines);
    if (m->seq_len > m->cfg.max_seq_len)
        return damaged(dir, msg, "seq_len = %d is longer than its model's context (max_seq_len = %d)", m->seq_len,
                       m->cfg.max_seq_len);
    if (m->cfg.channels % m->cfg.num_heads != 0)
        return damaged(dir, msg, "num_heads = %d does not divide channels = %d", m->cfg.num_heads, m->cfg.channels);
    // the schedule's step is step - skipped_steps: more skipped than run would be a step before the first
    if (m->skipped_steps > m->step)
        return damaged(dir, msg, "skipped_steps = %ld is more than the %ld steps it ran", m->skipped_steps, m->step);
    if (m->scale_last_overflow >= m->step && m->scale_last_overflow != -1)
        return damaged(dir, msg, "scale_last_overflow = %d is not one of the %ld steps it ran (0-based, -1: none)",
                       m->scale_last_overflow, m->step);
    return m->grid[0] ? check_grid(dir, m, msg) : 0;
}

// A manifest saved before wte was padded (no vocab_padded line): its wte had
// V rows, and a grid's tp parts V rounded up to 64·tp. Its parts are in this
// build's layout only where those are the rows this build stores.
static int unpadded_vocab(CkptManifest *m, const char *dir, char *msg) {
    int V = m->cfg.vocab_size, T = 1, P, D;
    if (m->grid[0] && grid_parse(m->grid, &T, &P, &D)) T = 1;  // a damaged grid: manifest_check says so
    int then = (V + 64 * T - 1) / (64 * T) * (64 * T);
    if (gpt_vocab_padded(V, 1) == V && (T == 1 || gpt_vocab_padded(V, T) == then)) {
        m->vocab_padded = V;
        return 0;
    }
    return ckpt_msgf(msg, "checkpoint %s was saved before the vocabulary was stored padded (wte of %d rows; this "
                     "build stores %d): its parts are not this build's layout; export its weights with the build "
                     "that saved it (ckpt_tool export-llmc) and start from them with --init-from, or start fresh",
                     dir, T == 1 ? V : then, T == 1 ? gpt_vocab_padded(V, 1) : gpt_vocab_padded(V, T));
}

// Fills *m and this rank's part line from the manifest text (which it edits).
int manifest_parse(char *text, const char *dir, int rank, CkptManifest *m,
                          PartInfo *mine, char *msg) {
    memset(m, 0, sizeof *m);
    char my_key[32], *save = NULL;
    snprintf(my_key, sizeof my_key, "rank-%05d.bin", rank);
    unsigned seen = 0, seen_text = 0;
    int have_stage = 0, have_part = 0, part_lines = 0;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strstr(line, " = ");
        if (line[0] == '#' || !eq) continue;
        *eq = 0;
        const char *val = eq + 3;
        if (strcmp(line, "stage") == 0) {
            have_stage = snprintf(m->stage, sizeof m->stage, "%s", val) > 0;
        } else if (strcmp(line, "grid") == 0) {
            snprintf(m->grid, sizeof m->grid, "%s", val);
        } else if (strcmp(line, my_key) == 0) {
            have_part = sscanf(val, "%" SCNx64 " %" SCNu64, &mine->checksum, &mine->bytes) == 2;
        }
        int q, end = 0;
        part_lines += sscanf(line, "rank-%5d.bin%n", &q, &end) == 1 && end > 0 && line[end] == 0;
        for (int i = 0; i < NFIELDS; i++) {
            if (strcmp(line, FIELDS[i].key) == 0 && field_set(m, i, val) == 0) seen |= 1u << i;
        }
        for (int i = 0; i < NTEXTS; i++) {
            if (strcmp(line, TEXTS[i].key) != 0) continue;
            snprintf((char *)m + TEXTS[i].off, TEXTS[i].size, "%s", val);
            seen_text |= 1u << i;
        }
    }
    if (!have_stage) return missing(dir, "stage", msg);
    for (int i = 0; i < NFIELDS; i++) {
        if (seen & (1u << i)) continue;
        if (FIELDS[i].off != offsetof(CkptManifest, vocab_padded)) return missing(dir, FIELDS[i].key, msg);
        if (unpadded_vocab(m, dir, msg)) return 1;
    }
    for (int i = 0; i < NTEXTS; i++) {
        if (seen_text & (1u << i)) continue;
        if (!TEXTS[i].absent) return missing(dir, TEXTS[i].key, msg);
        snprintf((char *)m + TEXTS[i].off, TEXTS[i].size, "%s", TEXTS[i].absent);
    }
    if (!have_part && rank >= 0) return missing(dir, my_key, msg);
    return check_values(dir, m, part_lines, msg);
}

// Every stage keeps the same states (master, m, v) of the same model, cut
// differently: the data-parallel stages over the flat layout, 3d_parallel
// in pieces of its grid (ckpt_reshard.c reads either into either).
static const char *const STAGES[] = {"dp_baseline", "zero1", "zero2", "zero3", "cpu_offload", "infinity",
                                     "3d_parallel"};

int ckpt_known_stage(const char *stage) {
    for (size_t i = 0; i < sizeof STAGES / sizeof STAGES[0]; i++)
        if (strcmp(stage, STAGES[i]) == 0) return 1;
    return 0;
}

int ckpt_manifest_consistent(const char *dir, const CkptManifest *m, char *msg) {
    if (!ckpt_known_stage(m->stage))
        return damaged(dir, msg, "stage %s is none of dp_baseline, zero1, zero2, zero3, cpu_offload, infinity, "
                       "3d_parallel", m->stage);
    int gridded = strcmp(m->stage, "3d_parallel") == 0;
    if (gridded != (m->grid[0] != 0))
        return ckpt_msgf(msg, "checkpoint %s: manifest.txt has %s grid line for stage %s, which %s: it is damaged; "
                         "use an earlier step folder or start fresh", dir, m->grid[0] ? "a" : "no", m->stage,
                         gridded ? "saves one" : "has no grid");
    GPTLayout whole;
    gpt_layout(&whole, &m->cfg);
    if (!gridded && whole.num_params != m->num_params)  // a grid's num_params is its tp part's
        return damaged(dir, msg, "num_params = %zu, but its model (L=%d C=%d H=%d V=%d T=%d) has %zu parameters",
                       m->num_params, m->cfg.num_layers, m->cfg.channels, m->cfg.num_heads, m->cfg.vocab_size,
                       m->cfg.max_seq_len, whole.num_params);
    // every stage saves wte with the rows of gpt_vocab_padded(V, 1); a grid's tp parts are cut from those
    if (m->vocab_padded != gpt_vocab_padded(m->cfg.vocab_size, 1))
        return damaged(dir, msg, "vocab_padded = %d is not its vocab_size %d padded as a save stores it (%d)",
                       m->vocab_padded, m->cfg.vocab_size, gpt_vocab_padded(m->cfg.vocab_size, 1));
    // the data position is step x the global batch's rows (no step skips its batch), and the
    // row counter is the whole RNG state: a resume would go on from another row than it says
    uint64_t rows = (uint64_t)m->step * (uint64_t)ckpt_global_rows(m);
    if (m->data_rows != rows)
        return damaged(dir, msg, "data_rows = %llu is not its %ld steps of %ld rows (%llu)",
                       (unsigned long long)m->data_rows, m->step, ckpt_global_rows(m), (unsigned long long)rows);
    if (m->rng_state != m->data_rows)
        return damaged(dir, msg, "rng_state = %llu is not its data_rows (%llu), the row counter it is",
                       (unsigned long long)m->rng_state, (unsigned long long)m->data_rows);
    return 0;
}

int ckpt_reshardable(const CkptManifest *got, const CkptManifest *expect, int ranks) {
    return expect && ckpt_known_stage(got->stage) && ckpt_known_stage(expect->stage) &&
           (strcmp(got->stage, expect->stage) != 0 || got->ranks != ranks || strcmp(got->grid, expect->grid) != 0);
}

// The data-parallel replicas of a run: its ranks, or a grid's D (the
// replicas that read rows of their own: not Ulysses' cp ranks of one).
static int replicas(const CkptManifest *m, int ranks) {
    int T, P, D;
    return m->grid[0] && !grid_parse(m->grid, &T, &P, &D) ? D / grid_seq_parts(m->grid) : ranks;
}

// Rows of the data a step trains on: the data position and the math stay
// those of the saved run when this is the same, at any rank count or grid.
static long global_rows(const CkptManifest *m, int ranks) {
    return (long)m->batch * replicas(m, ranks) * m->grad_accum;
}

long ckpt_global_rows(const CkptManifest *m) { return global_rows(m, m->ranks); }

// expect == NULL checks the rank count only.
int manifest_check(const char *dir, const CkptManifest *got, const CkptManifest *expect,
                          int ranks, char *msg) {
    int reshard = ckpt_reshardable(got, expect, ranks);  // manifest_parse checked the grid line against the ranks
    if (reshard && (got->seq_len != expect->seq_len || global_rows(got, got->ranks) != global_rows(expect, ranks)))
        return ckpt_msgf(msg, "checkpoint %s was saved with a global batch of %ld rows of %d tokens (batch %d x %d "
                         "%s x grad_accum %d); this run's is %ld of %d: resume at another stage, rank count or grid "
                         "with the same global batch (--batch x data-parallel replicas x --grad-accum)", dir,
                         global_rows(got, got->ranks), got->seq_len, got->batch, replicas(got, got->ranks),
                         got->grid[0] ? "replicas" : "ranks", got->grad_accum, global_rows(expect, ranks),
                         expect->seq_len);
    if (!reshard && expect && strcmp(got->stage, expect->stage) != 0)
        return ckpt_msgf(msg, "checkpoint %s was written by %s; this is %s: resume with the same stage (the "
                    "stages 01-07 resume each other's)", dir, got->stage, expect->stage);
    if (!reshard && expect && strcmp(got->grid, expect->grid) != 0)  // before the rank count: the grid says more
        return ckpt_msgf(msg, "checkpoint %s was saved on the grid %s (%d ranks); this run's is %s: each rank's "
                    "part holds another piece of the model; resume on the same grid", dir,
                    got->grid[0] ? got->grid : "of data parallelism alone", got->ranks,
                    expect->grid[0] ? expect->grid : "of data parallelism alone");
    if (!reshard && got->ranks != ranks)
        return ckpt_msgf(msg, "checkpoint %s has %d ranks' shards; this run has %d: resume with "
                    "mpirun -np %d", dir, got->ranks, ranks, got->ranks);
    for (int i = 0; expect && i < NFIELDS; i++) {
        int noted = FIELDS[i].group == GROUP_RUN || FIELDS[i].group == GROUP_MATH ||
                    (reshard && FIELDS[i].group == GROUP_BATCH) ||  // the global batch, checked above
                    // a grid's num_params is its tp part's; the shape fields say whether the model is the same
                    (reshard && (got->grid[0] || expect->grid[0]) &&
                     FIELDS[i].off == offsetof(CkptManifest, num_params));
        if (noted || field_get(got, i) == field_get(expect, i)) continue;
        char a[32], b[32];
        field_format(got, i, a);
        field_format(expect, i, b);
        if (FIELDS[i].group == GROUP_DATA)
            return ckpt_msgf(msg, "checkpoint %s was trained on other data (%s: %" PRIu64 " tokens, checksum %016" PRIx64
                        "); this run's %s has %" PRIu64 " tokens, checksum %016" PRIx64 ": resume on the same "
                        "data", dir, got->data, got->data_tokens, got->data_checksum, expect->data,
                        expect->data_tokens, expect->data_checksum);
        if (FIELDS[i].group == GROUP_MODEL && FIELDS[i].flag)
            return ckpt_msgf(msg, "checkpoint %s model differs: %s is %s there and %s in this run; "
                        "resume with the same model (--%s %s)", dir, FIELDS[i].key, a, b, FIELDS[i].flag, a);
        if (FIELDS[i].group == GROUP_MODEL)
            return ckpt_msgf(msg, "checkpoint %s model differs: %s is %s there and %s in this run; "
                        "resume with the same model", dir, FIELDS[i].key, a, b);
        return ckpt_msgf(msg, "checkpoint %s was saved with %s %s; this run has %s: resume with the "
                    "same batch, seq_len and grad_accum", dir, FIELDS[i].key, a, b);
    }
    return 0;
}


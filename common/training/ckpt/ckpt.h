// ckpt.h: sharded checkpoints. Each rank writes its own part; a manifest
// records stage, ranks, step, data position and RNG state. Layout:
//   DIR/step-00000010/rank-00000.bin ... manifest.txt
//   DIR/latest           (text: the name of the newest complete step folder)
// A save writes its parts and manifest into DIR/step-00000010.partial (each
// file to a temp name, fsynced and renamed), renames that folder to its step
// folder once all are in, and then moves `latest` (ckpt_save.c). So a step
// folder on disk is always complete, a save never writes into one, and a
// failed or interrupted save leaves every earlier checkpoint as it was. Each
// part carries a header and a checksum (FNV-1a 64) that the manifest repeats.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "gpt.h"

typedef struct CkptManifest {
    char stage[32];      // "dp_baseline", "zero1", ...
    // the process grid of a stage that splits the model ("tp 2 x pp 2 x dp 2"):
    // each rank's part holds another piece of it; "" (no line): data parallel
    char grid[48];
    int ranks;
    long step;           // optimizer steps completed
    uint64_t data_rows;  // training rows consumed (the data position)
    uint64_t seed;       // init and data RNG seed
    uint64_t rng_state;  // state of the trainer's RNG after `step` steps
    GPTConfig cfg;
    // wte's rows in the whole model (gpt_vocab_padded(V, 1)): the flat layout
    // the parts' elements are counted in. A manifest without the line was
    // saved before wte was padded, with V rows: read where V rows are this
    // build's layout (V a multiple of 128), refused where not.
    int vocab_padded;
    size_t num_params;   // Ψ, wte's padding rows included
    int batch, seq_len, grad_accum;
    // the LR schedule of the run that saved: a resumed run keeps its horizon
    // (total_steps: --schedule-steps, else --steps) unless --schedule-steps
    // is given, and says when --warmup or --lr change the schedule
    int total_steps, warmup;
    double lr;           // peak learning rate, written with 17 digits: read back exactly
    // The data it trained on: its tokens (both splits) and a checksum of
    // their first blocks; a resume on other data is refused. The path is
    // recorded for the message (the same tokens elsewhere are the same data).
    uint64_t data_tokens, data_checksum;
    char data[256];      // --data, or "built-in"
    char data_order[16];
    // Every other setting that shapes the update (recorded, not enforced:
    // continuing with another is fine-tuning, and the trainer says so).
    double grad_clip, weight_decay, beta1, beta2, adam_eps, min_lr_frac, warmup_start_frac;
    int schedule_steps;
    char lr_schedule[32], warmup_type[16];
    // --precision, and fp16's loss scaler as the step left it (loss_scale.h),
    // so that a resumed run scales, skips and raises as the saved one would have
    char precision[8];
    // ZeRO++'s quantization, which changes the math of a step: "on" or "off"
    // (qwZ); "8-bit", "4-bit" or "off" (qgZ); the block's elements, or
    // "none" when both are off. Absent from a manifest saved before: off.
    char quantize_weights[8], quantize_grads[8], quant_block[16];
    double loss_scale;
    int scale_last_overflow, scale_hysteresis_left;
    long skipped_steps;
} CkptManifest;

// Elements [at, at + count) of a tensor's host buffer are the whole
// model's [whole, whole + count) (stages 01-06's flat layout, tp 1).
typedef struct CkptRun {
    size_t at, whole, count;
} CkptRun;

typedef struct CkptTensor {
    const char *name;  // "master", "adam_m", ...
    void *host;        // host memory to write from / read into
    size_t bytes;
    // where host[0] sits in the flat parameter layout (elements) and the
    // bytes of an element: what a resharded load reads (ckpt_reshard.c)
    size_t flat_begin;
    size_t elem_bytes;
    // Under 3d_parallel the host elements are pieces of the whole model
    // (trainer_whole_index): their runs, sorted by `whole`, for a resharded
    // load; NULL: [flat_begin, flat_begin + bytes / elem_bytes) is the
    // whole model's, as on stages 01-06 (past Ψ: padding).
    const CkptRun *runs;
    size_t nruns;
} CkptTensor;

// What a load did: a resharded one (another stage, rank count or grid)
// and the bytes of tensor data this rank read from how many parts.
typedef struct CkptLoadInfo {
    int resharded;
    uint64_t bytes_read;
    int parts_read, parts_verified;
} CkptLoadInfo;

// Collective over `world`. Returns 0, or nonzero with the same one-line
// message on every rank (e.g. the folder cannot be written, or DIR already
// holds a step folder of m->step, which is never replaced); on failure no
// file of an earlier checkpoint, nor `latest`, has changed. Rank 0 notes the
// committed checkpoint for a signal's line (stop_note_checkpoint) as it
// moves `latest`, with SIGTERM and SIGINT held between the two.
int ckpt_save(Comm *world, const char *dir, const CkptManifest *m, const CkptTensor *t, int n,
              char *err, size_t err_len);
// Collective. Reads DIR/latest (or DIR itself if it is a step folder). Checks
// the manifest against `expect` (stage, ranks, model shape, batch layout) and
// every part's size and checksum. Returns 0 and fills t[] and *got, or
// nonzero with the same one-line message on every rank naming what differs
// or is corrupt and what to do (the trainer exits 2 with it). A checkpoint
// of another stage, rank count or 3d_parallel grid (the same global batch)
// is resharded into t[]'s ranges (flat_begin, elem_bytes, runs); *info
// (may be NULL) says what was read.
int ckpt_load(Comm *world, const char *dir, const CkptManifest *expect, CkptManifest *got,
              CkptTensor *t, int n, CkptLoadInfo *info, char *err, size_t err_len);
// ckpt_reshard.c: ckpt_load's resharded read, from the manifest's text (internal)
int ckpt_reshard_read(Comm *world, const char *step_dir, const char *manifest, const CkptManifest *m,
                      CkptTensor *t, int n, CkptLoadInfo *info, char *msg);
// The runs of whole-model indices of elements [begin, begin + n) of a
// layout whose element s is whole(ctx, s) (GPT_PADDING: none), with `at`
// counted from begin, sorted by `whole` (malloc'd; *nruns of them).
CkptRun *ckpt_runs_of(size_t (*whole)(const void *ctx, size_t s), const void *ctx, size_t begin, size_t n,
                      size_t *nruns);
// The checkpoint folder that DIR (a --resume or ckpt_tool argument) reads,
// resolved (realpath): DIR, or its parent when DIR is a step folder of a
// folder holding `latest` (a --save folder). No output may lie inside it.
// DIR as given where it cannot be resolved.
void ckpt_root(const char *dir, char *out, size_t n);
// One rank, before a run's first save: creates DIR (and its parents) and
// locks it for as long as *lock_fd stays open (flock on DIR/lock, which
// names the holder), so that two runs cannot mix their parts in one folder.
// Returns 0, or nonzero with one line in err (DIR holds what no save wrote:
// ckpt_folder_only_saves; the folder cannot be created; another run holds
// it; its lock file is not one a run left).
int ckpt_lock(const char *dir, int *lock_fd, char *err, size_t err_len);
// What a checkpoint's manifest says of itself beyond each field's range
// (manifest_parse): a stage this build knows, a grid line exactly where the
// stage keeps one, num_params and vocab_padded those of its model, and
// data_rows (and rng_state) its steps' rows. ckpt_tool verify and a resume
// both refuse a manifest that fails it: 0, or 1 with one line in msg
// (512 bytes, MSG_BYTES).
int ckpt_manifest_consistent(const char *dir, const CkptManifest *m, char *msg);
// Rank 0, before DIR is created and locked for --save (ckpt_folder.c): 0
// when DIR is absent or holds only what saves write there (step folders,
// `latest` as a save writes it, `lock`, a killed save's step-N.partial
// folder and latest.tmp); else 1 with one line in err naming the first
// entry that is someone else's.
int ckpt_folder_only_saves(const char *dir, char *err, size_t err_len);
// Rank 0, once this run's manifest is known (after a resume): 0 when every
// step folder in DIR is a checkpoint of the same run as `mine` (the same
// model, seed, data, global batch and settings of the update; the stage,
// ranks and grid may differ), else 1 with one line in err.
int ckpt_folder_same_run(const char *dir, const CkptManifest *mine, char *err, size_t err_len);
// The settings that shape the update and differ between a checkpoint's run
// and this one, as "--grad-clip 1 -> 0.5, --lr-schedule cosine -> WarmupLR",
// or "" when none does. Returns how many differ.
int ckpt_math_changes(const CkptManifest *got, const CkptManifest *expect, char *out, size_t n);
uint64_t fnv1a64(const void *data, size_t bytes, uint64_t h);  // start with h = 14695981039346656037 (0xcbf29ce484222325)

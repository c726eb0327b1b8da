// ckpt_manifest.h: what ckpt.c shares with ckpt_manifest.c, the manifest
// (manifest.txt of a step folder: `key = value` lines, one per field of
// CkptManifest, then each rank's part checksum and size). Internal to the
// checkpoint code; the trainers use ckpt.h.
#pragma once
#include <stdint.h>
#include "ckpt.h"

#define MSG_BYTES 512
#define CKPT_PATH_BYTES 4096

// Shared by ckpt.c (loading) and ckpt_save.c (writing). Paths under a
// checkpoint folder: they fit, as DIR is at most CKPT_PATH_BYTES - 128 long
// (ckpt_dir_too_long, 1 with msg where not).
__attribute__((format(printf, 2, 3))) void ckpt_pathf(char *out, const char *fmt, ...);
int ckpt_dir_too_long(const char *dir, char *msg);
// All ranks: 0 when no rank failed, else 1 with the lowest failing rank's msg in err.
int ckpt_agree(Comm *world, int failed, char *msg, char *err, size_t err_len);

typedef struct PartInfo {
    uint64_t checksum, bytes;  // as the manifest lists them; sent as 2 MPI_UINT64_T
} PartInfo;

// msg (MSG_BYTES) = the formatted text; returns 1, so `return ckpt_msgf(...)` fails.
__attribute__((format(printf, 2, 3))) int ckpt_msgf(char *msg, const char *fmt, ...);
// The manifest's text for `ranks` parts (malloc'd; *len bytes).
char *manifest_text(const CkptManifest *m, int ranks, const PartInfo *parts, size_t *len);
// Fills *m and this rank's part line from the manifest text (which it edits;
// rank < 0: no part line); 1 with msg when a line is missing or malformed, a
// value is outside the range of the flag that sets it, or the values do not
// fit each other (a part line per rank, skipped steps within the steps, the
// grid within the ranks and the model).
int manifest_parse(char *text, const char *dir, int rank, CkptManifest *m, PartInfo *mine, char *msg);
// The checkpoint fits this run: stage, grid, ranks, model, batch and data
// (expect == NULL checks the rank count only); 1 with msg where not. One of
// another stage, rank count or grid fits when its global batch
// (batch x data-parallel replicas x grad_accum rows of seq_len) is this run's.
int manifest_check(const char *dir, const CkptManifest *got, const CkptManifest *expect, int ranks, char *msg);
// The rows of seq_len tokens a step of m's run trains on: batch x
// data-parallel replicas (its ranks, or its grid's D) x grad_accum.
long ckpt_global_rows(const CkptManifest *m);
// Whether `stage` is one of the stages 01-07, whose checkpoints any of them reads.
int ckpt_known_stage(const char *stage);
// A checkpoint of any stage (01-07) saved at another stage, rank count or
// grid than this run's: resharded when loaded (ckpt_reshard.c).
int ckpt_reshardable(const CkptManifest *got, const CkptManifest *expect, int ranks);

// A part file: PartHeader, one PartEntry per tensor (name, bytes, FNV-1a 64
// of its data), then the tensors' bytes in order (ckpt.c).
#define CKPT_NAME_BYTES 32
#define CKPT_PART_MAGIC "WBCKPT01"
#define CKPT_PART_VERSION 1
typedef struct PartHeader {
    char magic[8];  // "WBCKPT01"
    uint32_t version;
    int32_t rank, ranks;
    uint32_t ntensors;
    int64_t step;
} PartHeader;
typedef struct PartEntry {
    char name[CKPT_NAME_BYTES];
    uint64_t bytes, checksum;
} PartEntry;
// Reads a part's header and entries (into malloc'd *head) and checks them
// against the manifest's line for the part; 1 with msg where not.
int ckpt_read_part_header(int fd, const char *part, const PartInfo *want, PartHeader **head, char *msg);
// "checkpoint PART is corrupt (why): ..." into msg; returns 1.
int ckpt_corrupt(const char *part, const char *why, char *msg);
// Part q's line of the manifest text; 1 when it has none.
int manifest_part(const char *text, int q, PartInfo *out);
// DIR/latest's step folder (or DIR itself when it is one) into step_dir
// (4096 bytes) and its manifest's text (malloc'd, *len bytes); 1 with msg.
int ckpt_find_manifest(const char *dir, char *step_dir, char **text, long *len, char *msg);
// Without MPI (ckpt_tool): a step folder's parts, each part's whole-model
// elements mapped once (a 3d_parallel grid's: gpt_grid.h); flat elements
// [begin, begin + n) of tensor `name` (elem_bytes each) read into out from
// the parts that hold them, zero past Ψ; 1 with msg where a part fails.
typedef struct CkptSource CkptSource;
CkptSource *ckpt_source_open(const char *step_dir, const char *manifest, const CkptManifest *m);
int ckpt_source_read(const CkptSource *s, const char *name, size_t elem_bytes, size_t begin, size_t n, void *out,
                     char *msg);
void ckpt_source_close(CkptSource *s);
// Without MPI: every part's tensors against their checksums, read whole.
int ckpt_verify_parts(const char *step_dir, const char *manifest, const CkptManifest *m, char *msg);

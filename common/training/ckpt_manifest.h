// ckpt_manifest.h: what ckpt.c shares with ckpt_manifest.c, the manifest
// (manifest.txt of a step folder: `key = value` lines, one per field of
// CkptManifest, then each rank's part checksum and size). Internal to the
// checkpoint code; the trainers use ckpt.h.
#pragma once
#include <stdint.h>
#include "ckpt.h"

#define MSG_BYTES 512

typedef struct PartInfo {
    uint64_t checksum, bytes;  // as the manifest lists them; sent as 2 MPI_UINT64_T
} PartInfo;

// msg (MSG_BYTES) = the formatted text; returns 1, so `return ckpt_msgf(...)` fails.
__attribute__((format(printf, 2, 3))) int ckpt_msgf(char *msg, const char *fmt, ...);
// The manifest's text for `ranks` parts (malloc'd; *len bytes).
char *manifest_text(const CkptManifest *m, int ranks, const PartInfo *parts, size_t *len);
// Fills *m and this rank's part line from the manifest text (which it edits);
// 1 with msg when a line is missing or malformed.
int manifest_parse(char *text, const char *dir, int rank, CkptManifest *m, PartInfo *mine, char *msg);
// The checkpoint fits this run: stage, grid, ranks, model, batch and data
// (expect == NULL checks the rank count only); 1 with msg where not.
int manifest_check(const char *dir, const CkptManifest *got, const CkptManifest *expect, int ranks, char *msg);

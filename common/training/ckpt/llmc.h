// llmc.h: llm.c's GPT-2 checkpoint format, read into and written from our
// flat parameter layout. A file is a header of 256 little-endian int32
// (magic 20240326, version, maxT, V, L, NH, C, Vp, then zeros) and the
// parameters, fp32 (version 3) or bf16 (version 5), one tensor kind at a
// time for all layers together:
//   wte (Vp,C)  wpe (maxT,C)  ln1w (L,C)  ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)
//   attprojw (L,C,C)  attprojb (L,C)  ln2w (L,C)  ln2b (L,C)  fcw (L,4C,C)
//   fcb (L,4C)  fcprojw (L,C,4C)  fcprojb (L,C)  lnfw (C)  lnfb (C)
// wte has Vp >= V rows (llm.c pads the vocabulary to a multiple of 128 so its
// GEMMs stay aligned); rows V..Vp-1 are not tokens. Our whole model stores
// the same Vp rows (gpt_vocab_padded), zero past V: we write ours (zeros) and
// read only the first V, whatever a file's Vp. Our layout holds the same
// tensors per unit (gpt.h): embeddings, then each block's twelve, then the
// final layernorm; matrices are (out,in) row-major in both, so a tensor maps
// element for element.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "gpt.h"

#define LLMC_MAGIC 20240326
#define LLMC_VERSION_FP32 3
#define LLMC_VERSION_BF16 5
#define LLMC_HEADER_INTS 256

typedef struct LlmcHeader {
    int version;          // 3 or 5
    GPTConfig cfg;        // maxT, V, L, NH, C as our model shape
    int padded_vocab;     // Vp
    size_t file_params;   // elements stored: wte's Vp·C, then wpe and the rest as ours
    size_t elem_bytes;    // 4 (fp32) or 2 (bf16)
} LlmcHeader;

// Vp as llm.c chooses it: V rounded up to a multiple of 128.
int llmc_padded_vocab(int vocab);
// Reads and checks the header and the file's size. Returns 0, or nonzero
// with one line in err naming the file and what is wrong (not llm.c's
// magic, an unknown version, a shape this trainer cannot build, fewer or
// more bytes than the header's shape needs).
int llmc_read_header(const char *path, LlmcHeader *h, char *err, size_t err_len);
// Flat elements [begin, end) of our layout `l` (gpt_layout of h->cfg) as fp32;
// wte's padding rows and elements at or past Ψ (a shard's padding) are 0.
// Returns 0 or nonzero with err.
int llmc_read_range(const char *path, const LlmcHeader *h, const GPTLayout *l, size_t begin, size_t end,
                    float *out, char *err, size_t err_len);
// Writes all Ψ parameters of layout `l` (the whole model's: wte of llm.c's
// Vp rows, whose padding rows are zero) as an llm.c version-3 checkpoint,
// through a temporary file that is renamed into place once complete.
// Returns 0 or nonzero with err.
int llmc_write(const char *path, const GPTLayout *l, const float *params, char *err, size_t err_len);
// The same, the parameters read from `read` a chunk at a time (flat elements
// [begin, begin + n) into out; nonzero stops the write): memory stays bounded
// whatever the model's size (ckpt_tool reads them from a checkpoint's parts).
// A failure names `what` (the flag or command that asked for it) and path.
typedef int (*LlmcSource)(void *ctx, size_t begin, size_t n, float *out);
int llmc_write_from(const char *path, const char *what, const GPTLayout *l, LlmcSource read, void *ctx, char *err,
                    size_t err_len);

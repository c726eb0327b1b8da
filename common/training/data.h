// data.h: training data. Byte-level text (vocab 256) from a file or a folder
// of files, or llm.c-format uint16 token shards (header of 256 int32:
// magic 20240520, version 1, token count; then the tokens). Without --data a
// built-in corpus is made from text every Debian/Ubuntu system ships (the
// license texts), or, where none is found, a generated sequence task.
//
// Rows: the tokens of a split are cut into W windows of T+1 tokens that
// start at multiples of T; row i reads window (a * i) mod W for a fixed a
// coprime to W (data_row_start), so consecutive rows come from far apart and
// every window is read once per pass. Global micro-batch j of the run holds
// rows [j*G, (j+1)*G) with G = batch * ranks; rank r reads its B of them. So
// any rank count sees the same data in the same order, and a run is
// resumable from the row counter alone.
//
// --data-order sequential reads llm.c's order instead: row i is window i, so
// global micro-batch j is the j-th run of G*T+1 tokens (rank r taking its B
// rows of it), and a pass ends, as llm.c's loader does, after the last whole
// global micro-batch (the tokens after it are skipped).
#pragma once
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define DATA_DESC_BYTES (PATH_MAX + 256)  // the words and a path, whole

enum { SPLIT_TRAIN = 0, SPLIT_VAL = 1 };

typedef struct DataSet {
    uint16_t *tokens[2];  // train, val
    size_t count[2];
    int vocab;            // tokens are < vocab
    char desc[DATA_DESC_BYTES];  // one line: what was loaded ("built-in corpus: 17 license texts, 254 KB")
    uint64_t sequential_rows[2];  // --data-order sequential: rows per pass of each split; 0 = permuted
} DataSet;

// path NULL or "" = built-in corpus. Returns 0, or on bad input (missing
// file, empty file, too few tokens for one row of T+1, token id >=
// model_vocab, bad shard header) nonzero with one line in err naming the file
// and what to do (the trainer exits 2 with it). The validation split: files
// whose name contains "val" in a shard folder, else the last 10% of the tokens.
int data_open(DataSet *ds, const char *path, int model_vocab, int T, char *err, size_t err_len);
void data_free(DataSet *ds);
// Rows in llm.c's order (see above) for micro-batches of rows_per_batch = G
// rows of T+1 tokens. Returns 0, or nonzero with one line in err when a split
// holds less than one global micro-batch.
int data_set_sequential(DataSet *ds, int T, int rows_per_batch, char *err, size_t err_len);
// Distinct rows of a split: after that many, row i reads what row i - count read.
uint64_t data_rows_per_pass(const DataSet *ds, int split, int T);
// Where row `row` of a split starts (token index).
uint64_t data_row_start(const DataSet *ds, int split, uint64_t row, int T);
// rows [row_begin, row_begin + rows) of a split; inputs/targets are rows*T int32
void data_rows(const DataSet *ds, int split, uint64_t row_begin, int rows, int T,
               int32_t *inputs, int32_t *targets);

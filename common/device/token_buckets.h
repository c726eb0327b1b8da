// token_buckets.h: a micro-batch's positions grouped by token, the index the
// embedding's backward sums wte's rows by. With it each row's gradient is
// one thread's sum over that token's positions in increasing order, instead
// of a scatter by atomics whose order changes from run to run on a GPU
// (llm.c builds the same buckets on the host). The model builds it on the
// host when it copies the token ids to the device (gpt_slot_tokens).
#pragma once
#include <stdint.h>

typedef struct TokenBuckets {
    const int32_t *order;  // (BT) the positions sorted by (token, position)
    const int32_t *start;  // (BT) where bucket k begins in order; it ends where
                           // bucket k + 1 begins, the last one at BT
    int buckets;           // distinct tokens in the micro-batch: entries of start in use
} TokenBuckets;

// Fills order and start (n entries each) from n token ids; returns the
// number of buckets. Host memory; the ids in any order, repeats allowed.
int token_buckets_build(const int32_t *tokens, int n, int32_t *order, int32_t *start);

// The end of bucket k in order: where the next one begins, or n.
static inline int token_bucket_end(const int32_t *start, int buckets, int k, int n) {
    return k + 1 < buckets ? start[k + 1] : n;
}

// token_buckets.c: the token buckets of a micro-batch (token_buckets.h).
#include "token_buckets.h"
#include <stdlib.h>
#include "check.h"

// (token, position) in one key: sorting the keys sorts by token, then by position
static uint64_t bucket_key(int32_t token, int pos) { return (uint64_t)(uint32_t)token << 32 | (uint32_t)pos; }

static int by_key(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

int token_buckets_build(const int32_t *tokens, int n, int32_t *order, int32_t *start) {
    uint64_t *key = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *key);
    for (int i = 0; i < n; i++) key[i] = bucket_key(tokens[i], i);
    qsort(key, (size_t)n, sizeof *key, by_key);
    int buckets = 0;
    for (int i = 0; i < n; i++) {
        order[i] = (int32_t)(key[i] & 0xffffffffu);
        if (i == 0 || key[i] >> 32 != key[i - 1] >> 32) start[buckets++] = i;
    }
    free(key);
    return buckets;
}

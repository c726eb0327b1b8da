// fuzz_data.c: libFuzzer target for the data readers (data_open): the input
// is one file, read as an llm.c token shard when it has a shard's shape and
// as byte-level text otherwise, for a byte vocabulary and GPT-2's. A bad
// file must come back as a refusal (nonzero, one line in err), never as a
// crash, a sanitizer report or an exit; a file that opens gives rows that
// can be read.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(path, sizeof path, "/tmp/wb-fuzz-data-%d.bin", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();  // the fuzzer's own file
    static const int vocabs[] = {256, 50257};
    for (int i = 0; i < 2; i++) {
        DataSet ds;
        char err[512];
        const int T = 8;
        if (data_open(&ds, path, vocabs[i], T, err, sizeof err) == 0) {
            int32_t in[2 * T], tgt[2 * T];
            data_rows(&ds, SPLIT_TRAIN, 3, 2, T, in, tgt);
            data_rows(&ds, SPLIT_VAL, 1, 2, T, in, tgt);
            for (int k = 0; k < 2 * T; k++)
                if (in[k] < 0 || in[k] >= vocabs[i] || tgt[k] < 0 || tgt[k] >= vocabs[i]) abort();
            data_free(&ds);
        } else if (!err[0] || strchr(err, '\n')) {
            abort();  // a refusal is one line
        }
    }
    unlink(path);
    return 0;
}

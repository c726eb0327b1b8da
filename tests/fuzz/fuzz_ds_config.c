// fuzz_ds_config.c: libFuzzer target for the DeepSpeed-config reader: the
// input is a ds_config.json, read as zero2's --deepspeed-config by the
// trainers' own flag set-up (train_config_parse, then the model). A config
// it cannot use must be refused with one line; nothing may crash or report
// to a sanitizer. The refusal (fail_usage, which exits) is linked to
// __wrap_fail_usage here (ld --wrap), which returns to the fuzzer instead.
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "trainer.h"

static jmp_buf refused;
static char message[4096], path[64];

__attribute__((noreturn)) void __wrap_fail_usage(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    longjmp(refused, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    snprintf(path, sizeof path, "/tmp/wb-fuzz-ds-%d.json", (int)getpid());
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) abort();  // the fuzzer's own file
    static TrainConfig c;  // static: a refusal leaves through longjmp
    static const Strategy zero2 = {.name = "zero2", .summary = ""};
    char *argv[] = {"zero2", "--deepspeed-config", path, NULL};
    message[0] = 0;
    if (setjmp(refused) == 0) {
        GPTConfig mc;
        train_config_parse(&c, NULL, 3, argv, &zero2);
        train_config_model(&c, &mc);
    } else if (!message[0] || strchr(message, '\n')) {
        abort();  // a refusal is one line
    }
    unlink(path);
    return 0;
}

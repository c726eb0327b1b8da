// batch_rule.c: DeepSpeed's batch rule (see batch_rule.h).
#include "batch_rule.h"
#include <limits.h>
#include <stdio.h>
#include "check.h"

// "--batch 4", "train_micro_batch_size_per_gpu 4" (a key of the config), "--batch 4 (default)"
static const char *label(Settings *s, const char *flag, int value, char *buf, size_t n) {
    const Setting *x = settings_find(s, flag);
    if (x && x->from == FROM_CONFIG) snprintf(buf, n, "%s %d", x->why, value);
    else if (x && x->from == FROM_COMMAND_LINE) snprintf(buf, n, "--%s %d", flag, value);
    else snprintf(buf, n, "--%s %d (default)", flag, value);
    return buf;
}

void batch_rule_apply(Settings *s, int *batch, int *accum, int global, int ranks, const char *who) {
    if (global <= 0) return;
    // the config's path a path can hold (it was opened), never cut
    char g[512], b[512], k[512], from[PATH_MAX + 32] = "";
    if (s->config_path[0]) snprintf(from, sizeof from, "--deepspeed-config %s: ", s->config_path);
    label(s, "global-batch", global, g, sizeof g);
    label(s, "batch", *batch, b, sizeof b);
    label(s, "grad-accum", *accum, k, sizeof k);
    long long per_step = (long long)*batch * *accum * ranks;
    if (settings_given(s, "batch") && settings_given(s, "grad-accum")) {
        if (per_step != global)
            fail_usage("%s%s is not %s x %s x %d %s = %lld (DeepSpeed's rule: global batch = micro-batch x "
                       "accumulation x ranks); change one of them", from, g, b, k, ranks, who, per_step);
        return;
    }
    if (settings_given(s, "grad-accum")) {  // the micro-batch follows
        long long per_micro = (long long)*accum * ranks;
        if (global % per_micro != 0)
            fail_usage("%s%s does not divide by %s x %d %s = %lld; pick a multiple of %lld", from, g, k, ranks,
                       who, per_micro, per_micro);
        *batch = (int)(global / per_micro);
        settings_mark(s, "batch", FROM_DERIVED, "global batch %d / (accumulation %d x %d %s)", global, *accum,
                      ranks, who);
        return;
    }
    long long per_micro = (long long)*batch * ranks;
    if (global % per_micro != 0)
        fail_usage("%s%s does not divide by %s x %d %s = %lld; pick a multiple of %lld", from, g, b, ranks,
                   who, per_micro, per_micro);
    *accum = (int)(global / per_micro);
    settings_mark(s, "grad-accum", FROM_DERIVED, "global batch %d / (micro-batch %d x %d %s)", global, *batch,
                  ranks, who);
}

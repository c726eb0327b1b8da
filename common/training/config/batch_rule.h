// batch_rule.h: DeepSpeed's rule relating the three batch settings,
//   train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks
// here --global-batch = --batch x --grad-accum x ranks. Given the global
// batch, the one of the other two that was not given follows from it (the
// accumulation when both or neither were); given all three, they must agree.
#pragma once
#include "settings.h"

// Settles *batch and *accum from *global (0: not given) and the sources in
// *s (whether --batch and --grad-accum were given, and where from); the one
// derived is marked FROM_DERIVED. Three that disagree, or a global batch
// that does not divide, exit 2 with one line naming where each came from.
// `who` names the replicas in messages: "ranks", or "data-parallel replicas" where
// the model is split.
void batch_rule_apply(Settings *s, int *batch, int *accum, int global, int ranks, const char *who);

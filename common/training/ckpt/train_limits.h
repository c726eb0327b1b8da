// train_limits.h: the largest step count and micro-batch count the trainer's
// flags take (the model's limits are gpt.h's); a checkpoint's manifest is
// held to the same ranges when it is read (ckpt_manifest.c).
#pragma once

#define TRAIN_MAX_STEPS 10000000
// Most micro-batches per step (--grad-accum, or what --global-batch implies).
#define TRAIN_MAX_GRAD_ACCUM (1 << 20)

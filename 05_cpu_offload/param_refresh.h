// param_refresh.h: ZeRO-Offload's updated parameters back to the device
// (Ren et al., 2021, section 4.1), a unit at a time. After an update the
// rank's new bf16 shard sits in pinned host memory; before each unit of the
// next forward, every unit whose slice is final there goes up on the copy
// stream and is all-gathered (in forward order: every rank issues the same
// gathers in the same order), and the forward waits for its own unit only.
// So the first unit computes once its own params are up, while the CPU Adam
// still works on the later ones and their copies cross PCIe.
#pragma once
#include "trainer.h"

// Is this rank's slice of unit u final in the new shard? With `wait`,
// returns only once it is.
typedef int (*SliceReady)(void *arg, int u, int wait);

typedef struct ParamRefresh {
    int active;              // units still to go up
    int next;                // the next unit to go up
    const bf16 *src;         // the new shard (pinned), shard-relative
    const size_t *first, *count;  // [units]: this rank's slice of each unit, shard-relative
    SliceReady ready;
    void *ready_arg;
    Event *uploaded;         // [units]: the slice is up (the gather waits for it, not the compute stream)
    CommHandle *gather;      // [units]
    Event issued;            // the copies up follow what the compute stream had queued
} ParamRefresh;

// first/count: this rank's slice of each unit (kept, not copied; a slice may
// run past its unit into the shard's padding, which goes up and is not gathered).
void param_refresh_init(ParamRefresh *r, Trainer *t, const size_t *first, const size_t *count);
// The new shard in src is on its way: its slices go up as `ready` says they are final.
void param_refresh_start(ParamRefresh *r, Trainer *t, const bf16 *src, SliceReady ready, void *ready_arg);
// Before unit u computes (forward): the units up to u sent (waiting for
// their slices), the later ones as far as theirs are final, and u's gather
// waited for. Nothing to do when no refresh is on its way.
void param_refresh_unit(ParamRefresh *r, Trainer *t, int u);
// Every unit sent and gathered (the end of the run, a checkpoint of the device's params).
void param_refresh_finish(ParamRefresh *r, Trainer *t);
void param_refresh_free(ParamRefresh *r, Trainer *t);

// pipeline.h: pipeline parallelism (Huang et al. 2019, GPipe; Narayanan et
// al. 2019/2021, PipeDream and PipeDream-Flush): each stage computes its
// contiguous units for micro-batches that flow through the stages, the
// activations forward and their gradients backward between neighbours.
//   AFAB (GPipe): all m forwards, then all m backwards; m micro-batches in flight.
//   1F1B (PipeDream-Flush, Megatron-LM's default): P - s - 1 warm-up
//        forwards, then one forward and one backward in turn, then the
//        remaining backwards; at most min(P - s, m) in flight on stage s.
// Both compute the same thing in the same order per micro-batch, and both
// run the backwards in micro-batch order, so the gradients they accumulate
// are the same to the bit. Idle time per stage, the bubble: (P-1)/(m+P-1).
//   ZB-H1 (zero bubble, Qi et al. 2024): 1F1B's forwards and backwards, each
//        backward split in B (the input's gradient, what the previous stage
//        waits for) and W (the weights'), each W where the table
//        (pipe_schedule.c) puts it, in a slot 1F1B leaves idle; the same
//        gradients to the bit (gpt.h's GPTPlan.w_slots). Bubble (P-1)/(3m+P-1)
//        on a clock where F, B and W take one slot each.
#pragma once
#include "pipe_schedule.h"
#include "trainer.h"

//   Interleaved (Narayanan et al. 2021, Megatron-LM's virtual pipeline): v
//        chunks of L/(P·v) blocks per stage, chunk j of stage s the
//        (j·P + s)-th, so each micro-batch passes every stage v times (the
//        last stage's chunk j hands on to the first stage's chunk j + 1);
//        Megatron's order from the table, each chunk's micro-batches
//        backward in order: the same gradients to the bit. Bubble
//        (P-1)/(v·m+P-1) on a clock of one chunk's forward.
typedef enum { SCHEDULE_1F1B, SCHEDULE_AFAB, SCHEDULE_ZB_H1, SCHEDULE_INTERLEAVED } Schedule;

typedef struct Pipeline {
    Trainer *t;
    Comm *pp;                  // the stages of this pipeline, rank = stage
    int stage, stages;
    Schedule schedule;
    int slots;                 // micro-batches whose activations fit (the plan's slots)
    int *slot_micro;           // the micro-batch each slot holds, -1: free
    int chunks;                // v: interleaved chunks of the stage (1 for the others)
    CommHandle *sent_fwd;      // per slot (and chunk): the send of its output, until it completes
    CommHandle *sent_bwd;      // per slot (and chunk): the send of its input gradient
    const MicroBatches *mb;    // the pass being run
    int in_flight, peak_in_flight;  // forwarded and not yet backwarded: now, and the most in any step
    // ZB-H1: the stages' table for the step's micro-batches, this stage's W
    // slots, and its micro-batches through B and not yet through W (now, the most)
    const ScheduleTable *table;
    int w_slots, pending_w, peak_pending_w;
    CommHandle got;            // ZB-H1: a receive paired with a send, waited for by the operation it feeds
    int max_micro;             // micro-batches a pass may have (the trace's names)
    char (*names)[24];         // "F3", "B3", "W3": each micro-batch's spans on the trace (3 x max_micro);
                               // interleaved: "F3.1", "B3.1", each chunk's (2 x max_micro x v)
    // the bubble of each step: 1 - busy / window, window from the pipeline's
    // first start to its last end, busy = the union of this rank's compute spans in it
    double bubble_sum;
    long bubble_steps;
    double window_us[2];       // the last step's window, its busy time not yet read (pipeline_settle)
} Pipeline;

// Micro-batches stage `stage` of `stages` keeps at once: min(P - s, m) for
// 1F1B and ZB-H1, m for AFAB (and 1 when m is 0).
int pipeline_slots(Schedule s, int stages, int stage, int micro_batches);
// The model (t->model, allocated after) has `slots` slots, and under ZB-H1
// the plan's W slots, the most micro-batches `table` (every stage's,
// kept by the caller) has waiting for their W on this stage; max_micro
// bounds a pass.
void pipeline_init(Pipeline *p, Trainer *t, Comm *pp, int stage, int stages, Schedule s, int slots,
                   const ScheduleTable *table, int max_micro);
void pipeline_free(Pipeline *p);
// One pass: the step's schedule over mb's micro-batches (forwards only when
// mb->dloss_scale is 0). Returns the sum of their mean losses, on every stage.
double pipeline_run(Pipeline *p, const MicroBatches *mb);
// The last step's bubble into bubble_sum, once its compute spans are on the
// trace (on cuda, at the step's end: device.h's dev_spans_settle).
void pipeline_settle(Pipeline *p);
// The closed form of the bubble: (P - 1) / (m + P - 1).
double pipeline_bubble_formula(int stages, int micro_batches);

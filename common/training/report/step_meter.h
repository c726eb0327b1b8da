// step_meter.h: what a training step measures, apart from what it does. The
// trainer's step opens a meter before its first micro-batch and closes it
// after the update; between the two it only trains. The meter reads the
// clock, the ring bytes of the communicators it is given (by group and
// operation), the bytes the stage moved between tiers and the activation
// checkpoints' copies; at the close it settles what ran on the device and
// the communication streams, so that everything the step did is on the
// timeline, and marks the step's span on the trace.
#pragma once
#include "comm.h"
#include "device.h"
#include "gpt.h"
#include "mem_math.h"
#include "trace.h"

#define STEP_METER_MAX_COMMS 6  // the world and the stage's sub-groups (TRAINER_MAX_GROUPS)

// Where a step's figures come from: set once, before the first step.
typedef struct StepTaps {
    Comm *comms[STEP_METER_MAX_COMMS];  // the world first, then the stage's sub-groups
    int ncomms;
    Device *dev;
    GPT *model;                         // its activation checkpoints' copies
    double *xfer_bytes;                 // [XFER_COUNT]: what the stage counts (count_transfer), zeroed per step
    Trace *trace;
} StepTaps;

typedef struct StepMeter {
    double t0_us;
    double comm0[STEP_METER_MAX_COMMS][OP_COUNT];
} StepMeter;

// What one step measured, for the report.
typedef struct StepMeasure {
    double t0_us, t1_us;                            // the step's wall-clock window
    double comm_bytes;                              // ring bytes over every communicator
    double op_bytes[OP_COUNT];                      // ... by operation
    double comm_op_bytes[STEP_METER_MAX_COMMS][OP_COUNT];  // ... by communicator (taps' order) and operation
    double xfer_bytes[XFER_COUNT];                  // between tiers, as the stage counted them
    double act_down, act_up;                        // activation checkpoints to the host and back
} StepMeasure;

StepMeter step_meter_begin(const StepTaps *taps);
// Settles the step's device and communication work; returns its figures.
StepMeasure step_meter_end(const StepMeter *m, const StepTaps *taps);

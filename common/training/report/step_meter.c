// step_meter.c: a training step's measurement (see step_meter.h).
#include "step_meter.h"
#include <string.h>

StepMeter step_meter_begin(const StepTaps *taps) {
    StepMeter m;
    m.t0_us = now_us();
    for (int c = 0; c < taps->ncomms; c++)
        memcpy(m.comm0[c], taps->comms[c]->stats.ring_bytes, sizeof m.comm0[c]);
    // what set-up or an evaluation moved between tiers is not this step's
    for (int x = 0; x < XFER_COUNT; x++) taps->xfer_bytes[x] = 0;
    double down, up;
    gpt_take_offload_bytes(taps->model, &down, &up);
    return m;
}

StepMeasure step_meter_end(const StepMeter *m, const StepTaps *taps) {
    dev_sync(taps->dev, STREAM_COMPUTE);
    for (int c = 0; c < taps->ncomms; c++) comm_settle_stats(taps->comms[c]);
    dev_spans_settle(taps->dev);  // after the comm spans: they are timed against the same anchor
    StepMeasure x;
    memset(&x, 0, sizeof x);
    x.t0_us = m->t0_us;
    x.t1_us = now_us();
    trace_span(taps->trace, TRACE_TID_STEP, "step", x.t0_us, x.t1_us, 0);
    for (int c = 0; c < taps->ncomms; c++)
        for (int op = 0; op < OP_COUNT; op++) {
            double b = taps->comms[c]->stats.ring_bytes[op] - m->comm0[c][op];
            x.comm_op_bytes[c][op] = b;
            x.op_bytes[op] += b;
            x.comm_bytes += b;
        }
    memcpy(x.xfer_bytes, taps->xfer_bytes, sizeof x.xfer_bytes);
    gpt_take_offload_bytes(taps->model, &x.act_down, &x.act_up);
    return x;
}

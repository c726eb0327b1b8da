// device_cuda_spans.cu: the trace's spans of cuda work in device time.
// The host only enqueues kernels, so its clock around a launch times the
// launch, not the work. A span is instead two timing events on the work's
// stream; once the step has synced, each event's device time since an
// anchor (an event recorded while the compute stream was idle, at a known
// host time) puts it on the host's clock, beside the cpu-side spans.
#include <stdlib.h>
#include "device_cuda.h"

typedef struct {
    cudaEvent_t start, end;
    int tid;
    const char *what;
    double bytes;
} PendingSpan;

typedef struct CudaSpans {
    cudaEvent_t anchor;
    double anchor_us;  // host time at which the anchor was recorded
    cudaEvent_t *free_events;
    int nfree, cap_free;
    PendingSpan *pending;
    int npending, cap_pending;
} CudaSpans;

static CudaSpans *spans_of(Device *d) { return (CudaSpans *)cuda_impl(d)->spans; }

static cudaEvent_t take_event(CudaSpans *s) {
    if (s->nfree > 0) return s->free_events[--s->nfree];
    cudaEvent_t ev;
    cudaCheck(cudaEventCreate(&ev));  // timing enabled, unlike the ordering events
    return ev;
}

static void give_event(CudaSpans *s, cudaEvent_t ev) {
    if (s->nfree == s->cap_free) {
        s->cap_free = s->cap_free ? 2 * s->cap_free : 64;
        s->free_events = (cudaEvent_t *)realloc(s->free_events, (size_t)s->cap_free * sizeof *s->free_events);
        CHECK(s->free_events, "out of host memory for %d span events", s->cap_free);
    }
    s->free_events[s->nfree++] = ev;
}

// The compute stream is idle: an event recorded on it now completes now.
static void anchor_clocks(Device *d, CudaSpans *s) {
    s->anchor_us = now_us();
    cudaCheck(cudaEventRecord(s->anchor, cuda_stream(d, STREAM_COMPUTE)));
    cuda_wait(d, NULL, s->anchor);
}

extern "C" double cuda_event_host_us(Device *d, cudaEvent_t ev) {
    CudaSpans *s = spans_of(d);
    float ms = 0.0f;
    cudaCheck(cudaEventElapsedTime(&ms, s->anchor, ev));
    return s->anchor_us + 1000.0 * (double)ms;
}

extern "C" void cuda_span_begin(Device *d, DevSpan *sp) {
    sp->start = NULL;
    if (!d->trace) return;
    cudaEvent_t ev = take_event(spans_of(d));
    cudaCheck(cudaEventRecord(ev, cuda_stream(d, sp->stream)));
    sp->start = (void *)ev;
}

extern "C" void cuda_span_end(Device *d, DevSpan *sp, int tid, const char *what, double bytes) {
    if (!sp->start) return;
    CudaSpans *s = spans_of(d);
    cudaEvent_t end = take_event(s);
    cudaCheck(cudaEventRecord(end, cuda_stream(d, sp->stream)));
    if (s->npending == s->cap_pending) {
        s->cap_pending = s->cap_pending ? 2 * s->cap_pending : 64;
        s->pending = (PendingSpan *)realloc(s->pending, (size_t)s->cap_pending * sizeof *s->pending);
        CHECK(s->pending, "out of host memory for %d spans", s->cap_pending);
    }
    s->pending[s->npending++] = PendingSpan{(cudaEvent_t)sp->start, end, tid, what, bytes};
    sp->start = NULL;
}

extern "C" void cuda_spans_settle(Device *d) {
    CudaSpans *s = spans_of(d);
    for (int i = 0; i < s->npending; i++) {
        PendingSpan *p = &s->pending[i];
        cuda_wait(d, NULL, p->end);  // a copy-stream span may still run
        trace_span(d->trace, p->tid, p->what, cuda_event_host_us(d, p->start), cuda_event_host_us(d, p->end), p->bytes);
        give_event(s, p->start);
        give_event(s, p->end);
    }
    s->npending = 0;
    anchor_clocks(d, s);  // the clocks drift apart slowly: anchor them once a step
}

extern "C" void cuda_spans_init(Device *d) {
    CudaSpans *s = (CudaSpans *)xcalloc(1, sizeof *s);
    cudaCheck(cudaEventCreate(&s->anchor));
    cuda_impl(d)->spans = s;
    anchor_clocks(d, s);
}

extern "C" void cuda_spans_free(Device *d) {
    CudaSpans *s = spans_of(d);
    if (!s) return;
    for (int i = 0; i < s->npending; i++) {
        cudaCheck(cudaEventDestroy(s->pending[i].start));
        cudaCheck(cudaEventDestroy(s->pending[i].end));
    }
    for (int i = 0; i < s->nfree; i++) cudaCheck(cudaEventDestroy(s->free_events[i]));
    cudaCheck(cudaEventDestroy(s->anchor));
    free(s->pending);
    free(s->free_events);
    free(s);
    cuda_impl(d)->spans = NULL;
}

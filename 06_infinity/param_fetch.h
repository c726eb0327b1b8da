// param_fetch.h: where infinity's gathers find the rank's slice of a unit
// when the bf16 param shard is off the device (--offload-params cpu or
// nvme). zero3's gather asks for it (ParamShard's source); from pinned host
// memory it is one copy up, from NVMe a read into pinned staging first,
// started along zero3's schedule one entry ahead of the gathers (which run
// --prefetch entries ahead of the compute), so that NVMe -> pinned ->
// device overlaps the units computing before.
//
// The copy up runs on the copy stream, and only the gather waits for it (an
// event: comm_after_event), never the compute stream or the host: with
// --prefetch 1 or more, unit u+1's slice crosses PCIe while unit u computes
// (the prefetched block swap); with --prefetch 0 each unit's copy is issued
// when the unit is needed and its compute waits for it (the synchronous
// swap). A staging buffer goes to another read once its copy up is done
// (its event).
#pragma once
#include "param_shard.h"
#include "aio.h"
#include "swapper.h"

typedef struct SliceRead {
    int active;        // a read is in flight or done and not used yet
    int staging;       // index of its staging buffer
    size_t skip;       // bytes from the 4 KiB-aligned start of the read to the slice
    size_t first, count;  // the slice: flat elements
    AioRequest req;
} SliceRead;

typedef struct ParamFetch {
    int from_nvme;
    ParamShard *ps;         // the gathers it feeds
    int ahead;              // schedule entries ahead of the unit computing whose reads start
    int ahead_from, ahead_backward;  // the last param_fetch_ahead's unit and direction (-1: none yet)
    int window_in;          // every read of the last window started is in
    Aio *aio;
    const AioFile *file;    // the bf16 param shard on NVMe
    Swapper *swap;          // its writes of the params, which a read must not overtake
    SliceRead *reads;       // [num_units]
    Buf *staging;           // pinned buffers of staging_bytes, handed out to reads
    Event *staging_copied;  // [i]: the copy up out of staging[i] is done
    int *staging_free, staging_n, free_n;
    size_t staging_bytes;
    Event *copied;          // [num_units]: the unit's slice is up (from pinned memory)
} ParamFetch;

// Installs the source in ps. From NVMe: file, and swap for its writes.
void param_fetch_init(ParamFetch *pf, Trainer *t, ParamShard *ps, Aio *aio, const AioFile *file, Swapper *swap);
void param_fetch_free(ParamFetch *pf, Trainer *t);
// Before unit u computes: start reading the slices of the units the next
// entries of the schedule gather (NVMe only; never blocks). At a forward's
// start those reads wait for the last update's writes of the same params.
void param_fetch_ahead(ParamFetch *pf, Trainer *t, int u, int backward);
// 1 once every read of the window last started is in (NVMe only).
int param_fetch_window_in(const ParamFetch *pf);
// The params are about to change: reads started from the old ones are dropped.
void param_fetch_forget(ParamFetch *pf, Trainer *t);

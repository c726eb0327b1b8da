// swapper.h: ZeRO-Infinity's optimizer swapper (Rajbhandari et al., 2021).
// The fp32 master, m and v of the rank's shard live in three files on NVMe;
// a pass streams them through pinned memory in sub-groups. Three slots make
// the pipeline: while the work (the CPU Adam) runs on sub-group k in one
// slot, sub-group k+1 is being read into the next and k-1 written back from
// the third, all on the aio thread. A slot is reused for sub-group k+3 once
// its write-back has finished.
//
// Between passes the swapper keeps the disk busy too: the last write-backs
// finish while the model computes, and swapper_progress (called by the
// step before each unit, never blocking) starts reading the first
// sub-groups of the next pass as soon as their slots are free. A pass asked
// to (SWAP_HOLD_LAST) holds back the master, m and v writes of its last
// sub-groups, whose slots it does not need again, until
// swapper_release_writes: the stage says when (infinity.c: once the next
// forward's first param reads are in).
//
// With --offload-optimizer cpu the states stay in pinned host memory
// (swapper_init's `states`): a slot's master, m and v are then sub-group k's
// place in them, nothing is read or written for them (the passes leave
// SWAP_READ and SWAP_WRITE out), and only the bf16 params go through the
// slots, up to the device or out to NVMe.
//
// Every request's interval goes on the trace's I/O row when it is collected;
// a failed request stops the pass and is reported, never exits: the stage
// decides, with every rank, how to stop.
//
// Each sub-group's master, m and v carry a checksum taken when the pass
// writes them and checked when a pass reads them back, so a file changed
// outside the run (overwritten in place, a bad disk) stops it naming the
// file and offset instead of being trained on. Cost: the 12 bytes per element
// hashed twice per step (24 bytes x shard), one multiply per 8 bytes, on the
// host thread that runs the CPU Adam. The first read of the initial values
// (written by nvme_files) is not checked.
#pragma once
#include "aio.h"
#include "bf16.h"
#include "device.h"
#include "trace.h"

#define SWAP_SLOTS 3
// Sub-groups start at multiples of 2048 elements: 8 KiB of fp32 and 4 KiB of
// bf16, so every request starts O_DIRECT-aligned in every file.
#define SWAP_GROUP_ALIGN 2048

enum { SWAP_MASTER, SWAP_M, SWAP_V, SWAP_PARAMS, SWAP_TENSORS };

// What a pass does with each sub-group (flags).
enum { SWAP_READ = 1, SWAP_WRITE = 2, SWAP_WRITE_PARAMS = 4, SWAP_HOLD_LAST = 8 };

typedef enum { SLOT_FREE, SLOT_READING, SLOT_WRITING } SlotState;

typedef struct SwapSlot {
    Buf buf;                 // pinned: master, m, v (fp32) and params (bf16) of one sub-group
    void *t[SWAP_TENSORS];   // the four tensors inside buf
    SlotState state;
    int group;               // the sub-group it holds, reads or writes; -1: none
    int ready;               // `group` was read ahead for the next pass and not used yet
    int held;                // SLOT_WRITING whose master, m, v writes wait for swapper_release_writes
    AioRequest req[SWAP_TENSORS];  // in flight: reads or writes, by tensor
    int active[SWAP_TENSORS];
} SwapSlot;

// One sub-group as the work sees it: `count` elements of the shard from
// `first` (shard-relative), in slot `slot`.
typedef struct SwapGroup {
    int index, slot;
    size_t first, count;
    float *master, *m, *v;
    bf16 *params;            // room for bf16(master); the pass writes it to the params file with SWAP_WRITE_PARAMS
} SwapGroup;

typedef void (*SwapWork)(const SwapGroup *g, void *arg);

typedef struct Swapper {
    Device *dev;
    Trace *trace;
    Aio *aio[SWAP_TENSORS];  // the context each tensor's requests go to
    const AioFile *file[SWAP_TENSORS];  // file[SWAP_PARAMS] NULL when the params are not on NVMe
    float *states[SWAP_V + 1];  // master, m, v in pinned memory (--offload-optimizer cpu), or NULL: in files
    size_t count;            // elements of the shard
    size_t group_elems;      // per sub-group, a multiple of SWAP_GROUP_ALIGN
    int groups;
    int base;                // sub-group k of the next pass goes to slot (base + k) % SWAP_SLOTS
    SwapSlot slot[SWAP_SLOTS];
    double read_bytes, write_bytes;  // payload consumed by passes / written, since swapper_take_bytes
    uint64_t *checksum[SWAP_V + 1];  // per sub-group, of master, m and v as last written
    unsigned char *checksummed;      // per sub-group: written by a pass, so its checksums hold
    // counted for the report: the reads a pass waited for (start_read
    // blocking), and of them those asked for ahead first (not blocking:
    // swapper_progress, or the pass at an earlier sub-group)
    unsigned char *asked_ahead;      // per sub-group: asked for, not yet waited for
    long reads_waited, reads_asked_ahead;
    int error;               // first failure (errno value), 0 while none
    char error_msg[AIO_ERR_BYTES];
} Swapper;

// Sub-groups of `group_bytes` of fp32 master, m and v together (12 bytes an
// element), at least SWAP_GROUP_ALIGN elements, at most the shard.
size_t swapper_group_elems(double group_bytes, size_t count);
// Allocates the three pinned slots (workspace). The params' writes go to
// params_aio, so that the next forward's reads of them (on the same context)
// do not queue behind the optimizer states on `aio`. `states`: NULL when
// master, m and v are in files[SWAP_MASTER..SWAP_V], else their pinned
// arrays of `count` elements (then the slots hold only the params).
void swapper_init(Swapper *sw, Device *dev, Trace *trace, Aio *aio, Aio *params_aio,
                  const AioFile *file[SWAP_TENSORS], float *const states[3], size_t count, size_t group_elems);
void swapper_free(Swapper *sw);
// Runs `work` on every sub-group in order. SWAP_READ: master, m, v are read
// first (else the work fills them); SWAP_WRITE: written back after it;
// SWAP_WRITE_PARAMS: the group's bf16 params written to the params file;
// SWAP_HOLD_LAST: the last sub-groups' state writes held (see above).
// Returns 0, or the first failure (message in sw->error_msg).
int swapper_pass(Swapper *sw, unsigned what, SwapWork work, void *arg);
// Never blocks: collects finished requests and starts reading the next
// pass's first sub-groups into the slots that are free.
void swapper_progress(Swapper *sw);
// Waits for every request in flight; returns sw->error.
int swapper_drain(Swapper *sw);
// Starts the state writes the last pass held back (see above). Never blocks;
// any wait for those slots (a read into them, a drain) starts them too.
void swapper_release_writes(Swapper *sw);
// 1 when a params write overlapping shard elements [first, first + count)
// is still in flight; swapper_wait_params waits for those.
int swapper_params_pending(Swapper *sw, size_t first, size_t count);
void swapper_wait_params(Swapper *sw, size_t first, size_t count);
// Reads waited for, and of them asked for ahead, since the last call; then zeroes them.
void swapper_take_reads(Swapper *sw, long *waited, long *asked_ahead);
// Payload read (by passes) and written since the last call, then zeroes them.
void swapper_take_bytes(Swapper *sw, double *read_bytes, double *write_bytes);

// comm_world.c: the world and its process groups (see comm.h): MPI's set-up
// and the node's ranks, the backend a run uses (MPI, or NCCL on the cuda
// device), sub-groups split from the world, and their teardown. The
// collectives are comm.c's, which hands them to a backend (comm_backend.h).
#define _GNU_SOURCE  // process_vm_readv
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include "bf16.h"
#include "check.h"
#include "comm.h"
#include "comm_backend.h"

// ---- groups -----------------------------------------------------------------

// ids[r]: any number naming rank r's host. Numbers the hosts from 0 in the
// order of their first rank and counts the ring links between hosts.
static void set_hosts(Comm *c, const int *ids) {
    free(c->host_of);
    c->host_of = xmalloc((size_t)c->size * sizeof *c->host_of);
    c->hosts = 0;
    for (int r = 0; r < c->size; r++) {
        int first = r;
        for (int q = 0; q < r; q++)
            if (ids[q] == ids[r]) {
                first = q;
                break;
            }
        c->host_of[r] = first == r ? c->hosts++ : c->host_of[first];
    }
    c->host_links = 0;
    for (int r = 0; c->hosts > 1 && r < c->size; r++) c->host_links += c->host_of[r] != c->host_of[(r + 1) % c->size];
}

// Every rank's host as the world rank of the first rank on its node.
static void find_hosts(Comm *world, MPI_Comm node) {
    int leader = world->rank;
    mpiCheck(MPI_Bcast(&leader, 1, MPI_INT, 0, node));
    int *ids = xmalloc((size_t)world->size * sizeof *ids);
    mpiCheck(MPI_Allgather(&leader, 1, MPI_INT, ids, 1, MPI_INT, world->mpi));
    set_hosts(world, ids);
    free(ids);
}

// Open MPI's shared-memory transport (vader, the one scripts/mpi-env.sh
// keeps on a node) backs each rank's segment with a file of
// btl_vader_segment_size bytes (4 MiB unless set) plus a header. Under a
// smaller file-size limit MPI_Init fails, and mpirun then prints nothing
// or waits for ever: said here first, in one line.
static void check_file_size_limit(void) {
    struct rlimit lim;
    if (getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return;
    const char *set = getenv("OMPI_MCA_btl_vader_segment_size");
    double segment = set && atof(set) > 0 ? atof(set) : 4194304.0;
    double need_kib = ceil((segment + 4096) / 1024);
    if ((double)lim.rlim_cur >= need_kib * 1024) return;
    fail_usage("the file size limit (ulimit -f) is %.0f KiB, below the %.0f KiB file that Open MPI's shared "
               "memory creates for each rank at start-up, so MPI cannot start; raise it (ulimit -f %.0f or more)",
               (double)lim.rlim_cur / 1024, need_kib, need_kib);
}

// Open MPI's shared memory moves a message above its eager limit (4 kB) in
// fragments that the sender pushes from inside MPI calls: a pipeline
// stage's activations sent before its next forward reached the next stage
// only when that forward ended, a whole operation late (the interleaved
// schedule, sending twice as often, measured a larger bubble than 1F1B's).
// With the single copy (CMA, the kernel's process_vm_readv) the receiver
// copies the message out of the sender's memory itself, as soon as it is
// posted, while the sender computes. Some containers forbid reading
// another process's memory, and Open MPI then stops at the first large
// message; so unless the variable is set already, two forked processes try
// it first (one reads the other's memory, siblings as ranks are), and the
// transport is cma where that works, none where it does not.
static char probe_bytes[64] = "a rank's message, read by its neighbour";

static int sibling_can_read(void) {
    int ready[2];
    if (pipe(ready) != 0) return 0;
    pid_t holder = fork();
    if (holder < 0) {
        close(ready[0]);
        close(ready[1]);
        return 0;
    }
    if (holder == 0) {  // holds the bytes; lets any process of ours read them (Yama's scope 1), then waits
        prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
        char go = 1;
        if (write(ready[1], &go, 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char go = 0;
    int ok = read(ready[0], &go, 1) == 1;
    close(ready[0]);
    pid_t reader = ok ? fork() : -1;
    if (reader == 0) {
        char got[sizeof probe_bytes] = {0};
        struct iovec local = {got, sizeof got}, remote = {probe_bytes, sizeof probe_bytes};
        ssize_t n = process_vm_readv(holder, &local, 1, &remote, 1, 0);
        _exit(n == (ssize_t)sizeof got && memcmp(got, probe_bytes, sizeof got) == 0 ? 0 : 1);
    }
    int status = 1;
    ok = reader > 0 && waitpid(reader, &status, 0) == reader && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    return ok;
}

static const char *const single_copy_var = "OMPI_MCA_btl_vader_single_copy_mechanism";

void comm_single_copy_choose(void) {
    if (!getenv(single_copy_var)) setenv(single_copy_var, sibling_can_read() ? "cma" : "none", 1);
}

const char *comm_single_copy(void) {
    const char *v = getenv(single_copy_var);
    return v ? v : "unset";
}

void comm_world_init(Comm *world, int *argc, char ***argv, int *local_rank, int *local_size, int progress_thread) {
    check_file_size_limit();
    comm_single_copy_choose();
    // FUNNELED: OpenMP threads run kernels, only the main thread calls MPI;
    // MULTIPLE when a progress thread calls it too
    int want = progress_thread ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED, provided = 0;
    mpiCheck(MPI_Init_thread(argc, argv, want, &provided));
    CHECK(provided >= want, "MPI provides thread level %d, below the %d asked for; hint: use an MPI built "
          "with thread support%s", provided, want, progress_thread ? ", or run without --progress-thread" : "");
    // errors come back to mpiCheck (file:line and a hint) instead of aborting
    // inside MPI; communicators split from the world inherit the handler
    mpiCheck(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    memset(world, 0, sizeof *world);
    world->mpi = MPI_COMM_WORLD;
    mpiCheck(MPI_Comm_rank(MPI_COMM_WORLD, &world->rank));
    mpiCheck(MPI_Comm_size(MPI_COMM_WORLD, &world->size));
    world->backend = COMM_MPI;
    mpi_half_sum_ops_create(world->half_sum);
    world->owns_op = 1;

    // ranks that share memory are the ranks on this node
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL,
                                 &node));
    mpiCheck(MPI_Comm_rank(node, local_rank));
    mpiCheck(MPI_Comm_size(node, local_size));
    find_hosts(world, node);
    mpiCheck(MPI_Comm_free(&node));
}

int comm_device_sharers(Comm *c) {
    if (!c->dev || c->dev->kind != DEVICE_CUDA) return 1;
    enum { ID = sizeof c->dev->uuid };
    MPI_Comm node;
    mpiCheck(MPI_Comm_split_type(c->mpi, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node));
    int n = 0;
    mpiCheck(MPI_Comm_size(node, &n));
    unsigned char *ids = xmalloc((size_t)n * ID);
    mpiCheck(MPI_Allgather(c->dev->uuid, ID, MPI_BYTE, ids, ID, MPI_BYTE, node));
    int same = 0;
    for (int i = 0; i < n; i++) same += memcmp(ids + (size_t)i * ID, c->dev->uuid, ID) == 0;
    free(ids);
    mpiCheck(MPI_Comm_free(&node));
    return same;
}

void comm_setup(Comm *c, Device *dev, const char *backend, Trace *trace) {
    c->dev = dev;
    c->trace = trace;
    const char *b = backend ? backend : "auto";
    if (strcmp(b, "auto") == 0) {
        // NCCL where every rank has a GPU of its own; otherwise MPI, which
        // also lets several ranks share one GPU (staging through pinned memory)
        c->backend = COMM_MPI;
#ifdef WB_HAVE_NCCL
        if (dev && dev->kind == DEVICE_CUDA && comm_nccl_supported(c)) comm_nccl_init(c);
#endif
    } else if (strcmp(b, "mpi") == 0) {
        c->backend = COMM_MPI;
    } else if (strcmp(b, "nccl") == 0) {
        if (!dev || dev->kind != DEVICE_CUDA)
            fail_usage("--comm nccl: NCCL needs the cuda device (this run uses the cpu device); "
                       "use --comm mpi or --comm auto");
#ifdef WB_HAVE_NCCL
        comm_nccl_init(c);
#else
        fail_usage("--comm nccl: this binary was built without NCCL (nccl.h was not found); "
                   "use --comm mpi or --comm auto");
#endif
    } else {
        fail_usage("--comm %s: unknown backend; use auto, mpi or nccl", b);
    }
}

void comm_split(Comm *parent, int color, int key, Comm *out) {
    memset(out, 0, sizeof *out);
    mpiCheck(MPI_Comm_split(parent->mpi, color, key, &out->mpi));
    out->rank = -1;  // color MPI_UNDEFINED: this rank is in no group
    if (out->mpi != MPI_COMM_NULL) {
        mpiCheck(MPI_Comm_rank(out->mpi, &out->rank));
        mpiCheck(MPI_Comm_size(out->mpi, &out->size));
        // the members' hosts, as the parent numbered them
        int mine = parent->host_of ? parent->host_of[parent->rank] : 0;
        int *ids = xmalloc((size_t)out->size * sizeof *ids);
        mpiCheck(MPI_Allgather(&mine, 1, MPI_INT, ids, 1, MPI_INT, out->mpi));
        set_hosts(out, ids);
        free(ids);
    }
    out->backend = parent->backend;
    out->dev = parent->dev;
    out->trace = parent->trace;
    memcpy(out->half_sum, parent->half_sum, sizeof out->half_sum);
    out->owns_op = 0;
#ifdef WB_HAVE_NCCL
    if (parent->backend == COMM_NCCL) comm_nccl_split(parent, color, key, out);
#endif
}

// The index of this rank among its host's ranks, in the parent's order.
static int index_on_host(const Comm *c) {
    if (!c->host_of) return c->rank;  // one host
    int index = 0;
    for (int r = 0; r < c->rank; r++) index += c->host_of[r] == c->host_of[c->rank];
    return index;
}

void comm_split_hosts(Comm *parent, Comm *host, Comm *across) {
    int h = parent->host_of ? parent->host_of[parent->rank] : 0;
    comm_split(parent, h, parent->rank, host);
    comm_split(parent, index_on_host(parent), parent->rank, across);
}

int comm_hosts_regular(const Comm *c) {
    int hosts = c->host_of ? c->hosts : 1;
    if (c->size % hosts) return 0;
    int per_host = c->size / hosts;
    for (int r = 0; c->host_of && r < c->size; r++)
        if (c->host_of[r] != r / per_host) return 0;
    return 1;
}

void comm_free(Comm *c) {
    for (int i = 0; i < COMM_STAGE_POOL; i++) buf_free(c->dev, &c->stage_pool[i]);
#ifdef WB_HAVE_NCCL
    comm_nccl_free(c);
#endif
    if (c->mpi != MPI_COMM_NULL && c->mpi != MPI_COMM_WORLD) mpiCheck(MPI_Comm_free(&c->mpi));
    for (int f = 0; f < 2; f++)
        if (c->owns_op && c->half_sum[f] != MPI_OP_NULL) mpiCheck(MPI_Op_free(&c->half_sum[f]));
    c->mpi = MPI_COMM_NULL;
    free(c->host_of);
    c->host_of = NULL;
    c->half_sum[HALF_BF16] = c->half_sum[HALF_FP16] = MPI_OP_NULL;
    c->owns_op = 0;
}

void comm_world_finalize(Comm *world) {
    comm_progress_thread_stop(world);
    comm_free(world);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

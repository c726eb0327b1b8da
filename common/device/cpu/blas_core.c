// blas_core.c: the OpenBLAS kernel set of the cpu device (see blas_core.h).
//
// The choice crosses the restart in the environment, which is the only place
// OpenBLAS reads it from: OPENBLAS_CORETYPE names the core, and
//   ZW_BLAS_CHOSEN=PID:Detected>Target   marks a core this program switched to,
//   ZW_BLAS_KEPT=PID:Detected>Target:why marks a switch undone by the self-test.
// execv keeps the process id, so a marker is the restart's only when its PID
// is this process's; one inherited or set by hand is dropped unread.
#include "blas_core.h"
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include "check.h"

// OpenBLAS's own (cblas.h declares them in newer releases only)
char *openblas_get_corename(void);
char *openblas_get_config(void);

#define ENV_CORE "OPENBLAS_CORETYPE"
#define ENV_CHOSEN "ZW_BLAS_CHOSEN"
#define ENV_KEPT "ZW_BLAS_KEPT"
#define ENV_ISA "ZW_CPU_ISA"

const char *isa_level_name(IsaLevel isa) {
    switch (isa) {
    case ISA_SSE3: return "SSE3";
    case ISA_AVX: return "AVX";
    case ISA_AVX2: return "AVX2";
    case ISA_AVX512: return "AVX-512";
    default: return "unknown";
    }
}

// __builtin_cpu_supports reads cpuid and the OS's xgetbv, so a feature the
// kernel does not save across context switches does not count.
static IsaLevel cpuid_isa_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ISA_AVX2;
    if (__builtin_cpu_supports("avx")) return ISA_AVX;
    return ISA_SSE3;
}

// ZW_CPU_ISA's level: it can only lower cpuid's.
static IsaLevel isa_cap(void) {
    const char *v = getenv(ENV_ISA);
    if (!v || !v[0]) return ISA_AVX512;
    for (IsaLevel l = ISA_SSE3; l <= ISA_AVX512; l++)
        if (strcasecmp(v, isa_level_name(l)) == 0) return l;
    fail_usage("%s=%s is no instruction set; give SSE3, AVX, AVX2 or AVX-512 (the most this CPU is taken to have), "
               "or unset it", ENV_ISA, v);
}

IsaLevel cpu_isa_level(void) {
    IsaLevel cpu = cpuid_isa_level(), cap = isa_cap();
    return cap < cpu ? cap : cpu;
}

// OpenBLAS's x86-64 core names (driver/others/dynamic.c) by the instruction
// set their kernels are written for.
static const struct {
    const char *core;
    IsaLevel isa;
} known_cores[] = {
    {"Prescott", ISA_SSE3},    {"Core2", ISA_SSE3},       {"Penryn", ISA_SSE3},      {"Dunnington", ISA_SSE3},
    {"Nehalem", ISA_SSE3},     {"Atom", ISA_SSE3},        {"Athlon", ISA_SSE3},      {"Opteron", ISA_SSE3},
    {"Opteron_SSE3", ISA_SSE3}, {"Barcelona", ISA_SSE3},  {"Bobcat", ISA_SSE3},      {"Nano", ISA_SSE3},
    {"Sandybridge", ISA_AVX},  {"Bulldozer", ISA_AVX},    {"Piledriver", ISA_AVX},   {"Steamroller", ISA_AVX},
    {"Excavator", ISA_AVX},    {"Haswell", ISA_AVX2},     {"Zen", ISA_AVX2},         {"SkylakeX", ISA_AVX512},
    {"Cooperlake", ISA_AVX512}, {"SapphireRapids", ISA_AVX512},
};

IsaLevel blas_core_isa(const char *core) {
    for (size_t i = 0; core && i < sizeof known_cores / sizeof known_cores[0]; i++)
        if (strcasecmp(core, known_cores[i].core) == 0) return known_cores[i].isa;
    return ISA_NONE;
}

const char *blas_core_for_isa(IsaLevel isa) {
    // SkylakeX rather than Cooperlake: the same sgemm kernels, and Cooperlake
    // asks for AVX-512 BF16 besides
    switch (isa) {
    case ISA_AVX512: return "SkylakeX";
    case ISA_AVX2: return "Haswell";
    case ISA_AVX: return "Sandybridge";
    default: return NULL;
    }
}

const char *blas_core_upgrade(const char *detected, const char *env_core, IsaLevel cpu) {
    if (env_core && env_core[0]) return NULL;  // the user's (or the machine's) choice stands
    IsaLevel have = blas_core_isa(detected);
    const char *best = blas_core_for_isa(cpu);
    if (have == ISA_NONE || !best || cpu <= have) return NULL;
    return best;
}

const char *blas_core_running(void) { return openblas_get_corename(); }

// ---- the self-test ----

// Deterministic values in [-1, 1), different for each matrix.
static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u + seed * 40503u) % 2048u) / 1024.0f - 1.0f;
}

// One product, row-major, op(A) (M,K), op(B) (K,N); the largest error over
// its bound (fp32 rounding of a K-term dot product and the update: gamma_K+2
// times the sum of the terms' magnitudes, Higham's bound), doubled.
static double check_one(int ta, int tb, int M, int N, int K, char *why, size_t why_bytes) {
    const float alpha = 0.75f, beta = -0.5f;
    float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * K * N), *C = malloc(sizeof(float) * M * N);
    if (!A || !B || !C) {
        free(A), free(B), free(C);
        return 0;  // no memory for a test is no evidence against the kernels
    }
    fill(A, (size_t)M * K, 1), fill(B, (size_t)K * N, 2), fill(C, (size_t)M * N, 3);
    float *C0 = malloc(sizeof(float) * M * N);
    if (!C0) {
        free(A), free(B), free(C);
        return 0;
    }
    memcpy(C0, C, sizeof(float) * M * N);
    int lda = ta ? M : K, ldb = tb ? K : N;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A,
                lda, B, ldb, beta, C, N);
    double gamma = 2.0 * (K + 2) * ldexp(1.0, -24), worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                ref += a * b, mag += fabs(a * b);
            }
            double c0 = C0[(size_t)i * N + j], want = alpha * ref + beta * c0, got = C[(size_t)i * N + j];
            double bound = gamma * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
            double ratio = isfinite(got) ? fabs(got - want) / bound : INFINITY;
            if (ratio > worst) {
                worst = ratio;
                snprintf(why, why_bytes, "sgemm %c%c %dx%dx%d: C[%d,%d] = %.9g, reference %.9g", ta ? 'T' : 'N',
                         tb ? 'T' : 'N', M, N, K, i, j, got, want);
            }
        }
    free(A), free(B), free(C), free(C0);
    return worst;
}

int blas_core_self_test(char *why, size_t why_bytes) {
    // odd sizes, so that every kernel's edge loops run; the three transposes
    // the model's GEMMs use (kernels_cpu_matmul.c, kernels_cpu_attention.c)
    static const int shapes[][5] = {{0, 1, 67, 45, 131}, {0, 0, 33, 70, 96}, {1, 0, 64, 29, 77}, {0, 1, 1, 5, 300}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int *p = shapes[s];
        if (check_one(p[0], p[1], p[2], p[3], p[4], why, why_bytes) > 1.0) return -1;
    }
    return 0;
}

// ---- the restart ----

// "Detected>Target[:why]" -> its parts
static void split_choice(const char *v, char *detected, char *target, size_t n, const char **why) {
    const char *gt = strchr(v, '>');
    size_t dn = gt ? (size_t)(gt - v) : 0;
    snprintf(detected, n, "%.*s", (int)(dn < n ? dn : n - 1), v);
    const char *t = gt ? gt + 1 : "";
    const char *colon = strchr(t, ':');
    size_t tn = colon ? (size_t)(colon - t) : strlen(t);
    snprintf(target, n, "%.*s", (int)(tn < n ? tn : n - 1), t);
    if (why) *why = colon ? colon + 1 : "";
}

// The marker `name` set before this process's restart, without its "PID:";
// NULL when there is none, or it names another process (not the restart's).
static const char *own_marker(const char *name) {
    const char *v = getenv(name);
    char *end;
    long pid = v ? strtol(v, &end, 10) : 0;
    return v && end != v && *end == ':' && pid == (long)getpid() ? end + 1 : NULL;
}

static void set_marker(const char *name, const char *value) {
    char v[512];
    snprintf(v, sizeof v, "%ld:%s", (long)getpid(), value);
    setenv(name, v, 1);
}

// ZW_BLAS_CHOSEN names the core OPENBLAS_CORETYPE holds: this program's switch
static int switched_by_us(const char *chosen, const char *env_core, char *detected, char *target, size_t n) {
    if (!chosen || !env_core) return 0;
    split_choice(chosen, detected, target, n, NULL);
    return strcasecmp(target, env_core) == 0;
}

// The vector the process was started with (/proc/self/cmdline): argv, unless
// a program loader came first. '/lib64/ld-linux-x86-64.so.2 [its options]
// ./zero2 --model tiny' makes ld.so /proc/self/exe, and main's argv the tail
// after it, so that the restart must hand ld.so its whole vector again.
// NULL where it cannot be read or does not end in argv.
static char **started_with(char **argv) {
    FILE *f = fopen("/proc/self/cmdline", "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0, got;
    char *text = malloc(cap);
    while (text && (got = fread(text + len, 1, cap - len, f)) > 0)
        if ((len += got) == cap) text = realloc(text, cap *= 2);
    fclose(f);
    if (!text || len == 0 || text[len - 1] != 0) {
        free(text);
        return NULL;
    }
    int n = 0, argc = 0;
    for (size_t i = 0; i < len; i++) n += text[i] == 0;
    while (argv[argc]) argc++;
    char **full = calloc((size_t)n + 1, sizeof *full);
    for (int k = 0, at = 0; full && k < n; k++, at += (int)strlen(text + at) + 1) full[k] = text + at;
    int ends_in_argv = full && n >= argc;
    for (int k = 0; ends_in_argv && k < argc; k++) ends_in_argv = strcmp(full[n - argc + k], argv[k]) == 0;
    if (!ends_in_argv) {
        free(full), free(text);
        return NULL;
    }
    return full;
}

// Runs this program again as it was started; returns only where it cannot.
static void restart(char **argv) {
    char **full = started_with(argv);
    if (!full) {
        if (world_rank() == 0)
            fprintf(stderr, "note: no restart to change OpenBLAS's kernels: /proc/self/cmdline does not say how this "
                            "program was started\n");
        return;
    }
    fflush(NULL);
    execv("/proc/self/exe", full);
    free(full[0]), free(full);
}

// After the switch: keep the new core if it computes right, else go back.
static void check_switched_core(char **argv, const char *chosen) {
    char detected[64], target[64], why[256], kept[400];
    split_choice(chosen, detected, target, sizeof detected, NULL);
    if (strcasecmp(openblas_get_corename(), target) != 0)
        snprintf(why, sizeof why, "OpenBLAS ran %s instead", openblas_get_corename());
    else if (blas_core_self_test(why, sizeof why) == 0)
        return;
    snprintf(kept, sizeof kept, "%s>%s:%s", detected, target, why);
    set_marker(ENV_KEPT, kept);
    unsetenv(ENV_CHOSEN);
    setenv(ENV_CORE, detected, 1);
    restart(argv);
    fprintf(stderr, "error: the OpenBLAS kernels %s failed their self-test (%s), and the restart with %s failed; "
                    "hint: set %s=%s\n", target, why, detected, ENV_CORE, detected);
    exit(1);
}

// A core set in the environment whose kernels need more than this CPU has
// dies with SIGILL at its first GEMM: refused before it runs one.
static void refuse_core_beyond_cpu(const char *env_core) {
    if (!env_core || !env_core[0]) return;
    const char *running = openblas_get_corename();
    IsaLevel need = blas_core_isa(running), cpu = cpu_isa_level();
    if (need <= cpu) return;
    const char *fits = blas_core_for_isa(cpu);
    fail_usage("%s=%s runs OpenBLAS's %s kernels, written for %s, which this CPU lacks (it has %s); hint: unset %s, "
               "or set it to %s", ENV_CORE, env_core, running, isa_level_name(need), isa_level_name(cpu), ENV_CORE,
               fits ? fits : "Prescott");
}

void blas_core_choose(char **argv) {
    // a marker that is not the restart's would make the header lie about the core
    if (!own_marker(ENV_CHOSEN)) unsetenv(ENV_CHOSEN);
    if (!own_marker(ENV_KEPT)) unsetenv(ENV_KEPT);
    const char *env_core = getenv(ENV_CORE), *chosen = own_marker(ENV_CHOSEN);
    refuse_core_beyond_cpu(env_core);
    if (own_marker(ENV_KEPT)) return;  // the switch was tried and undone
    char detected_then[64], target[64];
    if (switched_by_us(chosen, env_core, detected_then, target, sizeof target)) {
        check_switched_core(argv, chosen);
        return;
    }
    // only a DYNAMIC_ARCH library reads OPENBLAS_CORETYPE
    if (!strstr(openblas_get_config(), "DYNAMIC_ARCH")) return;
    const char *detected = openblas_get_corename();
    const char *better = blas_core_upgrade(detected, env_core, cpu_isa_level());
    if (!better) return;
    char mark[160];
    snprintf(mark, sizeof mark, "%s>%s", detected, better);
    set_marker(ENV_CHOSEN, mark);
    setenv(ENV_CORE, better, 1);
    restart(argv);
    unsetenv(ENV_CHOSEN);  // execv failed: go on with the detected kernels
    unsetenv(ENV_CORE);
}

void blas_core_describe(char *buf, size_t bytes) {
    const char *running = openblas_get_corename(), *env_core = getenv(ENV_CORE);
    const char *chosen = own_marker(ENV_CHOSEN), *kept = own_marker(ENV_KEPT);
    char detected[64], target[64];
    const char *why = "";
    if (kept) {
        split_choice(kept, detected, target, sizeof detected, &why);
        snprintf(buf, bytes, "%s (kept: %s failed the self-test: %s)", running, target, why);
    } else if (switched_by_us(chosen, env_core, detected, target, sizeof detected)) {
        snprintf(buf, bytes, "%s (chosen: detected %s below this CPU's %s)", running, detected,
                 isa_level_name(cpu_isa_level()));
    } else if (env_core && env_core[0] && strcasecmp(running, env_core) != 0) {
        // OpenBLAS ignores a name it has no kernels for and detects the core
        snprintf(buf, bytes, "%s (%s=%s names no kernel set of this OpenBLAS)", running, ENV_CORE, env_core);
    } else if (env_core && env_core[0]) {
        snprintf(buf, bytes, "%s (set by %s=%s)", running, ENV_CORE, env_core);
    } else {
        const char *better = blas_core_upgrade(running, NULL, cpu_isa_level());
        if (better)  // the restart did not happen (a static library, or execv failed)
            snprintf(buf, bytes, "%s (detected; this CPU's %s allows %s: set %s=%s)", running,
                     isa_level_name(cpu_isa_level()), better, ENV_CORE, better);
        else
            snprintf(buf, bytes, "%s (detected by OpenBLAS)", running);
    }
}

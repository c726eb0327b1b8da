// blas_shim.c: a preloaded library (LD_PRELOAD) that stands between a trainer
// and OpenBLAS, for test_blas_core:
//   SHIM_DETECT=Core    OpenBLAS "detects" Core when OPENBLAS_CORETYPE is
//                       unset (a machine whose model it cannot identify)
//   SHIM_BAD_CORE=Core  sgemm computes wrong (C[0] off by one) while Core's
//                       kernels run: a planted wrong kernel
//   SHIM_LOG=FILE       each process image that loads appends "pid core" to
//                       FILE, so a test counts the restarts
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

typedef char *(*CoreNameFn)(void);
typedef void (*SgemmFn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                        float, const float *, blasint, const float *, blasint, float, float *, blasint);

static char *real_corename(void) {
    CoreNameFn f = (CoreNameFn)dlsym(RTLD_NEXT, "openblas_get_corename");
    return f ? f() : "unknown";
}

char *openblas_get_corename(void) {
    const char *fake = getenv("SHIM_DETECT"), *env = getenv("OPENBLAS_CORETYPE");
    if (fake && (!env || !env[0])) return (char *)fake;
    return real_corename();
}

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, blasint M, blasint N,
                 blasint K, float alpha, const float *A, blasint lda, const float *B, blasint ldb, float beta,
                 float *C, blasint ldc) {
    SgemmFn f = (SgemmFn)dlsym(RTLD_NEXT, "cblas_sgemm");
    f(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    const char *bad = getenv("SHIM_BAD_CORE");
    if (bad && strcasecmp(bad, real_corename()) == 0 && M > 0 && N > 0) C[0] += 1.0f;
}

__attribute__((constructor)) static void log_image(void) {
    const char *log = getenv("SHIM_LOG");
    if (!log) return;
    FILE *f = fopen(log, "a");
    if (!f) return;
    fprintf(f, "%ld %s\n", (long)getpid(), real_corename());
    fclose(f);
}

/* cpu_gemm — the CPU kernels' dense products, through OpenBLAS or oneDNN (cpu_gemm.h). */
#include "cpu_gemm.h"

#include <cblas.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cpu_dnnl.h"
#include "cpu_matmul.h"

/* ---- threads --------------------------------------------------------------------------------- */

static pthread_once_t s_threads_once = PTHREAD_ONCE_INIT;
static int s_threads = 1;

static void s_threads_setup(void)
{
    const char *env = getenv("DTORCH_BLAS_THREADS");
    int n = 1;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1 && v <= 1024)
            n = (int)v;
    }
    openblas_set_num_threads(n);
    s_threads = n;
}

int cpu_blas_threads(void)
{
    pthread_once(&s_threads_once, s_threads_setup);
    return s_threads;
}

/* ---- the library ----------------------------------------------------------------------------- */

static pthread_once_t s_library_once = PTHREAD_ONCE_INIT;
static bool s_onednn;
static char s_library[64];

/* Whether OpenBLAS chose a kernel of AVX2 or wider for this CPU: its dynamic build falls back to an
 * SSE one (Prescott) on CPUs newer than its release knows. */
static bool s_openblas_wide(void)
{
    static const char *const wide[] = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"};
    const char *core = openblas_get_corename();
    for (size_t i = 0; core && i < sizeof wide / sizeof *wide; i++)
        if (strcasecmp(core, wide[i]) == 0)
            return true;
    return false;
}

static void s_library_setup(void)
{
    const char *env = getenv("DTORCH_GEMM");
    bool onednn = false;
#if DTORCH_HAVE_DNNL && defined(__x86_64__)
    if (env && strcmp(env, "onednn") == 0)
        onednn = true;
    else if (!(env && strcmp(env, "openblas") == 0))
        onednn = __builtin_cpu_supports("avx512f") || (__builtin_cpu_supports("avx2") && !s_openblas_wide());
#elif DTORCH_HAVE_DNNL
    onednn = env && strcmp(env, "onednn") == 0;
#endif
    s_onednn = onednn;
    if (onednn)
        snprintf(s_library, sizeof s_library, "oneDNN");
    else
        snprintf(s_library, sizeof s_library, "OpenBLAS (%s)", openblas_get_corename());
}

static bool s_use_onednn(void)
{
    pthread_once(&s_library_once, s_library_setup);
    return s_onednn;
}

const char *cpu_gemm_library(void)
{
    s_use_onednn();
    return s_library;
}

/* ---- products -------------------------------------------------------------------------------- */

void cpu_sgemm(bool b_trans, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
               const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    cpu_blas_threads();
    if (s_use_onednn() && cpu_dnnl_sgemm(b_trans, M, N, K, alpha, a, lda, b, ldb, beta, c, ldc))
        return;
    if (M == 1) { /* a row: OpenBLAS's sgemm runs it several times slower than its sgemv */
        cblas_sgemv(CblasRowMajor, b_trans ? CblasNoTrans : CblasTrans, b_trans ? (int)N : (int)K,
                    b_trans ? (int)K : (int)N, alpha, b, (int)ldb, a, 1, beta, c, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, (int)M, (int)N, (int)K, alpha, a,
                (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

bool cpu_gemm_bf16_ready(void)
{
#if defined(__x86_64__)
    /* oneDNN runs bfloat16 elsewhere too, but converting in its kernels: not faster than widening */
    return s_use_onednn() && __builtin_cpu_supports("avx512bf16");
#else
    return false;
#endif
}

bool cpu_gemm_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, const uint16_t *b, bool b_trans,
                   const void *bias, bool bias_bf16, void *c, bool c_bf16)
{
    /* cpu_dnnl applies the thread setting to each thread's oneDNN */
    return cpu_gemm_bf16_ready() && cpu_dnnl_matmul_bf16(M, N, K, a, b, b_trans, bias, bias_bf16, c, c_bf16);
}

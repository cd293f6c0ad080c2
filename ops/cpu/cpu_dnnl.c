/* cpu_dnnl — conv2d through oneDNN's convolution primitive, and cpu_gemm's products through its
 * sgemm and its matmul primitive (cpu_dnnl.h).
 *
 * The primitive picks its own layouts (format_tag any: on AVX2 the channels in blocks of 8), so
 * each call reorders the NCHW input and the OIHW weight into them and the output back: the
 * reorders read and write each tensor once, where a 3x3 convolution reads each input element
 * C * 9 times, and a fresh reorder of the weight needs no cache keyed by its address (a freed
 * weight's address comes back for another). Creating a primitive costs milliseconds (code is
 * generated for the shape), so each thread keeps the latest S_CACHE it built, keyed by every
 * size of the convolution, with their reorders, or by a product's sizes and dtypes. */
#include "cpu_dnnl.h"

#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_matmul.h"
#include "dt_pool.h"

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
/* libgomp's (linked where oneDNN's runtime is OpenMP): each thread that starts parallel regions
 * sets its own team size, so a device's thread runs oneDNN on its own threads alone */
void omp_set_num_threads(int n);
#endif

/* The primitives a thread keeps: a VAE's decoder has about a dozen distinct convolutions. */
#define S_CACHE 24
/* The key: N, C, H, W, O, kH, kW, OH, OW, the strides, dilations, four pads, groups, bias; a
 * product's: S_MATMUL, M, N, K, its bias (0 none, 1 float32, 2 bfloat16), C bfloat16, B stored
 * (N, K), then zeros. */
#define S_KEY 19
#define S_MATMUL (-1) /* key[0] of a product (a convolution's N is positive) */

typedef struct {
    int64_t key[S_KEY];
    uint64_t used;                       /* the thread's tick of its last call (0: empty) */
    dnnl_primitive_t prim;               /* the convolution or product; NULL: oneDNN has none for the key */
    dnnl_primitive_t src_in, wei_in, dst_out; /* reorders to and from its layouts (NULL: plain already) */
    dnnl_memory_desc_t src_md, wei_md, dst_md, usrc_md, uwei_md, udst_md, bias_md;
} s_entry;

typedef struct {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    uint64_t tick;
    s_entry cache[S_CACHE];
} s_state;

static pthread_key_t s_key;
static pthread_once_t s_key_once = PTHREAD_ONCE_INIT;
static _Thread_local int64_t s_convs, s_matmuls;
static _Thread_local bool s_broken; /* the engine or stream could not be made: decline every call */

static void s_entry_clear(s_entry *e)
{
    dnnl_primitive_destroy(e->prim);
    dnnl_primitive_destroy(e->src_in);
    dnnl_primitive_destroy(e->wei_in);
    dnnl_primitive_destroy(e->dst_out);
    memset(e, 0, sizeof *e);
}

/* the thread's primitives, stream and engine, when it ends */
static void s_state_free(void *p)
{
    s_state *st = p;
    for (int i = 0; i < S_CACHE; i++)
        s_entry_clear(&st->cache[i]);
    dnnl_stream_destroy(st->stream);
    dnnl_engine_destroy(st->engine);
    free(st);
}

static void s_key_make(void) { pthread_key_create(&s_key, s_state_free); }

static s_state *s_state_get(void)
{
    pthread_once(&s_key_once, s_key_make);
    s_state *st = pthread_getspecific(s_key);
    if (st || s_broken)
        return st;
    st = calloc(1, sizeof *st);
    if (!st || dnnl_engine_create(&st->engine, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st->stream, st->engine, dnnl_stream_default_flags) != dnnl_success ||
        pthread_setspecific(s_key, st) != 0) {
        if (st) {
            dnnl_stream_destroy(st->stream);
            dnnl_engine_destroy(st->engine);
        }
        free(st);
        s_broken = true;
        return NULL;
    }
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(cpu_blas_threads());
#endif
    return st;
}

/* A reorder from one layout of the same tensor to another; NULL when they are the same (or on failure,
 * with *ok false). */
static dnnl_primitive_t s_reorder(dnnl_engine_t eng, const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                  bool *ok)
{
    if (dnnl_memory_desc_equal(from, to))
        return NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t p = NULL;
    if (dnnl_reorder_primitive_desc_create(&pd, from, eng, to, eng, NULL) != dnnl_success ||
        dnnl_primitive_create(&p, pd) != dnnl_success)
        *ok = false;
    dnnl_primitive_desc_destroy(pd);
    return p;
}

/* A product's primitive (key S_MATMUL, M, N, K, bias, C bfloat16, B stored (N, K)): src (M, K)
 * bfloat16, weights (K, N): B^T as B (N, K) is stored (strides (1, K)) or B as it lies (strides
 * (N, 1)), dst (M, N), bias (1, N). Declined where
 * oneDNN has only its reference code for it (no bfloat16 units). */
static bool s_matmul_build(s_state *st, s_entry *e, const int64_t *k)
{
    int64_t M = k[1], N = k[2], K = k[3];
    dnnl_dims_t src = {M, K}, wei = {K, N}, dst = {M, N}, bias = {1, N};
    dnnl_dims_t wei_strides = {k[6] ? 1 : N, k[6] ? K : 1};
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd = NULL;
    const char *impl = NULL;
    bool ok = dnnl_memory_desc_init_by_tag(&e->src_md, 2, src, dnnl_bf16, dnnl_ab) == dnnl_success &&
              dnnl_memory_desc_init_by_strides(&e->wei_md, 2, wei, dnnl_bf16, wei_strides) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->dst_md, 2, dst, k[5] ? dnnl_bf16 : dnnl_f32, dnnl_ab) == dnnl_success &&
              (!k[4] || dnnl_memory_desc_init_by_tag(&e->bias_md, 2, bias, k[4] == 2 ? dnnl_bf16 : dnnl_f32,
                                                     dnnl_ab) == dnnl_success) &&
              dnnl_matmul_desc_init(&md, &e->src_md, &e->wei_md, k[4] ? &e->bias_md : NULL, &e->dst_md) ==
                  dnnl_success &&
              dnnl_primitive_desc_create(&pd, &md, NULL, st->engine, NULL) == dnnl_success &&
              dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
              strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok)
        s_entry_clear(e);
    memcpy(e->key, k, sizeof e->key);
    return ok;
}

/* Builds e's primitive for key k (the layout of S_KEY); false when oneDNN has none. */
static bool s_entry_build(s_state *st, s_entry *e, const int64_t *k)
{
    if (k[0] == S_MATMUL)
        return s_matmul_build(st, e, k);
    int64_t N = k[0], C = k[1], H = k[2], W = k[3], O = k[4], kH = k[5], kW = k[6], OH = k[7], OW = k[8];
    int64_t G = k[17];
    dnnl_dims_t src = {N, C, H, W}, dst = {N, O, OH, OW}, bias = {O};
    dnnl_dims_t wei = {G, O / G, C / G, kH, kW}, strides = {k[9], k[10]};
    /* oneDNN counts the gaps between taps: torch's dilation 1 is its 0 */
    dnnl_dims_t dil = {k[11] - 1, k[12] - 1}, pad_l = {k[13], k[15]}, pad_r = {k[14], k[16]};
    int wnd = G > 1 ? 5 : 4;
    const int64_t *wdims = G > 1 ? wei : wei + 1;
    dnnl_memory_desc_t any_src, any_wei, any_dst;
    dnnl_convolution_desc_t cd;
    dnnl_primitive_desc_t pd = NULL;
    bool ok = dnnl_memory_desc_init_by_tag(&e->usrc_md, 4, src, dnnl_f32, dnnl_nchw) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->udst_md, 4, dst, dnnl_f32, dnnl_nchw) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->uwei_md, wnd, wdims, dnnl_f32, G > 1 ? dnnl_goihw : dnnl_oihw) ==
                  dnnl_success &&
              dnnl_memory_desc_init_by_tag(&e->bias_md, 1, bias, dnnl_f32, dnnl_x) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&any_src, 4, src, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&any_dst, 4, dst, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&any_wei, wnd, wdims, dnnl_f32, dnnl_format_tag_any) == dnnl_success &&
              dnnl_dilated_convolution_forward_desc_init(&cd, dnnl_forward_inference, dnnl_convolution_direct, &any_src,
                                                         &any_wei, k[18] ? &e->bias_md : NULL, &any_dst, strides, dil,
                                                         pad_l, pad_r) == dnnl_success &&
              dnnl_primitive_desc_create(&pd, &cd, NULL, st->engine, NULL) == dnnl_success &&
              dnnl_primitive_create(&e->prim, pd) == dnnl_success;
    if (ok) {
        e->src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        e->wei_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        e->dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        e->src_in = s_reorder(st->engine, &e->usrc_md, &e->src_md, &ok);
        e->wei_in = s_reorder(st->engine, &e->uwei_md, &e->wei_md, &ok);
        e->dst_out = s_reorder(st->engine, &e->dst_md, &e->udst_md, &ok);
    }
    dnnl_primitive_desc_destroy(pd);
    if (!ok)
        s_entry_clear(e);
    memcpy(e->key, k, sizeof e->key);
    return ok;
}

/* The entry for key k: kept, or built in place of the least recently used; NULL when oneDNN has
 * no primitive for it (remembered as an entry without one, so that it is not asked again). */
static s_entry *s_entry_get(s_state *st, const int64_t *k)
{
    s_entry *lru = &st->cache[0];
    for (int i = 0; i < S_CACHE; i++) {
        s_entry *e = &st->cache[i];
        if (e->used && memcmp(e->key, k, sizeof e->key) == 0) {
            e->used = ++st->tick;
            return e->prim ? e : NULL;
        }
        if (e->used < lru->used)
            lru = e;
    }
    s_entry_clear(lru);
    bool built = s_entry_build(st, lru, k);
    lru->used = ++st->tick;
    return built ? lru : NULL;
}

static bool s_exec(s_state *st, dnnl_primitive_t p, int n, const dnnl_exec_arg_t *args)
{
    return dnnl_primitive_execute(p, st->stream, n, args) == dnnl_success;
}

/* A memory object over data (NULL on failure). */
static dnnl_memory_t s_mem(s_state *st, const dnnl_memory_desc_t *md, const void *data)
{
    dnnl_memory_t m = NULL;
    if (dnnl_memory_create(&m, md, st->engine, (void *)data) != dnnl_success)
        return NULL;
    return m;
}

/* Reorders user memory `from` into a pool buffer of md (kept in *buf, *size); the buffer's memory object. */
static dnnl_memory_t s_reordered(s_state *st, dnnl_primitive_t r, dnnl_memory_t from, const dnnl_memory_desc_t *md,
                                 void **buf, size_t *size)
{
    *size = dnnl_memory_desc_get_size(md);
    if (!(*buf = dt_pool_alloc(*size ? *size : 1)))
        return NULL;
    dnnl_memory_t to = s_mem(st, md, *buf);
    if (to && !s_exec(st, r, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}})) {
        dnnl_memory_destroy(to);
        to = NULL;
    }
    return to;
}

bool cpu_dnnl_conv2d(const op_conv2d_dims *d, int64_t N, int64_t pad_bottom, int64_t pad_right, const float *x,
                     const float *w, const float *bias, float *out)
{
    /* oneDNN's sizes are int64 but its kernels index with int: whole tensors stay below 2^31 elements */
    int64_t lim = INT64_C(1) << 31;
    if (N <= 0 || N * d->C * d->H * d->W >= lim || N * d->O * d->OH * d->OW >= lim ||
        d->O * (d->C / d->groups) * d->kH * d->kW >= lim || pad_bottom < 0 || pad_right < 0)
        return false;
    s_state *st = s_state_get();
    if (!st)
        return false;
    int64_t k[S_KEY] = {N, d->C, d->H, d->W, d->O, d->kH, d->kW, d->OH, d->OW, d->stride[0], d->stride[1],
                        d->dilation[0], d->dilation[1], d->pad_top, pad_bottom, d->pad_left, pad_right,
                        d->groups, bias != NULL};
    s_entry *e = s_entry_get(st, k);
    if (!e)
        return false;
    void *bufs[3] = {NULL, NULL, NULL};
    size_t sizes[3] = {0, 0, 0};
    dnnl_memory_t usrc = s_mem(st, &e->usrc_md, x), uwei = s_mem(st, &e->uwei_md, w);
    dnnl_memory_t udst = s_mem(st, &e->udst_md, out), mb = bias ? s_mem(st, &e->bias_md, bias) : NULL;
    dnnl_memory_t src = NULL, wei = NULL, dst = NULL;
    bool ok = usrc && uwei && udst && (!bias || mb);
    if (ok) {
        src = e->src_in ? s_reordered(st, e->src_in, usrc, &e->src_md, &bufs[0], &sizes[0]) : usrc;
        wei = e->wei_in ? s_reordered(st, e->wei_in, uwei, &e->wei_md, &bufs[1], &sizes[1]) : uwei;
        if (e->dst_out) {
            sizes[2] = dnnl_memory_desc_get_size(&e->dst_md);
            bufs[2] = dt_pool_alloc(sizes[2] ? sizes[2] : 1);
            dst = bufs[2] ? s_mem(st, &e->dst_md, bufs[2]) : NULL;
        } else {
            dst = udst;
        }
        ok = src && wei && dst;
    }
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                                   {DNNL_ARG_BIAS, mb}};
        ok = s_exec(st, e->prim, bias ? 4 : 3, args) &&
             (!e->dst_out || s_exec(st, e->dst_out, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, dst}, {DNNL_ARG_TO, udst}})) &&
             dnnl_stream_wait(st->stream) == dnnl_success;
    }
    if (src != usrc)
        dnnl_memory_destroy(src);
    if (wei != uwei)
        dnnl_memory_destroy(wei);
    if (dst != udst)
        dnnl_memory_destroy(dst);
    dnnl_memory_destroy(usrc);
    dnnl_memory_destroy(uwei);
    dnnl_memory_destroy(udst);
    dnnl_memory_destroy(mb);
    for (int i = 0; i < 3; i++)
        dt_pool_free(bufs[i], sizes[i] ? sizes[i] : 1);
    s_convs += ok;
    return ok;
}

int64_t cpu_dnnl_convs(void) { return s_convs; }

bool cpu_dnnl_sgemm(bool b_trans, int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                    const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (!s_state_get()) /* sets the thread's team size first */
        return false;
    return dnnl_sgemm('N', b_trans ? 'T' : 'N', M, N, K, alpha, a, lda, b, ldb, beta, c, ldc) == dnnl_success;
}

bool cpu_dnnl_matmul_bf16(int64_t M, int64_t N, int64_t K, const uint16_t *a, const uint16_t *b, bool b_trans,
                          const void *bias, bool bias_bf16, void *c, bool c_bf16)
{
    int64_t lim = INT64_C(1) << 31;
    if (M <= 0 || N <= 0 || K <= 0 || M * K >= lim || N * K >= lim || M * N >= lim)
        return false;
    s_state *st = s_state_get();
    if (!st)
        return false;
    int64_t k[S_KEY] = {S_MATMUL, M, N, K, bias ? 1 + bias_bf16 : 0, c_bf16, b_trans};
    s_entry *e = s_entry_get(st, k);
    if (!e)
        return false;
    dnnl_memory_t src = s_mem(st, &e->src_md, a), wei = s_mem(st, &e->wei_md, b), dst = s_mem(st, &e->dst_md, c);
    dnnl_memory_t mb = bias ? s_mem(st, &e->bias_md, bias) : NULL;
    bool ok = src && wei && dst && (!bias || mb);
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                                   {DNNL_ARG_BIAS, mb}};
        ok = s_exec(st, e->prim, bias ? 4 : 3, args) && dnnl_stream_wait(st->stream) == dnnl_success;
    }
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(wei);
    dnnl_memory_destroy(dst);
    dnnl_memory_destroy(mb);
    s_matmuls += ok;
    return ok;
}

int64_t cpu_dnnl_matmuls(void) { return s_matmuls; }

/* cuda_attention_kernels — attention on the GPU (cuda_kernels.h): scaled_dot_product_attention and
 * attention_block are two drivers of one device function, s_attend, which runs one query row's
 * online softmax over its keys; attention_merge and attention_block's accumulators use one merge
 * of partial results (o, lse), cpu_attention_merge's formula in double.
 *
 * A block of threads works on one query row at a time (grid-stride over the rows). The row sits
 * in shared memory; the keys come in tiles of S_THREADS, a thread per key computing its score;
 * the tile's max and sum of exponentials are block reductions; the weighted values, Ev floats in
 * shared memory, are rescaled by exp(old max - new max) at each tile, a thread per value element.
 * The CPU computes the scores by sgemm, the softmax over the whole row, then the product with v,
 * so sums are added in another order: float32 results agree to rounding, not bit for bit. The
 * rules are the CPU's: scores are scale * (q . k), plus the mask where there is one; the max is
 * taken over the numbers among the visible scores (a NaN does not count, but then turns the whole
 * row to NaN); a row whose max is -inf (it sees no key, or only scores of -inf) gives zeros. */
#include "cuda_dtype.h"
#include "cuda_kernels.h"
#include "cuda_layout.h"

#define S_THREADS 128 /* keys per tile; a multiple of the warp */
#define S_WARPS (S_THREADS / 32)

static unsigned s_rows(int64_t n) { return (unsigned)(n < 1 ? 1 : n > 65535 ? 65535 : n); }

/* The shared memory of a block: the query row (E floats), the weighted values (Ev), the tile's
 * weights (S_THREADS) and the warps' parts of a block reduction (S_WARPS). */
extern "C" size_t cuda_attention_smem(int64_t E, int64_t Ev)
{
    return (size_t)(E + Ev + S_THREADS + S_WARPS) * sizeof(float);
}

/* ---- block reductions: every thread gets the result (part: S_WARPS floats of shared memory) --- */

__device__ float s_block_max(float v, float *part)
{
    for (int o = 16; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < S_WARPS; w++)
        v = fmaxf(v, part[w]);
    __syncthreads();
    return v;
}

__device__ float s_block_sum(float v, float *part)
{
    for (int o = 16; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0)
        part[threadIdx.x / 32] = v;
    __syncthreads();
    v = part[0];
    for (int w = 1; w < S_WARPS; w++)
        v += part[w];
    __syncthreads();
    return v;
}

/* ---- the keys a row attends to ---------------------------------------------------------------- */

/* scaled_dot_product_attention: keys [0, end) (end: the causal bound, else S), the mask's value
 * added to each score (a bool mask adds 0 or -inf, as the CPU converts it). */
struct s_sdpa_keys {
    int64_t end;
    const void *mask; /* NULL: none */
    dt_dtype mask_dtype;
    int64_t at, step; /* key j's mask element: at + j * step */
    __device__ bool sees(int64_t) const { return true; }
    __device__ float score(float s, int64_t j) const
    {
        if (!mask)
            return s;
        int64_t m = at + j * step;
        float add = mask_dtype == DT_BOOL ? (((const uint8_t *)mask)[m] ? 0.0f : -INFINITY)
                                          : cuda_load_f32(mask, mask_dtype, m);
        return s + add;
    }
};

/* attention_block: key j is visible iff k_pos[j] >= 0 and (not causal or k_pos[j] <= q_pos). */
struct s_block_keys {
    int64_t end;
    const int64_t *k_pos;
    int64_t q_pos;
    bool causal;
    __device__ bool sees(int64_t j) const
    {
        int64_t p = k_pos[j];
        return p >= 0 && (!causal || p <= q_pos);
    }
    __device__ float score(float s, int64_t) const { return s; }
};

/* ---- one query row ---------------------------------------------------------------------------- */

/* What s_attend leaves: the weighted values in shared memory, and the softmax's max and
 * denominator (top = -inf: the row sees nothing). */
struct s_row {
    float top, total;
};

/* Query row q[q_at, q_at + E) against the keys k[k_at + j E, ...) and values v[v_at + j Ev, ...)
 * that keys admits: on return acc = sh + E holds sum_j exp(score_j - top) v_j for the block's
 * threads to read, each the elements d = threadIdx.x + m S_THREADS it wrote. */
template <class Keys>
__device__ s_row s_attend(const Keys &keys, const void *q, int64_t q_at, const void *k, int64_t k_at, const void *v,
                          int64_t v_at, dt_dtype dt, int64_t E, int64_t Ev, float scale, float *sh)
{
    float *qs = sh, *acc = sh + E, *p = acc + Ev, *part = p + S_THREADS;
    for (int64_t e = threadIdx.x; e < E; e += S_THREADS)
        qs[e] = cuda_load_f32(q, dt, q_at + e);
    for (int64_t d = threadIdx.x; d < Ev; d += S_THREADS)
        acc[d] = 0.0f;
    __syncthreads();
    float top = -INFINITY, total = 0.0f;
    bool nan = false; /* a NaN score came before the first number: the row is NaN once one comes */
    for (int64_t t0 = 0; t0 < keys.end; t0 += S_THREADS) {
        int64_t j = t0 + threadIdx.x;
        bool seen = j < keys.end && keys.sees(j);
        float s = -INFINITY;
        if (seen) {
            const int64_t row = k_at + j * E;
            float dot = 0.0f;
            for (int64_t e = 0; e < E; e++)
                dot += qs[e] * cuda_load_f32(k, dt, row + e);
            s = keys.score(E ? scale * dot : 0.0f, j); /* E = 0: scores of 0, whatever the scale (inf) */
        }
        nan = __syncthreads_or(seen && s != s) || nan;
        float next = fmaxf(top, s_block_max(s == s ? s : -INFINITY, part));
        if (next == -INFINITY)
            continue; /* nothing to weigh yet (the same for every thread) */
        float w = seen ? expf(s - next) : 0.0f;
        p[threadIdx.x] = w;
        float rescale = expf(top - next); /* 0 at the first tile with a number */
        total = total * rescale + s_block_sum(w, part);
        if (nan)
            total = NAN;
        int64_t n = keys.end - t0 < S_THREADS ? keys.end - t0 : S_THREADS;
        for (int64_t d = threadIdx.x; d < Ev; d += S_THREADS) {
            float sum = 0.0f;
            for (int64_t jj = 0; jj < n; jj++)
                sum += p[jj] * cuda_load_f32(v, dt, v_at + (t0 + jj) * Ev + d);
            acc[d] = acc[d] * rescale + sum;
        }
        top = next;
        __syncthreads(); /* p is the next tile's */
    }
    return s_row{top, total};
}

/* ---- merging partial results (cpu_attention_merge) -------------------------------------------- */

/* What merging a partial result of lse b into the kept one of lse a does: keep a (b = -inf), take
 * b (a = -inf), or weigh both. */
struct s_merge {
    int how; /* 0 keep, 1 take, 2 weigh */
    float wa, wb, lse;
};

__device__ s_merge s_merge_of(float a, float b)
{
    if (b == -INFINITY)
        return s_merge{0, 1.0f, 0.0f, a};
    if (a == -INFINITY)
        return s_merge{1, 0.0f, 1.0f, b};
    double hi = a > b ? a : b, lo = a > b ? b : a, merged = hi + log1p(exp(lo - hi));
    return s_merge{2, (float)exp(a - merged), (float)exp(b - merged), (float)merged};
}

__device__ float s_merged(const s_merge &m, float oa, float ob)
{
    return m.how == 0 ? oa : m.how == 1 ? ob : oa * m.wa + ob * m.wb;
}

/* ---- scaled_dot_product_attention ------------------------------------------------------------- */

__global__ void s_sdpa_rows(cuda_sdpa_args a)
{
    extern __shared__ float sh[];
    for (int64_t r = blockIdx.x; r < a.nbatch * a.L; r += gridDim.x) {
        int64_t b = r / a.L, i = r % a.L, kv = (b / a.Hq) * a.H + (b % a.Hq) / a.group;
        int64_t end = a.causal ? a.row0 + i + 1 : a.S;
        s_sdpa_keys keys = {end < 0 ? 0 : end > a.S ? a.S : end, a.mask, a.mask_dtype, 0, a.mask_stride[a.nd - 1]};
        if (a.mask)
            keys.at = cuda_offset(b, a.nd - 2, a.batch_shape, a.mask_stride) + i * a.mask_stride[a.nd - 2];
        s_row row = s_attend(keys, a.q, r * a.E, a.k, kv * a.S * a.E, a.v, kv * a.S * a.Ev, a.dtype, a.E, a.Ev,
                             a.scale, sh);
        float inv = 1.0f / row.total;
        for (int64_t d = threadIdx.x; d < a.Ev; d += S_THREADS)
            cuda_store_f32(a.out, a.out_dtype, r * a.Ev + d, row.top == -INFINITY ? 0.0f : sh[a.E + d] * inv);
        __syncthreads();
    }
}

extern "C" cudaError_t cuda_sdpa(const cuda_sdpa_args *a, cudaStream_t s)
{
    int64_t rows = a->nbatch * a->L;
    if (rows <= 0 || a->Ev <= 0)
        return cudaSuccess;
    s_sdpa_rows<<<s_rows(rows), S_THREADS, cuda_attention_smem(a->E, a->Ev), s>>>(*a);
    return cudaGetLastError();
}

/* ---- attention_block, attention_merge --------------------------------------------------------- */

__global__ void s_block_rows(cuda_block_args a)
{
    extern __shared__ float sh[];
    int64_t group = a.Hq / a.H;
    for (int64_t r = blockIdx.x; r < a.B * a.Hq * a.L; r += gridDim.x) {
        int64_t b = r / (a.Hq * a.L), h = (r / a.L) % a.Hq, i = r % a.L, kv = b * a.H + h / group;
        s_block_keys keys = {a.S, a.k_pos + (a.k_pos_batch == 1 ? 0 : b) * a.S,
                             a.q_pos[(a.q_pos_batch == 1 ? 0 : b) * a.L + i], a.causal};
        s_row row = s_attend(keys, a.q, r * a.D, a.k, kv * a.S * a.D, a.v, kv * a.S * a.Dv, a.dtype, a.D, a.Dv,
                             a.scale, sh);
        bool none = row.top == -INFINITY;
        float lse = none ? -INFINITY : row.top + (float)log((double)row.total);
        float inv = (float)(1.0 / (double)row.total);
        s_merge m = a.lse_acc ? s_merge_of(a.lse_acc[r], lse) : s_merge{1, 0.0f, 1.0f, lse};
        for (int64_t d = threadIdx.x; d < a.Dv; d += S_THREADS) {
            float ob = none ? 0.0f : sh[a.D + d] * inv;
            a.o[r * a.Dv + d] = s_merged(m, a.o_acc ? a.o_acc[r * a.Dv + d] : 0.0f, ob);
        }
        if (threadIdx.x == 0)
            a.lse[r] = m.lse;
        __syncthreads();
    }
}

extern "C" cudaError_t cuda_attention_block(const cuda_block_args *a, cudaStream_t s)
{
    int64_t rows = a->B * a->Hq * a->L;
    if (rows <= 0)
        return cudaSuccess;
    s_block_rows<<<s_rows(rows), S_THREADS, cuda_attention_smem(a->D, a->Dv), s>>>(*a);
    return cudaGetLastError();
}

/* a block per row, a thread per value element, each folding the parts in order */
__global__ void s_merge_rows(float *o, float *lse, const float *o_parts, const float *lse_parts, int64_t P,
                             int64_t rows, int64_t Dv)
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        for (int64_t d = threadIdx.x; d < Dv; d += S_THREADS) {
            float l = lse_parts[r], x = o_parts[r * Dv + d];
            for (int64_t p = 1; p < P; p++) {
                s_merge m = s_merge_of(l, lse_parts[p * rows + r]);
                x = s_merged(m, x, o_parts[(p * rows + r) * Dv + d]);
                l = m.lse;
            }
            o[r * Dv + d] = x;
        }
        if (threadIdx.x == 0) {
            float l = lse_parts[r];
            for (int64_t p = 1; p < P; p++)
                l = s_merge_of(l, lse_parts[p * rows + r]).lse;
            lse[r] = l;
        }
    }
}

extern "C" cudaError_t cuda_attention_merge(float *o, float *lse, const float *o_parts, const float *lse_parts,
                                            int64_t P, int64_t rows, int64_t Dv, cudaStream_t s)
{
    if (rows <= 0 || P <= 0)
        return cudaSuccess;
    s_merge_rows<<<s_rows(rows), S_THREADS, 0, s>>>(o, lse, o_parts, lse_parts, P, rows, Dv);
    return cudaGetLastError();
}

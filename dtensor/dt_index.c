/* dt_index — the calls that cut a tensor into pieces or pick parts of it with several ops: split,
 * chunk and unbind, and indexing (ints, slices, None, Ellipsis, an integer DTensor). Each is a
 * chain of registered ops (narrow, select, slice, reshape, index_select) built here, on the
 * user's thread, with torch's argument checks and messages.
 *
 * Placement policy: cutting a tensor into several pieces along a dim it is sharded on would make
 * every piece gather its part; the dim is made Replicate once first instead (one all-gather),
 * unless strict mode is on (then the ops refuse, naming the redistribute they would need). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dt_error.h"
#include "dt_layout.h"
#include "op_registry.h"

static int s_run(int id, dt_tensor *x, int nints, const int64_t *ints, dt_tensor **out)
{
    dt_op_attrs attrs; /* the fields an op reads (nints of ints, no floats, no scalar): the whole
                        * struct zeroed was a tenth of x[i]'s time */
    attrs.nints = nints;
    attrs.nfloats = 0;
    attrs.has_scalar = false;
    for (int i = 0; i < nints; i++) /* a few: a call of memcpy costs more */
        attrs.ints[i] = ints[i];
    int rc = dt_op_run(id, 1, &x, &attrs, 1, out);
    return rc < 0 ? rc : 0;
}

/* x itself (a new reference), or x with every Shard(dim) made Replicate when it will be cut into
 * several pieces along dim. */
static dt_tensor *s_gathered(dt_tensor *x, int dim, int64_t pieces)
{
    int mesh_ndim = dt_mesh_ndim(dt_tensor_mesh(x));
    const dt_placement *pl = dt_tensor_placements(x);
    dt_placement want[DT_MAX_DIMS];
    bool sharded = false;
    for (int m = 0; m < mesh_ndim; m++) {
        sharded = sharded || (pl[m].kind == DT_SHARD && pl[m].dim == dim);
        want[m] = pl[m].kind == DT_SHARD && pl[m].dim == dim ? dt_replicate() : pl[m];
    }
    if (pieces <= 1 || !sharded || dt_get_strict())
        return dt_tensor_ref(x);
    return dt_redistribute(x, NULL, want);
}

/* Releases the n pieces made so far; returns rc. */
static int s_undo(dt_tensor **out, int n, int rc)
{
    for (int i = 0; i < n; i++)
        dt_tensor_release(&out[i]);
    return rc;
}

/* The sizes of the pieces: the sections given, or split_size each (the last may be short). */
static int s_split_sizes(dt_tensor *t, const char *name, int64_t dim, int64_t split_size, int nsections,
                         const int64_t *sections, int *d, int64_t **sizes)
{
    int ndim = dt_tensor_ndim(t);
    if (ndim == 0)
        return dt_err(DT_EINDEX, "%s: cannot %s a 0-dim tensor", name, name);
    if (op_dim(name, dim, ndim, d) != 0)
        return DT_EINDEX;
    int64_t size = dt_tensor_shape(t)[*d], n;
    if (sections) {
        int64_t total = 0;
        bool negative = false;
        for (int i = 0; i < nsections; i++) {
            total += sections[i];
            negative = negative || sections[i] < 0;
        }
        if (negative || total != size) {
            char buf[256];
            dt_layout_format_sizes(buf, sizeof buf, nsections, sections);
            return dt_err(DT_EINVAL, "split_with_sizes expects split_sizes to sum exactly to %lld (input tensor's size "
                          "at dimension %d), but got split_sizes=%s", (long long)size, *d, buf);
        }
        n = nsections;
    } else if (split_size < 0) {
        return dt_err(DT_EINVAL, "split expects split_size be non-negative, but got split_size=%lld",
                      (long long)split_size);
    } else if (split_size == 0) {
        if (size != 0)
            return dt_err(DT_EINVAL, "split_size can only be 0 if dimension size is 0, but got dimension size of %lld",
                          (long long)size);
        n = 1;
    } else {
        n = size ? (size + split_size - 1) / split_size : 1;
    }
    if (n > INT32_MAX || !(*sizes = malloc(sizeof(int64_t) * (size_t)(n ? n : 1))))
        return dt_err(DT_ENOMEM, "%s: out of memory", name);
    for (int64_t i = 0; i < n; i++) {
        int64_t rest = size - i * split_size;
        (*sizes)[i] = sections ? sections[i] : split_size == 0 ? 0 : rest < split_size ? rest : split_size;
    }
    return (int)n;
}

static int s_split(dt_tensor *t, const char *name, int64_t dim, int64_t split_size, int nsections,
                   const int64_t *sections, int max_out, dt_tensor **out)
{
    int d;
    int64_t *sizes = NULL;
    int n = s_split_sizes(t, name, dim, split_size, nsections, sections, &d, &sizes);
    if (n < 0 || !out) {
        free(sizes);
        return n;
    }
    if (n > max_out) {
        free(sizes);
        return dt_err(DT_EINVAL, "%s: makes %d pieces, room for %d", name, n, max_out);
    }
    dt_tensor *x = s_gathered(t, d, n);
    int rc = x ? 0 : dt_last_error_code();
    int64_t start = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = s_run(OP_ID_narrow, x, 3, (int64_t[]){d, start, sizes[i]}, &out[i]);
        if (rc != 0)
            s_undo(out, i, rc);
        start += sizes[i];
    }
    dt_tensor_release(&x);
    free(sizes);
    return rc != 0 ? rc : n;
}

int dt_split(dt_tensor *t, int64_t dim, int64_t split_size, int nsections, const int64_t *sections, int max_out,
             dt_tensor **out)
{
    return s_split(t, "split", dim, split_size, nsections, sections, max_out, out);
}

int dt_chunk(dt_tensor *t, int64_t chunks, int64_t dim, int max_out, dt_tensor **out)
{
    if (chunks <= 0)
        return dt_err(DT_EINVAL, "chunk expects `chunks` to be greater than 0, got: %lld", (long long)chunks);
    int d;
    if (dt_tensor_ndim(t) == 0)
        return dt_err(DT_EINDEX, "chunk: cannot chunk a 0-dim tensor");
    if (op_dim("chunk", dim, dt_tensor_ndim(t), &d) != 0)
        return DT_EINDEX;
    int64_t size = dt_tensor_shape(t)[d], step = (size + chunks - 1) / chunks;
    if (step > 0)
        return s_split(t, "chunk", d, step, 0, NULL, max_out, out);
    if (chunks > INT32_MAX)
        return dt_err(DT_EINVAL, "chunk: too many chunks (%lld)", (long long)chunks);
    int64_t *zeros = calloc((size_t)chunks, sizeof *zeros); /* an empty dim: chunks empty pieces */
    if (!zeros)
        return dt_err(DT_ENOMEM, "chunk: out of memory");
    int rc = s_split(t, "chunk", d, 0, (int)chunks, zeros, max_out, out);
    free(zeros);
    return rc;
}

int dt_unbind(dt_tensor *t, int64_t dim, int max_out, dt_tensor **out)
{
    int d, ndim = dt_tensor_ndim(t);
    if (ndim == 0)
        return dt_err(DT_EINDEX, "unbind: Dimension specified as 0 but tensor has no dimensions");
    if (op_dim("unbind", dim, ndim, &d) != 0)
        return DT_EINDEX;
    int64_t n = dt_tensor_shape(t)[d];
    if (!out)
        return (int)n;
    if (n > max_out)
        return dt_err(DT_EINVAL, "unbind: makes %lld pieces, room for %d", (long long)n, max_out);
    dt_tensor *x = s_gathered(t, d, n);
    int rc = x ? 0 : dt_last_error_code();
    for (int64_t i = 0; i < n && rc == 0; i++)
        if ((rc = s_run(OP_ID_select, x, 2, (int64_t[]){d, i}, &out[i])) != 0)
            s_undo(out, (int)i, rc);
    dt_tensor_release(&x);
    return rc != 0 ? rc : (int)n;
}

/* y[..., idx, ...] with the integer DTensor idx at dim d of y: index_select along d, negative
 * positions allowed; a 0-d idx takes d away, as an int would. */
static dt_tensor *s_index_tensor(dt_tensor *y, int d, dt_tensor *idx)
{
    dt_dtype dtype = dt_tensor_dtype(idx);
    int ndim = dt_tensor_ndim(idx);
    if ((dtype != DT_INT32 && dtype != DT_INT64) || ndim > 1) {
        dt_err(DT_ETYPE, "indexing with a DTensor needs a 0-d or 1-D integer DTensor, got %d-D %s", ndim,
               dt_dtype_name(dtype));
        return NULL;
    }
    dt_tensor *in[2] = {y, idx}, *out = NULL, *squeezed = NULL;
    dt_op_attrs attrs = {.nints = 2, .ints = {d, 1}};
    if (dt_op_run(OP_ID_index_select, 2, in, &attrs, 1, &out) < 0)
        return NULL;
    if (ndim == 1)
        return out;
    int rc = s_run(OP_ID_squeeze, out, 1, (int64_t[]){d}, &squeezed);
    dt_tensor_release(&out);
    return rc == 0 ? squeezed : NULL;
}

/* Python's slice.indices for a positive step: [start, stop) within size. */
static int64_t s_bound(bool given, int64_t v, int64_t otherwise, int64_t size)
{
    if (!given)
        return otherwise;
    if (v < 0)
        v += size;
    return v < 0 ? 0 : v > size ? size : v;
}

/* After one step of an index: *x (borrowed until a step made it, *own) becomes the step's result,
 * or NULL where the step failed (rc). */
static void s_step_done(dt_tensor **x, bool *own, int rc, dt_tensor *next)
{
    if (*own)
        dt_tensor_release(x);
    *x = rc == 0 ? next : NULL;
    *own = true;
}

/* Whether x's shape is the ndim sizes given. */
static bool s_has_shape(const dt_tensor *x, int ndim, const int64_t *shape)
{
    if (dt_tensor_ndim(x) != ndim)
        return false;
    for (int d = 0; d < ndim; d++)
        if (dt_tensor_shape(x)[d] != shape[d])
            return false;
    return true;
}

/* x[items] with ints, slices, None and Ellipsis only: one select or slice per dim, first dims
 * first, and a reshape where None added dims. */
static dt_tensor *s_index_basic(dt_tensor *t, int n, const dt_index_item *items)
{
    int nellipsis = 0, consumed = 0, ndim = dt_tensor_ndim(t);
    for (int i = 0; i < n; i++) {
        nellipsis += items[i].kind == DT_INDEX_ELLIPSIS;
        consumed += items[i].kind == DT_INDEX_INT || items[i].kind == DT_INDEX_SLICE;
    }
    if (n == 1 && items[0].kind == DT_INDEX_INT && ndim > 0) {
        /* x[i], the commonest index, without the general walk below */
        int64_t size = dt_tensor_shape(t)[0], i = items[0].i;
        if (i < -size || i >= size) {
            dt_err(DT_EINDEX, "index %lld is out of bounds for dimension 0 with size %lld", (long long)i,
                   (long long)size);
            return NULL;
        }
        dt_tensor *x = NULL;
        return s_run(OP_ID_select, t, 2, (int64_t[]){0, i < 0 ? i + size : i}, &x) == 0 ? x : NULL;
    }
    if (nellipsis > 1) {
        dt_err(DT_EINDEX, "an index can only have a single ellipsis ('...')");
        return NULL;
    }
    if (consumed > ndim) {
        dt_err(DT_EINDEX, "too many indices for tensor of dimension %d", ndim);
        return NULL;
    }
    /* one step per dim of t (select, slice or nothing), and the shape of the result */
    const int64_t *shape = dt_tensor_shape(t);
    int kind[DT_MAX_DIMS], nfinal = 0, d = 0;
    int64_t args[DT_MAX_DIMS][4], final[DT_MAX_DIMS * 2];
    for (int i = 0; i <= n; i++) {
        /* Ellipsis, or the end without one, stands for the dims no item names */
        int spread = i == n ? (nellipsis ? 0 : ndim - consumed)
                            : items[i].kind == DT_INDEX_ELLIPSIS ? ndim - consumed : 0;
        for (int k = 0; k < spread; k++, d++) {
            kind[d] = -1;
            final[nfinal++] = shape[d];
        }
        if (i == n || items[i].kind == DT_INDEX_ELLIPSIS)
            continue;
        const dt_index_item *it = &items[i];
        if (it->kind == DT_INDEX_NONE) {
            if (nfinal >= DT_MAX_DIMS) {
                dt_err(DT_EINVAL, "indexing: the result would have more than %d dims", DT_MAX_DIMS);
                return NULL;
            }
            final[nfinal++] = 1;
            continue;
        }
        int64_t size = shape[d];
        if (it->kind == DT_INDEX_INT) {
            if (it->i < -size || it->i >= size) {
                dt_err(DT_EINDEX, "index %lld is out of bounds for dimension %d with size %lld", (long long)it->i, d,
                       (long long)size);
                return NULL;
            }
            kind[d] = OP_ID_select;
            args[d][0] = d;
            args[d][1] = it->i < 0 ? it->i + size : it->i;
        } else {
            int64_t step = it->has_step ? it->step : 1;
            if (step <= 0) {
                dt_err(DT_EINVAL, "step must be greater than zero");
                return NULL;
            }
            int64_t start = s_bound(it->has_start, it->start, 0, size), stop = s_bound(it->has_stop, it->stop, size, size);
            /* a step of 1 divides nothing: a 64-bit division is tens of cycles, and most slices step by 1;
             * counted as op_view's slice counts it, without stop - start + step, which a step near
             * 2^63 (x[::2**62]) overflows */
            int64_t length = stop <= start ? 0 : step == 1 ? stop - start : (stop - start - 1) / step + 1;
            final[nfinal++] = length;
            bool whole = start == 0 && length == size && (step == 1 || size <= 1);
            kind[d] = whole ? -1 : OP_ID_slice;
            memcpy(args[d], (int64_t[]){d, start, stop, step}, sizeof args[d]);
        }
        d++;
    }
    if (nfinal > DT_MAX_DIMS) {
        dt_err(DT_EINVAL, "indexing: the result would have more than %d dims", DT_MAX_DIMS);
        return NULL;
    }
    /* first dims first: a select or slice of a leading dim keeps one contiguous run of each piece,
     * which its devices share rather than copy (op_def.alias), and later steps copy less; each
     * select before a dim shifts its number down by one */
    dt_tensor *x = t; /* borrowed until the first step makes a tensor of its own (a reference
                       * taken and dropped is two atomic operations) */
    bool own = false;
    for (int k = 0, dropped = 0; k < ndim && x; k++) {
        if (kind[k] < 0)
            continue;
        dt_tensor *next = NULL;
        args[k][0] = k - dropped;
        int rc = s_run(kind[k], x, kind[k] == OP_ID_select ? 2 : 4, args[k], &next);
        dropped += kind[k] == OP_ID_select;
        s_step_done(&x, &own, rc, next);
    }
    if (x && !s_has_shape(x, nfinal, final)) {
        dt_tensor *next = NULL;
        int rc = s_run(OP_ID_reshape, x, nfinal, final, &next);
        s_step_done(&x, &own, rc, next);
    }
    return own ? x : dt_tensor_ref(t);
}

/* x[items] with one integer DTensor or list among the items, as numpy's indexing with one index
 * array: the other items first, with its dim kept whole, then index_select along the dim that dim
 * became. Where ints stand apart from it (a slice, None or Ellipsis between them), the picked dim
 * goes first, numpy's rule for advanced indices that are not next to each other. */
static dt_tensor *s_index_with_tensor(dt_tensor *t, int n, const dt_index_item *items, int at)
{
    dt_index_item *basic = malloc((size_t)n * sizeof *basic);
    if (!basic) {
        dt_err(DT_ENOMEM, "indexing: out of memory");
        return NULL;
    }
    memcpy(basic, items, (size_t)n * sizeof *basic);
    basic[at] = (dt_index_item){.kind = DT_INDEX_SLICE};
    dt_tensor *y = s_index_basic(t, n, basic); /* also checks the items: too many, two Ellipses */
    free(basic);
    if (!y)
        return NULL;
    /* the dim of t it stands for (one per int or slice before it) and the dim of y that dim became
     * (one per slice or None before it); an Ellipsis before it counts the dims it stands for in both */
    int ndim = dt_tensor_ndim(t), consumed = 0, dim = 0, d = 0, first = at, last = at;
    for (int i = 0; i < n; i++)
        consumed += items[i].kind != DT_INDEX_NONE && items[i].kind != DT_INDEX_ELLIPSIS;
    for (int i = 0; i < at; i++) {
        dt_index_kind kind = items[i].kind;
        dim += kind == DT_INDEX_ELLIPSIS ? ndim - consumed : kind == DT_INDEX_INT || kind == DT_INDEX_SLICE;
        d += kind == DT_INDEX_ELLIPSIS ? ndim - consumed : kind != DT_INDEX_INT;
    }
    for (int i = 0; i < n; i++)
        if (items[i].kind == DT_INDEX_INT) {
            first = i < first ? i : first;
            last = i > last ? i : last;
        }
    bool apart = false;
    for (int i = first; i <= last; i++)
        apart = apart || (items[i].kind != DT_INDEX_INT && i != at);
    dt_tensor *idx = items[at].tensor, *r = NULL;
    if (items[at].kind == DT_INDEX_LIST) {
        /* a list's positions are on this host: checked here, at the call site, as torch does */
        int64_t size = dt_tensor_shape(t)[dim];
        for (int64_t k = 0; k < items[at].npositions; k++)
            if (items[at].positions[k] < -size || items[at].positions[k] >= size) {
                dt_err(DT_EINDEX, "index %lld is out of bounds for dimension %d with size %lld",
                       (long long)items[at].positions[k], dim, (long long)size);
                dt_tensor_release(&y);
                return NULL;
            }
        idx = dt_distribute(dt_tensor_mesh(t), items[at].positions, 1, &items[at].npositions, NULL, DT_INT64, NULL);
    }
    if (idx)
        r = s_index_tensor(y, d, idx);
    dt_tensor_release(&y);
    int idx_ndim = idx ? dt_tensor_ndim(idx) : 0;
    if (items[at].kind == DT_INDEX_LIST)
        dt_tensor_release(&idx);
    if (!r || !apart || d == 0 || idx_ndim == 0)
        return r;
    int64_t perm[DT_MAX_DIMS];
    perm[0] = d;
    for (int k = 0, j = 1; k < dt_tensor_ndim(r); k++)
        if (k != d)
            perm[j++] = k;
    dt_tensor *moved = NULL;
    int rc = s_run(OP_ID_permute, r, dt_tensor_ndim(r), perm, &moved);
    dt_tensor_release(&r);
    return rc == 0 ? moved : NULL;
}

dt_tensor *dt_index(dt_tensor *t, int n, const dt_index_item *items)
{
    int at = -1;
    for (int i = 0; i < n; i++)
        if (items[i].kind == DT_INDEX_TENSOR || items[i].kind == DT_INDEX_LIST) {
            if (at >= 0) {
                dt_err(DT_ETYPE, "indexing with more than one DTensor or list index is not supported");
                return NULL;
            }
            at = i;
        }
    return at < 0 ? s_index_basic(t, n, items) : s_index_with_tensor(t, n, items, at);
}

/* dtn_plan — planning a redistribute: the steps, and for each destination the regions it takes
 * from which device (block intersection), with Partial combined one mesh dim per step. */
#include "dtn_plan.h"

#include <stdlib.h>
#include <string.h>

#include "dt_error.h"
#include "dt_layout.h"
#include "dtn_tensor.h"

#define S_DIRECT_ALL_REDUCE_BYTES (256 << 10) /* below this, an all-reduce is one step, not two */

/* Pieces of a layout that hold distinct data: devices that agree on every non-Replicate mesh
 * dim hold the same piece (replicas), and any one of them can serve it. */
typedef struct {
    int64_t offset[DT_MAX_DIMS];
    int64_t shape[DT_MAX_DIMS];
    int64_t coord[DT_MAX_DIMS];  /* of the first replica */
    int nmembers;
    int64_t *members;            /* (nmembers) flat mesh indices */
} s_group;

typedef struct {
    int ngroups;
    s_group *groups;
    int64_t *storage;
} s_groups;

static void s_groups_free(s_groups *g)
{
    free(g->groups);
    free(g->storage);
}

static int s_groups_make(int ndim, const int64_t *shape, const dtn_layout *l, s_groups *out)
{
    const dt_mesh *m = l->mesh;
    *out = (s_groups){0};
    out->groups = calloc((size_t)m->size, sizeof *out->groups);
    out->storage = calloc((size_t)m->size, sizeof *out->storage);
    int *index = malloc((size_t)m->size * sizeof *index);
    if (!out->groups || !out->storage || !index) {
        free(index);
        s_groups_free(out);
        return DT_ENOMEM;
    }
    /* key: row-major index over the non-Replicate mesh dims */
    int64_t coord[DT_MAX_DIMS], nkeys = 1;
    for (int i = 0; i < m->ndim; i++)
        if (l->pl[i].kind != DT_REPLICATE)
            nkeys *= m->shape[i];
    int64_t *count = calloc((size_t)nkeys, sizeof *count), *first = malloc((size_t)nkeys * sizeof *first);
    if (!count || !first) {
        free(index), free(count), free(first);
        s_groups_free(out);
        return DT_ENOMEM;
    }
    int64_t *keys = out->storage; /* reused below as member lists once keys are counted */
    for (int64_t f = 0; f < m->size; f++) {
        dt_layout_coord(m->ndim, m->shape, f, coord);
        int64_t key = 0;
        for (int i = 0; i < m->ndim; i++)
            if (l->pl[i].kind != DT_REPLICATE)
                key = key * m->shape[i] + coord[i];
        keys[f] = key;
        count[key]++;
    }
    int64_t *members = malloc((size_t)m->size * sizeof *members), at = 0;
    if (!members) {
        free(index), free(count), free(first);
        s_groups_free(out);
        return DT_ENOMEM;
    }
    for (int64_t k = 0; k < nkeys; k++) {
        first[k] = at;
        at += count[k];
        count[k] = 0;
    }
    for (int64_t k = 0; k < nkeys; k++)
        index[k] = -1;
    for (int64_t f = 0; f < m->size; f++) {
        int64_t key = keys[f];
        members[first[key] + count[key]++] = f;
        if (index[key] < 0) {
            index[key] = out->ngroups++;
            s_group *g = &out->groups[index[key]];
            dt_layout_coord(m->ndim, m->shape, f, g->coord);
            dt_layout_block(m->ndim, m->shape, g->coord, l->pl, ndim, shape, g->shape, g->offset);
            g->members = NULL;
        }
    }
    for (int64_t k = 0; k < nkeys; k++) {
        if (index[k] < 0)
            continue;
        s_group *g = &out->groups[index[k]];
        g->members = members + first[k];
        g->nmembers = (int)count[k];
    }
    free(out->storage);
    out->storage = members;
    free(index);
    free(count);
    free(first);
    return 0;
}

/* Intersects [a, a+as) with [b, b+bs) per dim; false when empty. */
static bool s_intersect(int ndim, const int64_t *ao, const int64_t *as, const int64_t *bo, const int64_t *bs,
                        int64_t *o, int64_t *s)
{
    bool any = true;
    for (int d = 0; d < ndim; d++) {
        int64_t lo = ao[d] > bo[d] ? ao[d] : bo[d];
        int64_t hi = ao[d] + as[d] < bo[d] + bs[d] ? ao[d] + as[d] : bo[d] + bs[d];
        o[d] = lo;
        s[d] = hi > lo ? hi - lo : 0;
        any = any && hi > lo;
    }
    return any;
}

static int s_add_part(dtn_piece *pc, int *cap, const dtn_part *part)
{
    if (pc->nparts == *cap) {
        int grown_cap = *cap ? 2 * *cap : 4;
        dtn_part *grown = realloc(pc->parts, (size_t)grown_cap * sizeof *grown);
        if (!grown)
            return DT_ENOMEM;
        pc->parts = grown;
        *cap = grown_cap;
    }
    pc->parts[pc->nparts++] = *part;
    return 0;
}

/* One step from->to. reduce_dim >= 0: from has a Partial there which this step combines (to has
 * Replicate or Shard there); every other Partial mesh dim of from is kept as is in to (same mesh)
 * and a destination only reads sources with its own coordinate on those dims. */
static int s_step(int ndim, const int64_t *shape, const dtn_layout *from, const dtn_layout *to, int reduce_dim,
                  dtn_step *step)
{
    *step = (dtn_step){.from = *from, .to = *to, .reduce_dim = reduce_dim, .mesh_dim = -1};
    s_groups groups;
    if (s_groups_make(ndim, shape, from, &groups) != 0)
        return DT_ENOMEM;
    const dt_mesh *dm = to->mesh, *sm = from->mesh;
    step->npieces = (int)dm->size;
    step->pieces = calloc((size_t)dm->size, sizeof *step->pieces);
    if (!step->pieces)
        goto nomem;
    int nrounds = reduce_dim >= 0 ? (int)sm->shape[reduce_dim] : 1;
    for (int64_t j = 0; j < dm->size; j++) {
        dtn_piece *pc = &step->pieces[j];
        int cap = 0;
        int64_t dcoord[DT_MAX_DIMS], doff[DT_MAX_DIMS];
        dt_layout_coord(dm->ndim, dm->shape, j, dcoord);
        dt_layout_block(dm->ndim, dm->shape, dcoord, to->pl, ndim, shape, pc->shape, doff);
        pc->device = dm->ids[j];
        for (int round = 0; round < nrounds; round++) {
            for (int gi = 0; gi < groups.ngroups; gi++) {
                s_group *g = &groups.groups[gi];
                bool match = true;
                for (int i = 0; i < sm->ndim && match; i++) {
                    if (i == reduce_dim)
                        match = g->coord[i] == round;
                    else if (from->pl[i].kind == DT_PARTIAL)
                        match = g->coord[i] == dcoord[i]; /* a kept Partial: same mesh, same coordinate */
                }
                dtn_part part = {.mode = round == 0 ? MB_PART_COPY : MB_PART_REDUCE,
                                 .op = reduce_dim >= 0 ? from->pl[reduce_dim].reduce_op : 0};
                int64_t o[DT_MAX_DIMS];
                if (!match || !s_intersect(ndim, g->offset, g->shape, doff, pc->shape, o, part.shape))
                    continue;
                /* serve from the destination itself when it holds a replica, else spread the load */
                int64_t src = g->members[j % g->nmembers];
                for (int r = 0; r < g->nmembers; r++)
                    if (sm->ids[g->members[r]] == pc->device)
                        src = g->members[r];
                part.src_device = sm->ids[src];
                for (int d = 0; d < ndim; d++) {
                    part.src_offset[d] = o[d] - g->offset[d];
                    part.dst_offset[d] = o[d] - doff[d];
                }
                if (part.src_device != pc->device)
                    step->remote_elements += dt_layout_numel(ndim, part.shape);
                if (s_add_part(pc, &cap, &part) != 0)
                    goto nomem;
            }
        }
        if (reduce_dim >= 0 && from->pl[reduce_dim].reduce_op == DT_REDUCE_AVG) {
            dtn_part div = {.mode = MB_PART_DIV, .src_device = pc->device, .divisor = nrounds};
            memcpy(div.shape, pc->shape, sizeof div.shape);
            if (s_add_part(pc, &cap, &div) != 0)
                goto nomem;
        }
    }
    s_groups_free(&groups);
    return 0;
nomem:
    s_groups_free(&groups);
    for (int p = 0; step->pieces && p < step->npieces; p++)
        free(step->pieces[p].parts);
    free(step->pieces);
    step->pieces = NULL;
    return DT_ENOMEM;
}

/* Names a step the way PyTorch names the collective it replaces. */
static void s_name(dtn_step *step)
{
    const dtn_layout *a = &step->from, *b = &step->to;
    if (step->remote_elements == 0) {
        step->kind = "local";
    } else if (step->reduce_dim >= 0) {
        step->mesh_dim = step->reduce_dim;
        step->kind = b->pl[step->reduce_dim].kind == DT_SHARD ? "reduce_scatter" : "all_reduce";
    } else if (a->mesh == b->mesh) {
        int changed = -1, nchanged = 0;
        for (int i = 0; i < a->mesh->ndim; i++)
            if (memcmp(&a->pl[i], &b->pl[i], sizeof a->pl[i]) != 0)
                changed = i, nchanged++;
        step->kind = "p2p";
        if (nchanged == 1) {
            step->mesh_dim = changed;
            if (a->pl[changed].kind == DT_SHARD && b->pl[changed].kind == DT_REPLICATE)
                step->kind = "all_gather";
            else if (a->pl[changed].kind == DT_SHARD && b->pl[changed].kind == DT_SHARD)
                step->kind = "all_to_all";
        }
    } else {
        step->kind = "p2p";
    }
}

static bool s_same_mesh(const dt_mesh *a, const dt_mesh *b)
{
    if (a == b)
        return true;
    if (a->ndim != b->ndim || memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof *a->shape) != 0)
        return false;
    return memcmp(a->ids, b->ids, (size_t)a->size * sizeof *a->ids) == 0;
}

int dtn_plan_make(int ndim, const int64_t *shape, size_t elem_size, const dtn_layout *src, const dtn_layout *dst,
                  dtn_plan *plan)
{
    *plan = (dtn_plan){.ndim = ndim};
    memcpy(plan->shape, shape, (size_t)ndim * sizeof *shape);
    bool same_mesh = s_same_mesh(src->mesh, dst->mesh);
    dtn_layout cur = *src;
    if (same_mesh)
        cur.mesh = dst->mesh;
    int64_t bytes = dt_layout_numel(ndim, shape) * (int64_t)elem_size;
    /* combine Partial mesh dims the target does not keep, innermost first */
    for (int i = src->mesh->ndim - 1; i >= 0; i--) {
        dt_placement p = src->pl[i];
        if (p.kind != DT_PARTIAL)
            continue;
        if (same_mesh && memcmp(&dst->pl[i], &p, sizeof p) == 0)
            continue;
        dtn_layout next = cur;
        next.pl[i] = dt_replicate();
        if (same_mesh && dst->pl[i].kind == DT_SHARD) {
            next.pl[i] = dst->pl[i]; /* reduce-scatter straight into the target's shard */
        } else if (bytes >= S_DIRECT_ALL_REDUCE_BYTES && src->mesh->shape[i] > 1) {
            /* a large all-reduce as reduce-scatter then all-gather: each device moves 2(n-1)/n of
             * the tensor instead of (n-1) times it */
            int best = -1;
            for (int d = 0; d < ndim; d++)
                if (shape[d] >= src->mesh->shape[i] && (best < 0 || shape[d] > shape[best]))
                    best = d;
            if (best >= 0)
                next.pl[i] = dt_shard(best);
        }
        if (s_step(ndim, shape, &cur, &next, i, &plan->steps[plan->nsteps]) != 0)
            goto nomem;
        s_name(&plan->steps[plan->nsteps++]);
        cur = next;
    }
    bool done = cur.mesh == dst->mesh || s_same_mesh(cur.mesh, dst->mesh);
    for (int i = 0; done && i < dst->mesh->ndim; i++)
        done = memcmp(&cur.pl[i], &dst->pl[i], sizeof cur.pl[i]) == 0;
    if (!done) {
        if (s_step(ndim, shape, &cur, dst, -1, &plan->steps[plan->nsteps]) != 0)
            goto nomem;
        s_name(&plan->steps[plan->nsteps++]);
    }
    return 0;
nomem:
    dtn_plan_free(plan);
    return dt_err(DT_ENOMEM, "redistribute: out of memory while planning");
}

void dtn_plan_free(dtn_plan *plan)
{
    for (int s = 0; s < plan->nsteps; s++) {
        for (int p = 0; p < plan->steps[s].npieces; p++)
            free(plan->steps[s].pieces[p].parts);
        free(plan->steps[s].pieces);
    }
    plan->nsteps = 0;
}

int dtn_plan_collectives(const dtn_plan *plan)
{
    int n = 0;
    for (int s = 0; s < plan->nsteps; s++)
        n += plan->steps[s].remote_elements > 0;
    return n;
}

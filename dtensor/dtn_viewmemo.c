/* dtn_viewmemo — per-thread plans of the views dt_op_run made (dtn_viewmemo.h). A direct-mapped
 * table: a model's loop makes a few dozen distinct views at most, and a collision only costs the
 * plan worked out again. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dtn_viewmemo.h"

#define S_ENTRIES 64 /* a power of two */
#define S_INDEX_BITS 6

typedef struct {
    bool used;
    dtn_view_key key;
    dtn_view_plan plan;
} s_entry;

static _Thread_local s_entry *s_table; /* this thread's, made at its first keep */
static pthread_key_t s_owner;          /* frees a thread's table when it exits */
static pthread_once_t s_owner_once = PTHREAD_ONCE_INIT;
static bool s_owner_made;

static void s_make_owner(void) { s_owner_made = pthread_key_create(&s_owner, free) == 0; }

bool dtn_viewmemo_key(const op_def *def, const dt_tensor *x, const op_attrs *attrs, dtn_view_key *key)
{
    if ((!def->view && !def->strided) || x->strided || x->layout)
        return false;
    int nints = attrs ? attrs->nints : 0;
    if (attrs && (attrs->nfloats != 0 || attrs->has_scalar || nints < 0 || nints > OP_MAX_INTS))
        return false;
    const dt_mesh *mesh = x->mesh;
    uint64_t *w = key->words;
    int n = 0;
    w[n++] = (uint64_t)(uint32_t)def->id | (uint64_t)x->ndim << 32 | (uint64_t)x->dtype << 40 |
             (uint64_t)nints << 48 | (uint64_t)mesh->ndim << 56;
    for (int m = 0; m < mesh->ndim; m++)
        w[n++] = (uint64_t)mesh->shape[m];
    for (int d = 0; d < x->ndim; d++)
        w[n++] = (uint64_t)x->shape[d];
    for (int m = 0; m < mesh->ndim; m++) {
        const dt_placement *p = &x->placements[m];
        w[n++] = (uint64_t)(uint32_t)p->dim << 32 | (uint64_t)(uint32_t)p->reduce_op << 8 | (uint32_t)p->kind;
    }
    for (int i = 0; i < nints; i++)
        w[n++] = (uint64_t)attrs->ints[i];
    uint64_t h = 0;
    for (int i = 0; i < n; i++)
        h = (h ^ w[i]) * 0x9e3779b97f4a7c15u; /* the index is the top bits: they mix every word */
    key->nwords = n;
    key->hash = h;
    return true;
}

static s_entry *s_slot(const dtn_view_key *key) { return &s_table[key->hash >> (64 - S_INDEX_BITS)]; }

const dtn_view_plan *dtn_viewmemo_find(const dtn_view_key *key)
{
    if (!s_table)
        return NULL;
    const s_entry *e = s_slot(key);
    if (!e->used || e->key.hash != key->hash || e->key.nwords != key->nwords ||
        memcmp(e->key.words, key->words, (size_t)key->nwords * sizeof *key->words) != 0)
        return NULL;
    return &e->plan;
}

void dtn_viewmemo_keep(const dtn_view_key *key, const dtn_view_plan *plan)
{
    if (!s_table) {
        pthread_once(&s_owner_once, s_make_owner);
        if (!s_owner_made || !(s_table = calloc(S_ENTRIES, sizeof *s_table)))
            return;
        if (pthread_setspecific(s_owner, s_table) != 0) {
            free(s_table);
            s_table = NULL;
            return;
        }
    }
    s_entry *e = s_slot(key);
    e->used = true;
    e->key.nwords = key->nwords;
    e->key.hash = key->hash;
    memcpy(e->key.words, key->words, (size_t)key->nwords * sizeof *key->words);
    e->plan = *plan;
}

/* dt_idmap — an open-addressing hash map from nonzero 64-bit ids to pointers (linear probing). */
#include "dt_idmap.h"

#include <stdlib.h>

#include "dtorch.h"

#define S_EMPTY 0
#define S_DELETED UINT64_MAX

static size_t s_hash(uint64_t id)
{
    id ^= id >> 33;
    id *= 0xff51afd7ed558ccdull;
    id ^= id >> 33;
    return (size_t)id;
}

void dt_idmap_init(dt_idmap *m) { *m = (dt_idmap){0}; }

void dt_idmap_destroy(dt_idmap *m)
{
    free(m->keys);
    free(m->values);
    *m = (dt_idmap){0};
}

static int s_grow(dt_idmap *m)
{
    /* sized for the live entries only: a map that churns (tensors made and freed) rehashes in
     * place to drop its tombstones instead of growing without end */
    size_t cap = 64;
    while ((m->count + 1) * 4 > cap)
        cap *= 2;
    dt_idmap grown = {calloc(cap, sizeof(uint64_t)), calloc(cap, sizeof(void *)), cap, 0, 0};
    if (!grown.keys || !grown.values) {
        free(grown.keys);
        free(grown.values);
        return DT_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i] != S_EMPTY && m->keys[i] != S_DELETED)
            dt_idmap_put(&grown, m->keys[i], m->values[i]);
    dt_idmap_destroy(m);
    *m = grown;
    return 0;
}

int dt_idmap_put(dt_idmap *m, uint64_t id, void *value)
{
    if (id == S_EMPTY || id == S_DELETED)
        return DT_EINVAL; /* the markers of free slots: ids from a socket may be anything */
    /* keep at most half the slots used so probe chains stay short */
    if ((m->used + 1) * 2 > m->cap && s_grow(m) != 0)
        return DT_ENOMEM;
    size_t mask = m->cap - 1, i = s_hash(id) & mask, tomb = SIZE_MAX;
    for (;; i = (i + 1) & mask) {
        if (m->keys[i] == id) {
            m->values[i] = value;
            return 0;
        }
        if (m->keys[i] == S_DELETED && tomb == SIZE_MAX)
            tomb = i;
        if (m->keys[i] == S_EMPTY)
            break;
    }
    if (tomb != SIZE_MAX)
        i = tomb;
    else
        m->used++;
    m->keys[i] = id;
    m->values[i] = value;
    m->count++;
    return 0;
}

static size_t s_find(const dt_idmap *m, uint64_t id)
{
    if (m->cap == 0 || id == S_EMPTY || id == S_DELETED)
        return SIZE_MAX;
    size_t mask = m->cap - 1;
    for (size_t i = s_hash(id) & mask;; i = (i + 1) & mask) {
        if (m->keys[i] == id)
            return i;
        if (m->keys[i] == S_EMPTY)
            return SIZE_MAX;
    }
}

void *dt_idmap_get(const dt_idmap *m, uint64_t id)
{
    size_t i = s_find(m, id);
    return i == SIZE_MAX ? NULL : m->values[i];
}

void *dt_idmap_take(dt_idmap *m, uint64_t id)
{
    size_t i = s_find(m, id);
    if (i == SIZE_MAX)
        return NULL;
    void *value = m->values[i];
    m->keys[i] = S_DELETED;
    m->values[i] = NULL;
    m->count--;
    return value;
}

int dt_idmap_next(const dt_idmap *m, size_t *cursor, uint64_t *id, void **value)
{
    for (; *cursor < m->cap; (*cursor)++) {
        size_t i = *cursor;
        if (m->keys[i] != S_EMPTY && m->keys[i] != S_DELETED) {
            *id = m->keys[i];
            *value = m->values[i];
            (*cursor)++;
            return 1;
        }
    }
    return 0;
}

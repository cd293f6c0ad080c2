/* dt_idmap — an open-addressing hash map from nonzero 64-bit ids to pointers.
 * Used for tensors on a worker and pending futures on the controller. Not thread-safe. */
#ifndef DT_IDMAP_H
#define DT_IDMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint64_t *keys; /* 0 = empty, UINT64_MAX = deleted */
    void **values;
    size_t cap;     /* power of two */
    size_t used;    /* live + deleted slots */
    size_t count;   /* live entries */
} dt_idmap;

void dt_idmap_init(dt_idmap *m);
void dt_idmap_destroy(dt_idmap *m);
/* Inserts or replaces; returns 0, DT_ENOMEM, or DT_EINVAL for id 0 or UINT64_MAX (never ids: get
 * and take find nothing under them). */
int dt_idmap_put(dt_idmap *m, uint64_t id, void *value);
void *dt_idmap_get(const dt_idmap *m, uint64_t id);
/* Removes and returns the value (NULL if absent). */
void *dt_idmap_take(dt_idmap *m, uint64_t id);
/* Visits every entry: for (size_t i = 0; dt_idmap_next(m, &i, &id, &v);) */
int dt_idmap_next(const dt_idmap *m, size_t *cursor, uint64_t *id, void **value);

#endif

/* op_registry — the table of every op, assembled from the families' tables. */
#include "op_registry.h"

#include <string.h>

typedef struct {
    const op_def *ops;
    const int *count;
} s_family;

static const s_family s_families[] = {
    {op_pointwise_ops, &op_pointwise_count},
    {op_reduce_ops, &op_reduce_count},
    {op_view_ops, &op_view_count},
    {op_matmul_ops, &op_matmul_count},
    {op_rope_ops, &op_rope_count},
    {op_write_ops, &op_write_count},
};

#define S_NFAMILIES (int)(sizeof s_families / sizeof s_families[0])

const op_def *op_at(int index)
{
    for (int f = 0; f < S_NFAMILIES; f++) {
        if (index < *s_families[f].count)
            return index >= 0 ? &s_families[f].ops[index] : NULL;
        index -= *s_families[f].count;
    }
    return NULL;
}

int op_index(const op_def *def)
{
    int base = 0;
    for (int f = 0; f < S_NFAMILIES; f++) {
        const op_def *ops = s_families[f].ops;
        if (def >= ops && def < ops + *s_families[f].count)
            return base + (int)(def - ops);
        base += *s_families[f].count;
    }
    return -1;
}

const op_def *op_find(const char *name)
{
    for (int f = 0; f < S_NFAMILIES; f++)
        for (int i = 0; i < *s_families[f].count; i++)
            if (strcmp(s_families[f].ops[i].name, name) == 0)
                return &s_families[f].ops[i];
    return NULL;
}

#define S_FNV_OFFSET 0xcbf29ce484222325ull
#define S_FNV_PRIME 0x100000001b3ull

static uint64_t s_fnv(uint64_t h, const void *data, size_t size)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < size; i++)
        h = (h ^ p[i]) * S_FNV_PRIME;
    return h;
}

/* Integers are hashed as 8 little-endian bytes, so the hash is the same on every host. */
static uint64_t s_fnv_int(uint64_t h, int64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)v >> (8 * i));
    return s_fnv(h, b, sizeof b);
}

uint64_t op_registry_hash(void)
{
    uint64_t h = S_FNV_OFFSET;
    const op_def *def;
    for (int i = 0; (def = op_at(i)) != NULL; i++) {
        h = s_fnv_int(h, op_index(def));
        h = s_fnv(h, def->name, strlen(def->name) + 1); /* the NUL keeps "ab","c" apart from "a","bc" */
        h = s_fnv_int(h, def->nin);
        h = s_fnv_int(h, def->nout);
    }
    return h;
}

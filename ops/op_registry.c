/* op_registry — finding an op by id or by name among the rows of ops/op_table.h. Each family's
 * file defines one op_def per row, named op_def_<name>. */
#include "op_registry.h"

#include <stdio.h>
#include <string.h>

#include "dt_error.h"

#define S_DECLARE(name, ...) extern const op_def op_def_##name;
OP_TABLE(S_DECLARE)
#undef S_DECLARE

#define S_CHECK(name, id, ...) _Static_assert((id) >= 0 && (id) < OP_ID_LIMIT, "op " #name ": id out of range");
OP_TABLE(S_CHECK)
#undef S_CHECK

#define S_ADDRESS(name, ...) &op_def_##name,
static const op_def *const s_ops[] = {OP_TABLE(S_ADDRESS)};
#undef S_ADDRESS

#define S_COUNT (int)(sizeof s_ops / sizeof s_ops[0])

/* A switch, so that two rows declaring one id fail to compile (duplicate case value). */
const op_def *op_by_id(int id)
{
#define S_CASE(name, id, ...) case (id): return &op_def_##name;
    switch (id) {
    OP_TABLE(S_CASE)
    default: return NULL;
    }
#undef S_CASE
}

const op_def *op_find(const char *name)
{
    for (int i = 0; i < S_COUNT; i++)
        if (strcmp(s_ops[i]->name, name) == 0)
            return s_ops[i];
    return NULL;
}

const op_def *op_find_operator(const char *dunder)
{
    for (int i = 0; i < S_COUNT; i++)
        if (s_ops[i]->py_operator && strcmp(s_ops[i]->py_operator, dunder) == 0)
            return s_ops[i];
    return NULL;
}

int op_count(void) { return S_COUNT; }

const op_def *op_nth(int i) { return i >= 0 && i < S_COUNT ? s_ops[i] : NULL; }

int op_index(const op_def *def) { return def->id; }

const op_def *op_at(int index) { return op_by_id(index); }

const char *op_check_local(const op_kernel *k)
{
    static _Thread_local char why[DT_ERRMSG_MAX];
    const op_def *def = k->def;
    if ((def->nin >= 0 && k->nin != def->nin) || k->nin < 1 || (def->nout > 0 && k->nout != def->nout)) {
        snprintf(why, sizeof why, "malformed compute record: %s takes %d inputs and %d outputs, the record names "
                 "%d and %d", def->name, def->nin, def->nout, k->nin, k->nout);
        return why;
    }
    if (!def->infer_local)
        return NULL;
    op_call c;
    memset(&c, 0, sizeof c);
    c.def = def;
    c.nin = k->nin;
    c.attrs = *k->attrs;
    for (int i = 0; i < k->nin; i++) {
        c.in[i].ndim = k->in[i].ndim;
        c.in[i].dtype = k->in[i].dtype;
        memcpy(c.in[i].shape, k->in[i].shape, sizeof c.in[i].shape);
    }
    c.nout = def->nout;
    if (def->infer(&c) != 0) {
        snprintf(why, sizeof why, "malformed compute record: %s", dt_last_error());
        return why;
    }
    for (int o = 0; o < k->nout; o++) {
        const op_arg *want = &c.out[o];
        const op_local *got = &k->out[o];
        if (want->dtype != got->dtype || want->ndim != got->ndim ||
            memcmp(want->shape, got->shape, (size_t)got->ndim * sizeof *got->shape) != 0) {
            snprintf(why, sizeof why, "malformed compute record: output %d of %s does not match its inputs' pieces",
                     o, def->name);
            return why;
        }
    }
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
    for (int i = 0; (def = op_nth(i)) != NULL; i++) {
        h = s_fnv_int(h, op_index(def));
        h = s_fnv(h, def->name, strlen(def->name) + 1); /* the NUL keeps "ab","c" apart from "a","bc" */
        h = s_fnv_int(h, def->nin);
        h = s_fnv_int(h, def->nout);
    }
    return h;
}

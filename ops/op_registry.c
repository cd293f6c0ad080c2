/* op_registry — finding an op by id or by name among the rows of ops/op_table.h. Each family's
 * file defines one op_def per row, named op_def_<name>. */
#include "op_registry.h"

#include <string.h>

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

int op_count(void) { return S_COUNT; }

const op_def *op_nth(int i) { return i >= 0 && i < S_COUNT ? s_ops[i] : NULL; }

int op_index(const op_def *def) { return def->id; }

const op_def *op_at(int index) { return op_by_id(index); }

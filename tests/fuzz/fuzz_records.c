/* libFuzzer target: every record decoder of the schema (mailbox/mb_schema.h) on the input: as
 * mb_body_next hands a record out (a cursor from its first byte to the body's end, not yet
 * checked), and, when the input starts with one well-formed object, on exactly that object. An
 * ASSEMBLE's parts are read element by element as the worker does. A decoder either fills its
 * record or fails with DT_EPROTO; it never crashes or reads past its cursor, one that succeeds
 * reads exactly one object, and a record decodes the same with or without bytes after it (else
 * abort, a finding). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "dt_error.h"
#include "mb_codec.h"
#include "mb_schema.h"

/* rc[k]: what decoder k said on the cursor before; whole: rec is exactly one well-formed object */
#define S_DECODE(NAME, name, ...)                                                                    \
    {                                                                                                \
        mb_##name##_rec r;                                                                           \
        mb_cursor c = *rec;                                                                          \
        int got = mb_read_##name(&c, &r);                                                            \
        if ((got != 0 && got != DT_EPROTO) || c.p < rec->p || c.p > rec->end || mb_decode_##name(rec, &r) != got) \
            abort();                                                                                 \
        if (whole && ((got == 0 && c.p != rec->end) || got != rc[k]))                                \
            abort();                                                                                 \
        rc[k++] = got;                                                                               \
    }

/* The parts, each read in turn, stopping at the first that is not one (the worker refuses the
 * record then); when all are, they fill the list exactly. */
static void s_parts(const mb_list *list)
{
    mb_cursor it = list->items;
    mb_part_rec part;
    uint32_t i = 0;
    while (i < list->n && mb_read_part(&it, &part) == 0)
        i++;
    if (i == list->n && it.p != list->items.end)
        abort();
}

#define S_ONE(...) +1
enum { S_NRECORDS = 0 MB_OP_RECORDS(S_ONE) MB_COMPLETION_RECORDS(S_ONE) MB_PLAIN_RECORDS(S_ONE) };

static void s_all(const mb_cursor *rec, bool whole, int *rc)
{
    int k = 0;
    MB_OP_RECORDS(S_DECODE)
    MB_COMPLETION_RECORDS(S_DECODE)
    MB_PLAIN_RECORDS(S_DECODE)
    int64_t code = 0;
    (void)mb_record_code(rec, &code);
    (void)mb_op_name(code);
    uint64_t u;
    for (uint32_t i = 0; i < 4; i++)
        (void)mb_field_u64(rec, i, &u);
    mb_assemble_rec a;
    if (mb_decode_assemble(rec, &a) == 0)
        s_parts(&a.parts);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int rc[S_NRECORDS];
    mb_body_reader r;
    mb_cursor rec;
    if (mb_body_init(&r, data, size, 1) != 0 || mb_body_next(&r, &rec) != 1)
        return 0;
    s_all(&rec, false, rc);
    size_t used;
    if (mb_validate(data, size, &used) == 0) {
        mb_cursor one = mb_cursor_of(data, used);
        s_all(&one, true, rc);
    }
    return 0;
}

/* libFuzzer target: every record decoder of the schema (mailbox/mb_schema.h) on one msgpack
 * object made of the input, the nested lists (an ASSEMBLE's parts, a COMPUTE's outs) decoded
 * element by element as the worker does. A decoder either fills its record or fails with
 * DT_EPROTO; it never crashes or reads past the object. */
#include <stddef.h>
#include <stdint.h>

#include "mb_codec.h"
#include "mb_schema.h"

#define S_DECODE(NAME, name, ...)                                                                    \
    {                                                                                                \
        mb_##name##_rec r;                                                                           \
        (void)mb_decode_##name(o, &r);                                                               \
    }

static void s_nested(const mb_list *list, int (*decode)(const msgpack_object *, void *), void *rec)
{
    for (uint32_t i = 0; i < list->n; i++)
        (void)decode(&list->items[i], rec);
}

static int s_part(const msgpack_object *o, void *r) { return mb_decode_part(o, r); }
static int s_out(const msgpack_object *o, void *r) { return mb_decode_out(o, r); }

static void s_all(const msgpack_object *o)
{
    MB_OP_RECORDS(S_DECODE)
    MB_COMPLETION_RECORDS(S_DECODE)
    MB_PLAIN_RECORDS(S_DECODE)
    int64_t code;
    (void)mb_record_code(o, &code);
    (void)mb_op_name(code);
    mb_assemble_rec a;
    mb_part_rec part;
    if (mb_decode_assemble(o, &a) == 0)
        s_nested(&a.parts, s_part, &part);
    mb_compute_rec c;
    mb_out_rec out;
    if (mb_decode_compute(o, &c) == 0)
        s_nested(&c.outs, s_out, &out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mb_body_reader r;
    if (mb_body_init(&r, data, size, 1) != 0)
        return 0;
    msgpack_object o;
    if (mb_body_next(&r, &o) == 1)
        s_all(&o);
    mb_body_destroy(&r);
    return 0;
}

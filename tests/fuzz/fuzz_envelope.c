/* libFuzzer target: the envelope of a message, as a receiver meets it. The input is split into a
 * header frame and a body frame (its first byte says where); the header is decoded strictly and
 * the body read object by object with the count the header declares, as mb_recv's callers do.
 * Nothing may crash, hang or leak, whatever the bytes. */
#include <stddef.h>
#include <stdint.h>

#include "mb_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t split = data[0] < size - 1 ? data[0] : size - 1;
    const uint8_t *header = data + 1, *body = data + 1 + split;
    size_t body_size = size - 1 - split;
    mb_header h;
    uint32_t count = 0;
    if (mb_header_decode(header, split, &h) == 0)
        count = h.count;
    else if (body_size > 0)
        count = body[0] % 8;   /* still read the body with some count */
    mb_body_reader r;
    if (mb_body_init(&r, body, body_size, count) == 0) {
        msgpack_object o;
        while (mb_body_next(&r, &o) == 1)
            ;
        mb_body_destroy(&r);
    }
    return 0;
}

/* libFuzzer target: the envelope of a message, as a receiver meets it. The input is split into a
 * header frame and a body frame (its first byte says where); the header is decoded strictly and
 * the body read record by record with the count the header declares, as mb_recv's callers do:
 * some records stepped over by the body reader, others read whole and told with mb_body_read (the
 * input's bits say which). Nothing may crash, hang or leak, whatever the bytes; and each record
 * is handed out from right after the one before, up to the body's end, and only after the one
 * before was found whole (else abort, a finding). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

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
        mb_cursor rec;
        const uint8_t *next = body;
        bool whole = true;
        int rc;
        for (unsigned k = 0; (rc = mb_body_next(&r, &rec)) == 1; k++) {
            if (!whole || rec.p != next || rec.end != body + body_size || rec.p >= rec.end)
                abort();
            mb_cursor c = rec;
            whole = mb_skip(&c) == 0;
            if (whole && (data[0] >> (k % 8)) & 1)
                mb_body_read(&r, &c);
            next = c.p;
        }
        /* the end of the records is reported only after the last byte of the body */
        if (rc == 0 && (!whole || next != body + body_size))
            abort();
    }
    return 0;
}

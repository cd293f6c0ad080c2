/* libFuzzer target: a worker's peer socket, fed what a hostile peer could send: one message as the
 * peer socket receives it (a REGION, or a RELEASE), then op records that use what it stashed. The
 * input is [flags][count][body length][payload length][payload][body][op records]:
 *   flags bit 0   the message is a RELEASE (else a REGION: kind MB_PEER)
 *         bit 1   its routing id disagrees with its header's sender ("w9")
 *         bit 2   it has no payload frame (else one, of the payload's bytes)
 *         bits 4-5 the sender the header names, device 0..3 (device 1 is the rig's lender)
 * and then up to `count` op records run on the worker as fuzz_worker runs them (the payload is
 * their message's frame too). The region's dtype, shape, strides, handle (the rig's segment is
 * descriptor 200, serial 1), transfer and status are the worker's to check against the ASSEMBLE
 * that takes it: nothing may crash, hang or leak, and no byte outside a piece or a segment may be
 * read. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fuzz_rig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 4)
        return 0;
    uint8_t flags = data[0];
    uint32_t count = data[1] % 16;
    size_t left = size - 4;
    size_t blen = data[2] < left ? data[2] : left;
    size_t plen = data[3] < left - blen ? data[3] : left - blen;
    const uint8_t *payload = data + 4, *body = payload + plen, *ops = body + blen;
    size_t ops_size = left - blen - plen;
    uint32_t sender = (flags >> 4) & 3;

    act_worker w;
    fz_worker_open(&w);
    mb_message m;
    mb_header h = {MB_VERSION, (flags & 1) ? MB_RELEASE : MB_PEER, 0, sender, 1};
    fz_message(&m, &h, body, blen, payload, &plen, (flags & 4) ? 0 : 1);
    int n = snprintf((char *)m.routing_id, sizeof m.routing_id, "w%u", (flags & 2) ? 9u : sender);
    m.routing_id_len = (size_t)n;
    act_peer_take(&w, &m);

    mb_message batch;
    h = (mb_header){MB_VERSION, MB_OPS, 0, MB_SENDER_CONTROLLER, count};
    fz_message(&batch, &h, NULL, 0, payload, &plen, 1);
    fz_run(&w, ops, ops_size, count, &batch);
    mb_message_close(&batch);
    fz_worker_close(&w);
    return 0;
}

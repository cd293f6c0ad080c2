/* libFuzzer target: a device actor's record runner, fed what a hostile controller could send. The
 * input is [count][payload length][payload bytes][body]: up to `count` op records read from the
 * body run, in order, on one fresh worker (fuzz_rig.h: a worker process on the CPU backend, its
 * allocations bounded), with the payload as the message's one payload frame (LOAD and DEFINE read
 * it). SENDs to devices 0..3 come back to the worker as REGIONs, which later ASSEMBLEs take (a SEND
 * to another device is stepped over). Every id, shape, offset, count and frame index is the
 * worker's to check: nothing may crash, hang or leak. */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_rig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint32_t count = data[0] % 16;
    size_t plen = data[1] < size - 2 ? data[1] : size - 2;
    const uint8_t *payload = data + 2, *body = data + 2 + plen;
    size_t body_size = size - 2 - plen;

    act_worker w;
    fz_worker_open(&w);
    mb_message m;
    mb_header h = {MB_VERSION, MB_OPS, 0, MB_SENDER_CONTROLLER, count};
    fz_message(&m, &h, NULL, 0, payload, &plen, 1);
    fz_run(&w, body, body_size, count, &m);
    mb_message_close(&m);
    fz_worker_close(&w);
    return 0;
}

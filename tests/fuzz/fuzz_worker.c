/* libFuzzer target: a device actor's record runner, fed what a hostile controller could send. The
 * input is [count][payload length][payload bytes][body]: up to `count` op records read from the
 * body run, in order, on one fresh worker (the CPU backend, with allocations above 16 MiB
 * refused so a record cannot make the fuzzer run out of memory), with the payload as the message's
 * one payload frame (LOAD and DEFINE read it). SEND and ASSEMBLE, which need peers on sockets,
 * are decoded but not run. Every id, shape, count and frame index is the worker's to check:
 * nothing may crash, hang or leak. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "act_worker.h"
#include "mb_codec.h"

#define S_MAX_ALLOC (16u << 20)

static const op_backend *s_cpu;
static op_backend s_limited;

static void *s_alloc(size_t size) { return size > S_MAX_ALLOC ? NULL : s_cpu->alloc(size); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    if (!s_cpu) {
        s_cpu = op_backend_find("cpu");
        s_limited = *s_cpu;
        s_limited.alloc = s_alloc;
    }
    uint32_t count = data[0] % 16;
    size_t plen = data[1] < size - 2 ? data[1] : size - 2;
    const uint8_t *payload = data + 2, *body = data + 2 + plen;
    size_t body_size = size - 2 - plen;

    act_worker w;
    act_worker_init(&w, 0, &s_limited, "ipc://fuzz-harness"); /* as a worker process: nothing is trusted */
    zmq_msg_t frame;
    zmq_msg_init_size(&frame, plen);
    memcpy(zmq_msg_data(&frame), payload, plen);
    mb_message m = {.npayloads = 1, .payloads = &frame};

    mb_body_reader r;
    if (mb_body_init(&r, body, body_size, count) == 0) {
        mb_cursor rec;
        while (mb_body_next(&r, &rec) == 1) {
            int64_t code;
            if (mb_record_code(&rec, &code) == 0 && (code == MB_OP_SEND || code == MB_OP_ASSEMBLE))
                continue;
            (void)act_worker_run_record(&w, &rec, &m);
            act_worker_drop_reply(&w);
            mb_body_read(&r, &rec); /* as the worker's batch loop: a record read whole is not read again */
        }
    }
    zmq_msg_close(&frame);
    act_worker_fini(&w);
    return 0;
}

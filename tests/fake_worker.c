/* fake_worker — a stand-in for dtorch-worker that connects like it and says a wrong hello, for
 * the tests of the controller's refusal, or lends forged handles, for the tests of the controller's
 * checks. DTORCH_FAKE_HELLO picks what is wrong: "protocol" (the next protocol version),
 * "registry" (another op registry), "type" (another device type) or "garbage" (a body that is no
 * HELLO record); it then waits to be killed. "lend-outside" and "lend-foreign" say a true hello and
 * answer every FETCH with a VALUE by handle: past the end of a true segment of its own, or naming
 * a descriptor that is no segment (/dev/null); SYNCs are answered as a worker does. */
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_dtype.h"
#include "dt_layout.h"
#include "dt_shm.h"
#include "mb_rid.h"
#include "mb_schema.h"
#include "mb_socket.h"
#include "op_registry.h"

/* Answers the controller's batches until it says bye, lending each fetched value by a forged
 * handle (how: "lend-outside" or "lend-foreign"). */
static void s_lend_forged(zsock_t *sock, int64_t device, const char *how)
{
    dt_shm_seg *seg = dt_shm_seg_new(1);
    int foreign = open("/dev/null", O_RDONLY);
    uint64_t seq = 1;
    mb_message m;
    while (seg && foreign >= 0 && mb_recv(sock, false, false, &m) == 0) {
        if (m.header.kind == MB_BYE) {
            mb_message_close(&m);
            break;
        }
        if (m.header.kind != MB_OPS) {
            mb_message_close(&m);
            continue;
        }
        mb_writer reply = {0};
        uint32_t nreply = 1;
        mb_body_reader r;
        mb_cursor rec;
        int64_t code;
        if (mb_body_init(&r, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count) == 0) {
            while (mb_body_next(&r, &rec) == 1 && mb_record_code(&rec, &code) == 0) {
                mb_fetch_rec fetch;
                mb_sync_rec sync;
                if (code == MB_OP_FETCH && mb_decode_fetch(&rec, &fetch) == 0) {
                    /* the tests fetch 4 float32 */
                    bool outside = strcmp(how, "lend-outside") == 0;
                    mb_encode_value(&reply, fetch.future, fetch.piece, DT_FLOAT32, 1, (const int64_t[]){4}, -1,
                                    outside ? seg->fd : foreign, seg->serial, outside ? seg->size - 8 : 0, 7);
                    nreply++;
                } else if (code == MB_OP_SYNC && mb_decode_sync(&rec, &sync) == 0) {
                    mb_encode_value(&reply, sync.future, sync.piece, DT_FLOAT32, 0, NULL, -1, -1, 0, 0, 0);
                    nreply++;
                }
            }
        }
        mb_encode_credit(&reply, m.header.count);
        mb_message_close(&m);
        mb_header h = {MB_VERSION, MB_COMPLETIONS, seq++, (uint32_t)device, nreply};
        size_t size = reply.size;
        mb_send(sock, NULL, 0, &h, (mb_buf){mb_w_release(&reply), size, mb_buf_free, NULL}, NULL, 0);
    }
    if (foreign >= 0)
        close(foreign);
    dt_shm_seg_free(seg);
    dt_shm_trim();
}

/* Leaves when the controller's pipe ends, as dtorch-worker does. */
static void *s_watch(void *arg)
{
    struct pollfd p = {(int)(intptr_t)arg, POLLIN, 0};
    char byte;
    while (poll(&p, 1, -1) < 0 || read(p.fd, &byte, 1) > 0)
        ;
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *how = getenv("DTORCH_FAKE_HELLO");
    int64_t device = -1;
    int run_fd = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--connect") == 0)
            endpoint = argv[i + 1];
        else if (strcmp(argv[i], "--device") == 0)
            device = strtoll(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--run-fd") == 0)
            run_fd = atoi(argv[i + 1]);
    }
    /* the run's secret, which its routing id carries: without it nothing it says is heard */
    char token[MB_TOKEN_CHARS + 1] = "";
    pthread_t watcher;
    if (!endpoint || device < 0 || !how || run_fd < 0 || read(run_fd, token, MB_TOKEN_CHARS) != MB_TOKEN_CHARS ||
        pthread_create(&watcher, NULL, s_watch, (void *)(intptr_t)run_fd) != 0)
        return 2;
    zsys_handler_set(NULL);
    char rid[MB_RID_MAX];
    mb_rid_format(rid, 'd', device, token);
    zsock_t *sock = mb_socket_new(MB_DEALER, endpoint, false, rid);
    if (!sock)
        return 1;
    uint64_t protocol = MB_PROTOCOL, registry = op_registry_hash();
    const char *type = "cpu";
    if (strcmp(how, "protocol") == 0)
        protocol++;
    else if (strcmp(how, "registry") == 0)
        registry ^= 0x5a5a5a5a;
    else if (strcmp(how, "type") == 0)
        type = "tpu";
    mb_writer body = {0};
    if (strcmp(how, "garbage") == 0) {
        mb_w_array(&body, 1);
        mb_w_str(&body, "hello", 5);
    } else {
        mb_encode_hello(&body, device, (int64_t)getpid(), protocol, registry, type, "localhost", "");
    }
    mb_header h = {MB_VERSION, MB_HELLO, 0, (uint32_t)device, 1};
    size_t size = body.size;
    mb_send(sock, NULL, 0, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, NULL, 0);
    if (strncmp(how, "lend-", 5) == 0)
        s_lend_forged(sock, device, how);
    else
        for (int i = 0; i < 300; i++)
            usleep(100000);
    mb_socket_destroy(&sock);
    return 0;
}

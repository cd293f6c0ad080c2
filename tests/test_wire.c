/* Records whose numbers name a range, sent by a hostile controller to a worker: offsets and sizes
 * near INT64_MAX, where a check written as `offset + size <= piece` wraps and passes. The test is
 * the worker's controller and its peer device 1: it runs act_worker_run on an ipc endpoint of its
 * own (a worker process in all but the process, so nothing it is sent is trusted) and binds device
 * 1's peer socket, where the worker's SENDs arrive. Every such record must end in an error the
 * controller hears (a poisoned piece, a REGION that says it failed), never a read or write outside
 * a piece (ASan runs this too) nor bytes of the worker's heap sent to a peer; and the worker keeps
 * working after. Two cases the peer fuzz target found sit with them: an ASSEMBLE whose local source
 * is of another dtype, and a region that failed with an empty message. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_error.h"
#include "mb_schema.h"
#include "mb_socket.h"
#include "op_registry.h"

#define S_RECV_MS 5000
#define S_NEAR_MAX (INT64_MAX - 1) /* an offset whose sum with any size >= 2 wraps */

typedef struct {
    char endpoint[128];
    atomic_bool stop;
    int rc;
    pthread_t thread;
    zsock_t *ctl;       /* the worker's controller */
    zsock_t *peer1;     /* device 1's peer socket: the worker's SENDs to device 1 arrive here */
    zsock_t *as1;       /* a DEALER to the worker's peer socket as device 1 ("w1") */
    uint64_t seq, peer_seq;
} s_rig;

static bool s_stopped(void *arg) { return atomic_load(&((s_rig *)arg)->stop); }

static void *s_worker_main(void *arg)
{
    s_rig *r = arg;
    r->rc = act_worker_run(r->endpoint, 0, "cpu", s_stopped, r);
    return NULL;
}

/* The next message on sock other than the worker's heartbeats. */
static void s_recv(zsock_t *sock, mb_message *m)
{
    zsock_set_rcvtimeo(sock, S_RECV_MS);
    for (;;) {
        cr_assert_eq(mb_recv(sock, true, false, m), 0, "%s", dt_last_error());
        if (m->header.kind != MB_HEARTBEAT)
            return;
        mb_message_close(m);
    }
}

static void s_start(s_rig *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->endpoint, sizeof r->endpoint, "ipc:///tmp/dtorch-wiretest-%d.ipc", (int)getpid());
    char endpoint[200];
    r->ctl = mb_socket_new(MB_ROUTER, r->endpoint, true, NULL);
    snprintf(endpoint, sizeof endpoint, "%s-peer-1", r->endpoint);
    r->peer1 = mb_socket_new(MB_ROUTER, endpoint, true, NULL);
    snprintf(endpoint, sizeof endpoint, "%s-peer-0", r->endpoint);
    r->as1 = mb_socket_new(MB_DEALER, endpoint, false, "w1");
    cr_assert(r->ctl && r->peer1 && r->as1, "%s", dt_last_error());
    cr_assert_eq(pthread_create(&r->thread, NULL, s_worker_main, r), 0);
    mb_message hello;
    s_recv(r->ctl, &hello);
    cr_assert_eq(hello.header.kind, MB_HELLO);
    mb_message_close(&hello);
}

static void s_stop(s_rig *r)
{
    mb_header h = {MB_VERSION, MB_BYE, r->seq++, MB_SENDER_CONTROLLER, 0};
    mb_send(r->ctl, "d0", 2, &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
    pthread_join(r->thread, NULL);
    cr_expect_eq(r->rc, 0);
    mb_socket_destroy(&r->as1);
    mb_socket_destroy(&r->peer1);
    mb_socket_destroy(&r->ctl);
    char path[200];
    snprintf(path, sizeof path, "%s-peer-1", r->endpoint + 6);
    unlink(path);
    unlink(r->endpoint + 6);
}

/* Sends the records of body (n of them, with one payload frame when payload is not NULL). */
static void s_ops(s_rig *r, mb_writer *body, uint32_t n, const void *payload, size_t size)
{
    mb_header h = {MB_VERSION, MB_OPS, r->seq++, MB_SENDER_CONTROLLER, n};
    size_t bytes = body->size;
    mb_buf frame = {NULL, 0, NULL, NULL};
    if (payload) {
        frame = (mb_buf){malloc(size), size, mb_buf_free, NULL};
        memcpy(frame.data, payload, size);
    }
    cr_assert_eq(mb_send(r->ctl, "d0", 2, &h, (mb_buf){mb_w_release(body), bytes, mb_buf_free, NULL}, &frame,
                         payload ? 1 : 0),
                 0);
}

/* The completions of the last batch: the one fetch's ERROR message (NULL for a VALUE, whose bytes
 * go to value, size of them, unless value is NULL); with `fetched` false, no answer but credit. */
static char *s_completions(s_rig *r, bool fetched, void *value, size_t size)
{
    mb_message m;
    s_recv(r->ctl, &m);
    cr_assert_eq(m.header.kind, MB_COMPLETIONS);
    mb_body_reader br;
    cr_assert_eq(mb_body_init(&br, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count), 0);
    mb_cursor rec;
    char *error = NULL;
    bool answered = false;
    while (mb_body_next(&br, &rec) == 1) {
        int64_t code;
        cr_assert_eq(mb_record_code(&rec, &code), 0);
        if (code == MB_C_ERROR) {
            mb_error_rec e;
            cr_assert_eq(mb_decode_error(&rec, &e), 0);
            error = strndup(e.message.ptr, e.message.len);
            answered = true;
        } else if (code == MB_C_VALUE) {
            mb_value_rec v;
            cr_assert_eq(mb_decode_value(&rec, &v), 0);
            cr_assert(v.frame >= 0 && v.frame < m.npayloads, "the value came as a frame");
            if (value) {
                cr_assert_eq(zmq_msg_size(&m.payloads[v.frame]), size);
                memcpy(value, zmq_msg_data(&m.payloads[v.frame]), size);
            }
            answered = true;
        }
    }
    mb_message_close(&m);
    cr_assert_eq(answered, fetched, "the fetch was answered, and nothing else");
    return error;
}

static char *s_outcome(s_rig *r, void *value, size_t size) { return s_completions(r, true, value, size); }

/* The completions of a batch that fetched nothing: its credit. */
static void s_credit(s_rig *r) { cr_assert_null(s_completions(r, false, NULL, 0)); }

static void s_expect_error(s_rig *r, const char *what, const char *want)
{
    char *error = s_outcome(r, NULL, 0);
    cr_assert_not_null(error, "%s: refused", what);
    cr_expect(strstr(error, want) != NULL, "%s: %s", what, error);
    free(error);
}

static const int64_t S_PIECE[2] = {2, 3};
static const float S_VALUES[6] = {1, 2, 3, 4, 5, 6};

/* Piece 1: S_VALUES as a 2 x 3 float32 piece. */
static void s_load_piece(s_rig *r)
{
    mb_writer body = {0};
    mb_encode_load(&body, 1, DT_FLOAT32, 2, S_PIECE, 0);
    s_ops(r, &body, 1, S_VALUES, sizeof S_VALUES);
    s_credit(r);
}

/* The one REGION message the worker sent device 1's peer socket. */
static void s_region_at_peer1(s_rig *r, mb_region_rec *region, int *npayloads, float *bytes, size_t size)
{
    mb_message m;
    s_recv(r->peer1, &m);
    cr_assert_eq(m.header.kind, MB_PEER);
    mb_body_reader br;
    mb_cursor rec;
    cr_assert_eq(mb_body_init(&br, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count), 0);
    cr_assert_eq(mb_body_next(&br, &rec), 1);
    cr_assert_eq(mb_decode_region(&rec, region), 0);
    region->error = (mb_str){NULL, 0}; /* inside the message, which goes now */
    *npayloads = m.npayloads;
    if (bytes && m.npayloads == 1 && zmq_msg_size(&m.payloads[0]) == size)
        memcpy(bytes, zmq_msg_data(&m.payloads[0]), size);
    mb_message_close(&m);
}

Test(wire, send_outside_the_piece_fails, .timeout = 60)
{
    s_rig r;
    s_start(&r);
    s_load_piece(&r);
    /* regions of the 2 x 3 piece whose offset + size wraps past INT64_MAX (or that are simply out) */
    const struct {
        int64_t offset[2], shape[2];
    } bad[] = {
        {{0, S_NEAR_MAX}, {2, 2}},        /* the sum wraps negative: once read as 8 bytes before the piece */
        {{S_NEAR_MAX, 0}, {2, 3}},
        {{INT64_MAX, INT64_MAX}, {1, 1}},
        {{1, 1}, {2, 2}},                 /* plainly outside */
        {{-1, 0}, {1, 3}},
    };
    int n = (int)(sizeof bad / sizeof bad[0]);
    for (int k = 0; k < n; k++) {
        mb_writer body = {0};
        mb_encode_send(&body, 1, 100 + (uint64_t)k, 1, 2, bad[k].offset, 2, bad[k].shape);
        s_ops(&r, &body, 1, NULL, 0);
        s_credit(&r);
        mb_region_rec region;
        int npayloads;
        s_region_at_peer1(&r, &region, &npayloads, NULL, 0);
        cr_expect_eq(region.transfer, 100 + (uint64_t)k);
        cr_expect_neq(region.status, 0, "case %d: the region says it failed", k);
        cr_expect_eq(npayloads, 0, "case %d: no bytes travel", k);
    }
    /* a true region after all that: row 1, columns 1..2 */
    mb_writer body = {0};
    mb_encode_send(&body, 1, 200, 1, 2, (const int64_t[]){1, 1}, 2, (const int64_t[]){1, 2});
    s_ops(&r, &body, 1, NULL, 0);
    s_credit(&r);
    mb_region_rec region;
    int npayloads;
    float got[2] = {0, 0};
    s_region_at_peer1(&r, &region, &npayloads, got, sizeof got);
    cr_expect_eq(region.status, 0);
    cr_expect_eq(npayloads, 1);
    cr_expect(got[0] == 5 && got[1] == 6, "row 1, columns 1..2: %g %g", got[0], got[1]);
    s_stop(&r);
}

/* An ASSEMBLE of piece `id` (2 x 3 float32) from one COPY part, then a FETCH of it. */
static void s_assemble(s_rig *r, uint64_t id, int64_t from, uint64_t transfer, const int64_t *src_offset,
                       const int64_t *dst_offset, const int64_t *shape)
{
    mb_writer body = {0};
    mb_encode_assemble(&body, id, DT_FLOAT32, 2, S_PIECE, 1, false, 1);
    mb_encode_part(&body, MB_PART_COPY, DT_REDUCE_SUM, from, transfer, 2, src_offset, 2, dst_offset, 2, shape, 1);
    mb_encode_fetch(&body, id, id, 0);
    s_ops(r, &body, 2, NULL, 0);
}

Test(wire, assemble_outside_a_piece_fails, .timeout = 60)
{
    s_rig r;
    s_start(&r);
    s_load_piece(&r);
    const int64_t zero[2] = {0, 0}, row[2] = {1, 3};
    /* a part read outside the local source piece */
    const int64_t src_bad[][2] = {{S_NEAR_MAX, 0}, {0, S_NEAR_MAX}, {INT64_MAX, INT64_MAX}, {2, 0}, {0, -1}};
    for (int k = 0; k < 5; k++) {
        s_assemble(&r, 10 + (uint64_t)k, 0, 0, src_bad[k], zero, row);
        s_expect_error(&r, "source offset", "a region outside the source piece");
    }
    /* a part of the float32 source read as int64: twice its bytes */
    mb_writer wide = {0};
    mb_encode_assemble(&wide, 15, DT_INT64, 2, S_PIECE, 1, false, 1);
    mb_encode_part(&wide, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, zero, 2, zero, 2, S_PIECE, 1);
    mb_encode_fetch(&wide, 15, 15, 0);
    s_ops(&r, &wide, 2, NULL, 0);
    s_expect_error(&r, "source dtype", "the source piece is float32, not int64");
    /* a part written outside the new piece, from the local source and from a peer's region */
    const int64_t dst_bad[][2] = {{S_NEAR_MAX, 0}, {0, S_NEAR_MAX}, {1, 1}, {-1, 0}};
    for (int k = 0; k < 4; k++) {
        s_assemble(&r, 20 + (uint64_t)k, 0, 0, zero, dst_bad[k], row);
        s_expect_error(&r, "destination offset", "a region outside the piece");
    }
    for (int k = 0; k < 4; k++) {
        uint64_t transfer = 30 + (uint64_t)k;
        mb_writer body = {0};
        mb_encode_region(&body, transfer, 0, DT_FLOAT32, 2, row, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
        mb_header h = {MB_VERSION, MB_PEER, r.peer_seq++, 1, 1};
        size_t size = body.size;
        mb_buf frame = {malloc(sizeof S_VALUES / 2), sizeof S_VALUES / 2, mb_buf_free, NULL};
        memcpy(frame.data, S_VALUES, frame.size);
        cr_assert_eq(mb_send(r.as1, NULL, 0, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, &frame, 1),
                     0);
        s_assemble(&r, transfer, 1, transfer, zero, dst_bad[k], row);
        s_expect_error(&r, "destination offset of a received region", "a region outside the piece");
    }
    /* a region that says it failed, with an empty message (which once read as no failure at all) */
    mb_writer failed = {0};
    mb_encode_region(&failed, 35, DT_EKERNEL, DT_FLOAT32, 2, row, "", 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_header fh = {MB_VERSION, MB_PEER, r.peer_seq++, 1, 1};
    size_t fsize = failed.size;
    cr_assert_eq(mb_send(r.as1, NULL, 0, &fh, (mb_buf){mb_w_release(&failed), fsize, mb_buf_free, NULL}, NULL, 0), 0);
    s_assemble(&r, 35, 1, 35, zero, zero, row);
    s_expect_error(&r, "a failed region without a message", "a peer could not send its region");
    /* a true assembly after all that: the rows swapped, one from the local piece, one from device 1 */
    mb_writer body = {0};
    mb_encode_region(&body, 40, 0, DT_FLOAT32, 2, row, NULL, 0, 0, 0, NULL, -1, 0, 0, 0);
    mb_header h = {MB_VERSION, MB_PEER, r.peer_seq++, 1, 1};
    size_t size = body.size;
    const float from1[3] = {7, 8, 9};
    mb_buf frame = {malloc(sizeof from1), sizeof from1, mb_buf_free, NULL};
    memcpy(frame.data, from1, sizeof from1);
    cr_assert_eq(mb_send(r.as1, NULL, 0, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, &frame, 1), 0);
    body = (mb_writer){0};
    mb_encode_assemble(&body, 41, DT_FLOAT32, 2, S_PIECE, 1, false, 2);
    mb_encode_part(&body, MB_PART_COPY, DT_REDUCE_SUM, 0, 0, 2, (const int64_t[]){1, 0}, 2, zero, 2, row, 1);
    mb_encode_part(&body, MB_PART_COPY, DT_REDUCE_SUM, 1, 40, 2, zero, 2, (const int64_t[]){1, 0}, 2, row, 1);
    mb_encode_fetch(&body, 41, 41, 0);
    s_ops(&r, &body, 2, NULL, 0);
    float got[6];
    char *error = s_outcome(&r, got, sizeof got);
    cr_assert_null(error, "%s", error);
    const float want[6] = {4, 5, 6, 7, 8, 9};
    cr_expect_arr_eq(got, want, sizeof want);
    s_stop(&r);
}

/* Records that name a range some other way: RANDOM's place in its global tensor, ARANGE's first
 * element, SEND's device, REPLAY's blocks of fresh ids. */
Test(wire, other_ranges_are_checked, .timeout = 60)
{
    s_rig r;
    s_start(&r);
    const int64_t shape[2] = {2, 3}, global[2] = {4, 3};
    const int64_t offsets[][2] = {{S_NEAR_MAX, 0}, {3, 0}, {0, 1}, {-1, 0}};
    for (int k = 0; k < 4; k++) {
        mb_writer body = {0};
        uint64_t id = 50 + (uint64_t)k;
        mb_encode_random(&body, id, DT_FLOAT32, 2, shape, 2, offsets[k], 2, global, 7, 0, false);
        mb_encode_fetch(&body, id, id, 0);
        s_ops(&r, &body, 2, NULL, 0);
        s_expect_error(&r, "random offset", "outside its global shape");
    }
    const dt_scalar zero = {.is_int = true, .i = 0}, one = {.is_int = true, .i = 1};
    const int64_t firsts[] = {S_NEAR_MAX, INT64_MAX - 2, -1};
    for (int k = 0; k < 3; k++) {
        mb_writer body = {0};
        uint64_t id = 60 + (uint64_t)k;
        mb_encode_arange(&body, id, DT_INT64, 1, (const int64_t[]){3}, firsts[k], zero, one);
        mb_encode_fetch(&body, id, id, 0);
        s_ops(&r, &body, 2, NULL, 0);
        s_expect_error(&r, "arange first", "first element");
    }
    /* a true random and arange after all that: arange's first element counts from its start */
    mb_writer body = {0};
    mb_encode_arange(&body, 70, DT_INT64, 1, (const int64_t[]){3}, 4, (dt_scalar){.is_int = true, .i = 10}, one);
    mb_encode_fetch(&body, 70, 70, 0);
    s_ops(&r, &body, 2, NULL, 0);
    int64_t got[3];
    char *error = s_outcome(&r, got, sizeof got);
    cr_assert_null(error, "%s", error);
    cr_expect(got[0] == 14 && got[1] == 15 && got[2] == 16, "%" PRId64 " %" PRId64 " %" PRId64, got[0], got[1],
              got[2]);
    body = (mb_writer){0};
    mb_encode_random(&body, 71, DT_FLOAT32, 2, shape, 2, (const int64_t[]){2, 0}, 2, global, 7, 0, false);
    mb_encode_fetch(&body, 71, 71, 0);
    s_ops(&r, &body, 2, NULL, 0);
    float values[6];
    error = s_outcome(&r, values, sizeof values);
    cr_assert_null(error, "%s", error);
    for (int i = 0; i < 6; i++)
        cr_expect(values[i] >= 0 && values[i] < 1, "uniform in [0, 1): %g", values[i]);

    /* a SEND to a device no id names: a malformed record, dropped, and nothing sent */
    s_load_piece(&r);
    const int64_t nobody[] = {-1, DT_MAX_DEVICE_ID + 1, INT64_MAX};
    for (int k = 0; k < 3; k++) {
        body = (mb_writer){0};
        mb_encode_send(&body, 1, 80, nobody[k], 2, (const int64_t[]){0, 0}, 2, S_PIECE);
        mb_encode_fetch(&body, 1, 1, 0);
        s_ops(&r, &body, 2, NULL, 0);
        float piece[6];
        error = s_outcome(&r, piece, sizeof piece);
        cr_assert_null(error, "%s", error);
    }
    s_stop(&r);
}

/* A kept sequence (c = a + a, into an id of its block) replayed with a block of fresh ids that
 * would run past the last id: refused, no output made; a block that fits runs. */
Test(wire, replay_blocks_are_checked, .timeout = 60)
{
    s_rig r;
    s_start(&r);
    s_load_piece(&r);
    mb_writer recs = {0};
    const uint64_t ins[2] = {5, 5};
    mb_encode_compute(&recs, op_index(op_find("add")), 2, ins, 0, NULL, 0, NULL, NULL, 0, NULL, 0, NULL, 1);
    mb_encode_out(&recs, 11, DT_FLOAT32, 2, S_PIECE);
    mb_writer body = {0};
    mb_encode_define(&body, 1, "double", 10, 20, 1, 3, 0, 2, 1, (const uint64_t[]){5}, 1, (const uint64_t[]){11}, 1, 0);
    s_ops(&r, &body, 1, recs.data, recs.size);
    free(mb_w_release(&recs));
    s_credit(&r);
    const struct {
        uint64_t tensor_base, transfer_base, stream_base;
    } bad[] = {
        {UINT64_MAX - 5, 1, 0}, /* ids 10..19 at UINT64_MAX - 5 ...: past the last id */
        {1000, UINT64_MAX - 1, 0},
        {1000, 1, UINT64_MAX},
    };
    for (int k = 0; k < 3; k++) {
        body = (mb_writer){0};
        mb_encode_replay(&body, 1, 1, (const uint64_t[]){1}, bad[k].tensor_base, bad[k].transfer_base, 9,
                         bad[k].stream_base);
        uint64_t out = bad[k].tensor_base + 1;
        mb_encode_fetch(&body, out, 90, 0);
        s_ops(&r, &body, 2, NULL, 0);
        s_expect_error(&r, "replay block", "has no tensor");
    }
    /* a block at 0, which is never an id: its output would have been 1, the loaded piece */
    body = (mb_writer){0};
    mb_encode_replay(&body, 1, 1, (const uint64_t[]){1}, 0, 1, 9, 0);
    mb_encode_fetch(&body, 1, 91, 0);
    s_ops(&r, &body, 2, NULL, 0);
    float got[6];
    char *error = s_outcome(&r, got, sizeof got);
    cr_assert_null(error, "%s", error);
    cr_expect_arr_eq(got, S_VALUES, sizeof S_VALUES, "piece 1 is as it was loaded");
    body = (mb_writer){0};
    mb_encode_replay(&body, 1, 1, (const uint64_t[]){1}, 1000, 1, 9, 0);
    mb_encode_fetch(&body, 1001, 92, 0);
    s_ops(&r, &body, 2, NULL, 0);
    error = s_outcome(&r, got, sizeof got);
    cr_assert_null(error, "%s", error);
    for (int i = 0; i < 6; i++)
        cr_expect_eq(got[i], 2 * S_VALUES[i]);
    s_stop(&r);
}

/* A device's captured sequences, driven record by record: a real worker thread talks to this
 * test's ROUTER as if it were the controller. A kept sequence replays on new inputs into new
 * ids, keeps its constants past the controller's FREE until it is dropped, and frees what it made
 * and nobody holds; hostile DEFINE and REPLAY records (garbage bytes, wrong counts, records that
 * need the controller, nested captures, bad ids) never crash the worker, and a sequence that
 * cannot run poisons its outputs with why. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "act_worker.h"
#include "dt_error.h"
#include "mb_schema.h"
#include "op_registry.h"

static zsock_t *s_router;
static pthread_t s_thread;
static atomic_bool s_stop;
static char s_endpoint[64];
static uint64_t s_seq;

static bool s_should_stop(void *arg) { return atomic_load(&s_stop); }

static void *s_worker_main(void *arg)
{
    act_worker_run(s_endpoint, 0, "cpu", s_should_stop, NULL);
    return NULL;
}

static void s_start(void)
{
    static int n;
    snprintf(s_endpoint, sizeof s_endpoint, "inproc://test-replay-%d", n++);
    s_router = mb_socket_new(MB_ROUTER, s_endpoint, true, NULL);
    cr_assert_not_null(s_router, "%s", dt_last_error());
    atomic_store(&s_stop, false);
    s_seq = 0;
    cr_assert_eq(pthread_create(&s_thread, NULL, s_worker_main, NULL), 0);
    mb_message m;
    cr_assert_eq(mb_recv(s_router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.header.kind, MB_HELLO);
    mb_message_close(&m);
}

static void s_stop_worker(void)
{
    atomic_store(&s_stop, true);
    pthread_join(s_thread, NULL);
    mb_socket_destroy(&s_router);
}

/* A batch being written: records, payload frames. */
typedef struct {
    mb_writer w;
    uint32_t n;
    mb_buf payloads[16];
    int npayloads;
} s_batch;

static mb_writer *s_rec(s_batch *b)
{
    b->n++;
    return &b->w;
}

static int s_payload(s_batch *b, const void *data, size_t size)
{
    void *copy = malloc(size ? size : 1);
    memcpy(copy, data, size);
    b->payloads[b->npayloads] = (mb_buf){copy, size, mb_buf_free, NULL};
    return b->npayloads++;
}

/* Sends the batch and waits for its completions; a VALUE of a fetch lands in value (floats),
 * an ERROR's message in error. */
static void s_run(s_batch *b, float *value, size_t nvalue, char *error, size_t nerror)
{
    mb_header h = {MB_VERSION, MB_OPS, s_seq++, MB_SENDER_CONTROLLER, b->n};
    size_t size = b->w.size;
    mb_buf body = {mb_w_release(&b->w), size, mb_buf_free, NULL};
    cr_assert_eq(mb_send(s_router, "d0", 2, &h, body, b->payloads, b->npayloads), 0);
    memset(b, 0, sizeof *b);
    mb_message m;
    cr_assert_eq(mb_recv(s_router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.header.kind, MB_COMPLETIONS, "the worker still answers");
    mb_body_reader r;
    cr_assert_eq(mb_body_init(&r, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count), 0);
    mb_cursor rec;
    while (mb_body_next(&r, &rec) == 1) {
        int64_t code;
        cr_assert_eq(mb_record_code(&rec, &code), 0);
        if (code == MB_C_VALUE && value) {
            mb_value_rec v;
            cr_assert_eq(mb_decode_value(&rec, &v), 0);
            cr_assert(v.frame >= 0 && v.frame < m.npayloads);
            size_t got = zmq_msg_size(&m.payloads[v.frame]);
            cr_assert_eq(got, nvalue * sizeof *value);
            memcpy(value, zmq_msg_data(&m.payloads[v.frame]), got);
        } else if (code == MB_C_ERROR) {
            mb_error_rec e;
            cr_assert_eq(mb_decode_error(&rec, &e), 0);
            cr_assert_not_null(error, "unexpected error: %.*s", (int)e.message.len, e.message.ptr);
            snprintf(error, nerror, "%.*s", (int)e.message.len, e.message.ptr);
        }
    }
    mb_message_close(&m);
}

static const int64_t S_SHAPE[] = {4};

static void s_fill(s_batch *b, uint64_t id, double v)
{
    mb_encode_fill(s_rec(b), id, DT_FLOAT32, 1, S_SHAPE, (dt_scalar){.is_int = false, .f = v});
}

static void s_compute(mb_writer *w, const char *op, uint64_t a, uint64_t b, uint64_t out)
{
    const uint64_t ins[2] = {a, b};
    mb_encode_compute(w, op_index(op_find(op)), 2, ins, 0, NULL, 0, NULL, NULL, 0, NULL, 0, NULL, 1);
    mb_encode_out(w, out, DT_FLOAT32, 1, S_SHAPE);
}

static void s_fetch(s_batch *b, uint64_t id, uint64_t future) { mb_encode_fetch(s_rec(b), id, future, 0); }

/* A DEFINE of graph with records rec (n of them, as written), ids [10, 20), input 5, output 11. */
static void s_define(s_batch *b, uint64_t graph, mb_writer *records, int64_t n, uint64_t lo)
{
    int frame = s_payload(b, records->data, records->size);
    mb_encode_define(s_rec(b), graph, "step", lo, 20, 1, 1, 0, 0, 1, (const uint64_t[]){5}, 1,
                     (const uint64_t[]){11}, n, frame);
    free(mb_w_release(records));
}

/* (x + c) * (x + c), c constant 1; the intermediate freed inside */
static void s_square_records(mb_writer *w)
{
    s_compute(w, "add", 5, 1, 10);
    s_compute(w, "mul", 10, 10, 11);
    mb_encode_free(w, 10);
    mb_encode_free(w, 1); /* a constant freed inside: must not free it for later replays */
}

Test(replay, runs_on_new_inputs_and_keeps_constants, .timeout = 120)
{
    s_start();
    s_batch b = {0};
    mb_writer recs = {0};
    s_fill(&b, 1, 2.0); /* the constant */
    s_square_records(&recs);
    s_define(&b, 7, &recs, 4, 10);
    s_fill(&b, 100, 3.0);
    mb_encode_replay(s_rec(&b), 7, 1, (const uint64_t[]){100}, 1000, 1, 0, 0);
    s_fetch(&b, 1001, 1);
    float v[4];
    s_run(&b, v, 4, NULL, 0);
    cr_expect(v[0] == 25.0f && v[3] == 25.0f, "(3 + 2)^2, got %g", v[0]);

    /* the controller frees the constant: the sequence still has it */
    mb_encode_free(s_rec(&b), 1);
    s_fill(&b, 101, -1.0);
    mb_encode_replay(s_rec(&b), 7, 1, (const uint64_t[]){101}, 2000, 1, 0, 0);
    s_fetch(&b, 2001, 2);
    s_fetch(&b, 2000, 3); /* the intermediate of that replay is gone */
    char err[512] = "";
    s_run(&b, v, 4, err, sizeof err);
    cr_expect(v[0] == 1.0f, "(-1 + 2)^2, got %g", v[0]);
    cr_expect(strstr(err, "has no tensor 2000"), "%s", err);

    /* dropped: now the constant goes */
    mb_encode_drop(s_rec(&b), 7);
    s_fetch(&b, 1, 4);
    s_run(&b, NULL, 0, err, sizeof err);
    cr_expect(strstr(err, "has no tensor 1 "), "%s", err);
    s_stop_worker();
}

Test(replay, leftovers_are_freed_and_failures_name_the_op, .timeout = 120)
{
    s_start();
    s_batch b = {0};
    mb_writer recs = {0};
    s_fill(&b, 1, 2.0);
    s_compute(&recs, "add", 5, 1, 12);  /* made, neither freed nor returned */
    s_compute(&recs, "mul", 12, 99, 11); /* 99 does not exist: a failure inside the replay */
    s_define(&b, 3, &recs, 2, 10);
    s_fill(&b, 100, 3.0);
    mb_encode_replay(s_rec(&b), 3, 1, (const uint64_t[]){100}, 500, 1, 0, 0);
    s_fetch(&b, 502, 1);
    char err[512] = "";
    s_run(&b, NULL, 0, err, sizeof err);
    cr_expect(strstr(err, "has no tensor 502"), "the leftover is freed: %s", err);
    s_fetch(&b, 501, 2);
    s_run(&b, NULL, 0, err, sizeof err);
    cr_expect(strstr(err, "no tensor 99") && strstr(err, "(op 2 of captured 'step')"), "%s", err);
    s_stop_worker();
}

static void s_expect_broken(s_batch *b, uint64_t graph, const char *why)
{
    s_fill(b, 100, 3.0);
    mb_encode_replay(s_rec(b), graph, 1, (const uint64_t[]){100}, 900, 1, 0, 0);
    s_fetch(b, 901, 1);
    char err[512] = "";
    s_run(b, NULL, 0, err, sizeof err);
    cr_expect(strstr(err, "captured 'step' cannot run on device 0") && strstr(err, why), "graph %llu: %s",
              (unsigned long long)graph, err);
}

Test(replay, hostile_defines_never_crash, .timeout = 120)
{
    s_start();
    s_batch b = {0};
    mb_writer recs = {0};
    /* garbage bytes */
    mb_w_str(&recs, "\xc1\xc1\xc1", 3);
    recs.data[0] = (char)0xc1;
    s_define(&b, 21, &recs, 1, 10);
    /* more records declared than present */
    s_square_records(&recs);
    s_define(&b, 22, &recs, 9, 10);
    /* a fetch inside */
    mb_encode_fetch(&recs, 5, 1, 0);
    s_define(&b, 23, &recs, 1, 10);
    /* nested: a define and a replay inside */
    mb_encode_replay(&recs, 21, 1, (const uint64_t[]){5}, 1, 1, 0, 0);
    s_define(&b, 24, &recs, 1, 10);
    /* a compute whose fields have the wrong types (ins a string): kept, refused when it runs */
    mb_w_array(&recs, 8);
    mb_w_int(&recs, MB_OP_COMPUTE);
    mb_w_int(&recs, 0);
    mb_w_str(&recs, "ins", 3);
    for (int i = 0; i < 5; i++)
        mb_w_nil(&recs);
    s_define(&b, 25, &recs, 1, 10);
    s_run(&b, NULL, 0, NULL, 0);
    s_expect_broken(&b, 21, "");
    s_expect_broken(&b, 22, "declared");
    s_expect_broken(&b, 23, "needs the controller");
    s_expect_broken(&b, 24, "needs the controller");
    s_fill(&b, 100, 3.0);
    mb_encode_replay(s_rec(&b), 25, 1, (const uint64_t[]){100}, 900, 1, 0, 0);
    s_run(&b, NULL, 0, NULL, 0);

    /* defines with impossible fields, replays of nothing or with the wrong inputs: dropped */
    int frame = s_payload(&b, "", 0);
    mb_encode_define(s_rec(&b), 0, "step", 10, 20, 1, 1, 0, 0, 0, NULL, 0, NULL, 0, frame);
    mb_encode_define(s_rec(&b), 30, "step", 0, 20, 1, 1, 0, 0, 0, NULL, 0, NULL, 0, 0);
    mb_encode_define(s_rec(&b), 31, "step", 30, 20, 1, 1, 0, 0, 0, NULL, 0, NULL, 0, 0);
    mb_encode_define(s_rec(&b), 32, "step", 10, 20, 1, 1, 0, 0, 0, NULL, 0, NULL, 0, 7);
    mb_encode_define(s_rec(&b), 33, "step", 10, 20, 1, 1, 0, 0, 0, NULL, 0, NULL, -1, 0);
    mb_encode_replay(s_rec(&b), 404, 0, NULL, 900, 1, 0, 0);
    mb_encode_replay(s_rec(&b), 22, 0, NULL, 900, 1, 0, 0);
    mb_encode_drop(s_rec(&b), 404);
    s_run(&b, NULL, 0, NULL, 0);

    /* the worker still works: a good sequence under an id a broken one had */
    s_fill(&b, 1, 2.0);
    s_square_records(&recs);
    s_define(&b, 21, &recs, 4, 10);
    s_fill(&b, 100, 1.0);
    mb_encode_replay(s_rec(&b), 21, 1, (const uint64_t[]){100}, 3000, 1, 0, 0);
    s_fetch(&b, 3001, 9);
    float v[4];
    s_run(&b, v, 4, NULL, 0);
    cr_expect(v[0] == 9.0f, "(1 + 2)^2, got %g", v[0]);
    s_stop_worker();
}

/* A COMPUTE reads an input as a strided view of its piece: the worker gathers the elements the
 * strides name (a step of 0 repeats one) for the kernel, and an aliasing op (reshape) shares the
 * gathered bytes; a view whose far corner leaves the piece is refused, naming the input. */
Test(replay, a_compute_reads_strided_views, .timeout = 120)
{
    s_start();
    s_batch b = {0};
    mb_encode_arange(s_rec(&b), 1, DT_FLOAT32, 1, (const int64_t[]){12}, 0, (dt_scalar){.is_int = true, .i = 0},
                     (dt_scalar){.is_int = true, .i = 1});
    const int64_t shape[] = {2, 3};
    const struct {
        const char *op;
        int64_t views[7];
        float want[6];
    } cases[] = {
        {"neg", {0, 1, -2, 2, 3, 4, 2}, {-1, -3, -5, -5, -7, -9}},
        {"reshape", {0, 2, -2, 2, 3, 1, 3}, {2, 5, 8, 3, 6, 9}},
        {"neg", {0, 7, -2, 2, 3, 0, 1}, {-7, -8, -9, -7, -8, -9}},
        {"neg", {0, 5, -2, 2, 3, 4, 2}, {0}},
    };
    for (int c = 0; c < 4; c++) {
        uint64_t out = 10 + (uint64_t)c, in = 1;
        const op_def *def = op_find(cases[c].op);
        mb_encode_compute(s_rec(&b), op_index(def), 1, &in, def->id == OP_ID_reshape ? 2 : 0, shape, 0, NULL, NULL, 0,
                          NULL, 7, cases[c].views, 1);
        mb_encode_out(&b.w, out, DT_FLOAT32, 2, shape);
        s_fetch(&b, out, 1 + (uint64_t)c);
        float got[6] = {0};
        char err[512] = "";
        s_run(&b, got, 6, err, sizeof err);
        if (c < 3) {
            cr_expect_str_empty(err);
            cr_expect(!memcmp(got, cases[c].want, sizeof got), "case %d: %g %g %g %g %g %g", c, got[0], got[1], got[2],
                      got[3], got[4], got[5]);
        } else {
            cr_expect(strstr(err, "a view of input 0 does not lie inside its piece"), "%s", err);
        }
    }
    s_stop_worker();
}

/* A COMPUTE reads an input as a view of its piece (the controller's views, dtn_tensor.h): the run
 * its record names, and an error naming the input when that run leaves the piece. */
Test(replay, a_compute_reads_views_and_refuses_one_outside_its_piece, .timeout = 120)
{
    s_start();
    s_batch b = {0};
    mb_encode_arange(s_rec(&b), 1, DT_FLOAT32, 1, (const int64_t[]){8}, 0, (dt_scalar){.is_int = true, .i = 0},
                     (dt_scalar){.is_int = true, .i = 1});
    const int64_t shape[] = {3};
    const struct {
        const char *op;
        int64_t first;
        float want[3];
    } cases[] = {{"neg", 2, {-2, -3, -4}}, {"reshape", 5, {5, 6, 7}}, {"neg", 6, {0}}};
    for (int c = 0; c < 3; c++) {
        const int64_t views[] = {0, cases[c].first, 1, 3};
        uint64_t out = 10 + (uint64_t)c, in = 1;
        const op_def *def = op_find(cases[c].op);
        mb_encode_compute(s_rec(&b), op_index(def), 1, &in, def->id == OP_ID_reshape ? 1 : 0, shape, 0, NULL, NULL, 0,
                          NULL, 4, views, 1);
        mb_encode_out(&b.w, out, DT_FLOAT32, 1, shape);
        s_fetch(&b, out, 1 + (uint64_t)c);
        float got[3] = {0};
        char err[512] = "";
        s_run(&b, got, 3, err, sizeof err);
        if (c < 2) {
            cr_expect_str_empty(err);
            cr_expect(!memcmp(got, cases[c].want, sizeof got), "%s from %lld: %g %g %g", cases[c].op,
                      (long long)cases[c].first, got[0], got[1], got[2]);
        } else {
            cr_expect(strstr(err, "a view of input 0 does not lie inside its piece"), "%s", err);
        }
    }
    s_stop_worker();
}

/* Shared memory between worker processes: the bounds check of a region named by a message, the
 * checks that mapping another process's segment makes, and a worker that receives forged handles
 * from a peer. For the last, the test is the worker's controller and its peers: it runs
 * act_worker_run on an ipc endpoint of its own (a worker process in all but the process), says
 * which processes the devices are, and sends it ASSEMBLEs whose regions come by handle. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_error.h"
#include "dt_shm.h"
#include "mb_schema.h"
#include "mb_socket.h"

/* ---- dt_shm_region_check ---------------------------------------------------------------------- */

Test(shm, region_check_bounds)
{
    const int64_t shape[2] = {3, 4}, strides[2] = {16, 4};
    /* the last byte is 2 * 16 + 3 * 4 + 4 = 48 bytes from the start */
    cr_expect_null(dt_shm_region_check(48, 0, 2, shape, strides, 4));
    cr_expect_null(dt_shm_region_check(100, 52, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(47, 0, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(100, 53, 2, shape, strides, 4));
    cr_expect_not_null(dt_shm_region_check(100, UINT64_MAX, 2, shape, strides, 4));
    /* a strided region: rows 64 bytes apart */
    const int64_t wide[2] = {64, 4};
    cr_expect_null(dt_shm_region_check(2 * 64 + 16, 0, 2, shape, wide, 4));
    cr_expect_not_null(dt_shm_region_check(2 * 64 + 15, 0, 2, shape, wide, 4));
    /* a scalar (no dims) is one element */
    cr_expect_null(dt_shm_region_check(8, 4, 0, NULL, NULL, 4));
    cr_expect_not_null(dt_shm_region_check(8, 5, 0, NULL, NULL, 4));
}

Test(shm, region_check_never_overflows)
{
    const int64_t huge[2] = {INT64_MAX, 2}, strides[2] = {8, 4};
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, 0, 2, huge, strides, 4));
    const int64_t shape[2] = {3, 2}, big[2] = {INT64_MAX, 4};
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, 0, 2, shape, big, 4));
    cr_expect_not_null(dt_shm_region_check(SIZE_MAX, UINT64_MAX - 4, 2, shape, strides, 4));
    const int64_t negative[2] = {-8, 4};
    cr_expect_not_null(dt_shm_region_check(1 << 20, 1 << 10, 2, shape, negative, 4));
    const int64_t minus[2] = {-1, 2};
    cr_expect_not_null(dt_shm_region_check(1 << 20, 0, 2, minus, strides, 4));
}

Test(shm, region_check_empty)
{
    const int64_t shape[2] = {0, 5}, strides[2] = {INT64_MAX, 4};
    cr_expect_null(dt_shm_region_check(16, 16, 2, shape, strides, 4)); /* no byte is read */
    cr_expect_not_null(dt_shm_region_check(16, 17, 2, shape, strides, 4));
}

/* ---- dt_shm_peer_map on this process's own segments ----------------------------------------- */

Test(shm, map_checks_what_it_opens)
{
    dt_shm_seg *seg = dt_shm_seg_new(300 << 10);
    cr_assert_not_null(seg, "%s", dt_last_error());
    cr_expect_geq(seg->size, 300u << 10);
    memset(seg->data, 0x5a, seg->size);
    dt_shm_peer *p = dt_shm_peer_new(getpid());
    const char *base;
    size_t size;
    cr_assert_null(dt_shm_peer_map(p, seg->fd, seg->serial, &base, &size));
    cr_expect_eq(size, seg->size);
    cr_expect_eq(base[0], 0x5a);
    cr_expect_eq(base[size - 1], 0x5a);
    const char *again;
    cr_expect_null(dt_shm_peer_map(p, seg->fd, seg->serial, &again, &size));
    cr_expect_eq(again, base, "a segment is mapped once");
    cr_expect_eq(dt_shm_peer_count(p), 1);

    const char *why = dt_shm_peer_map(p, seg->fd, seg->serial + 1000, &base, &size);
    cr_expect(why && strstr(why, "is not its shared segment"), "another serial: %s", why ? why : "(none)");
    int null_fd = open("/dev/null", O_RDONLY);
    why = dt_shm_peer_map(p, null_fd, seg->serial, &base, &size);
    cr_expect(why && strstr(why, "is not its shared segment"), "not a segment: %s", why ? why : "(none)");
    close(null_fd);
    why = dt_shm_peer_map(p, -1, seg->serial, &base, &size);
    cr_expect_not_null(why);
    why = dt_shm_peer_map(p, (int64_t)1 << 40, seg->serial, &base, &size);
    cr_expect_not_null(why);
    why = dt_shm_peer_map(p, 1000000, seg->serial, &base, &size); /* no such descriptor */
    cr_expect_not_null(why);

    /* named like a segment, but it could shrink under a reader (which would then fault) */
    char name[64];
    snprintf(name, sizeof name, "dtorch-%d-%" PRIu64, (int)getpid(), (uint64_t)999999999);
    int unsealed = memfd_create(name, MFD_CLOEXEC);
    cr_assert_geq(unsealed, 0);
    cr_assert_eq(ftruncate(unsealed, 1 << 16), 0);
    why = dt_shm_peer_map(p, unsealed, 999999999, &base, &size);
    cr_expect(why && strstr(why, "not sealed"), "unsealed: %s", why ? why : "(none)");
    close(unsealed);
    cr_expect_eq(dt_shm_peer_count(p), 1, "nothing refused was kept");
    dt_shm_peer_destroy(&p);
    cr_expect_null(p);
    dt_shm_seg_free(seg);
    dt_shm_trim();
}

Test(shm, closed_segments_are_unmapped_on_the_next_miss)
{
    dt_shm_seg *a = dt_shm_seg_new(64 << 10), *b = dt_shm_seg_new(128 << 10);
    cr_assert(a && b);
    dt_shm_peer *p = dt_shm_peer_new(getpid());
    const char *base;
    size_t size;
    cr_assert_null(dt_shm_peer_map(p, a->fd, a->serial, &base, &size));
    dt_shm_trim();
    dt_shm_seg_free(a);
    dt_shm_trim(); /* a is closed: its serial never comes again */
    cr_assert_null(dt_shm_peer_map(p, b->fd, b->serial, &base, &size));
    cr_expect_eq(dt_shm_peer_count(p), 1, "the closed segment's mapping went on the miss");
    dt_shm_peer_destroy(&p);
    dt_shm_seg_free(b);
    dt_shm_trim();
}

Test(shm, freed_segments_are_reused)
{
    dt_shm_trim();
    dt_shm_seg *a = dt_shm_seg_new(1 << 20);
    cr_assert_not_null(a);
    uint64_t serial = a->serial;
    dt_shm_seg_free(a);
    dt_shm_seg *b = dt_shm_seg_new((1 << 20) - 100);
    cr_assert_not_null(b);
    cr_expect_eq(b->serial, serial, "a kept segment of the same rounded size comes back");
    dt_shm_seg_free(b);
    dt_shm_trim();
}

/* A segment larger than the host is refused before it is made: it is populated at once, and the
 * kernel would kill the process for it rather than fail the call. */
Test(shm, segment_larger_than_the_host_is_refused)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    size_t host = (size_t)pages * (size_t)page;
    cr_expect_null(dt_shm_seg_new(host + 1));
    cr_expect_eq(dt_last_error_code(), DT_ENOMEM);
    char want[128];
    snprintf(want, sizeof want, "of %zu bytes: the host has %zu bytes of memory", host + 1, host);
    cr_expect(strstr(dt_last_error(), want), "%s", dt_last_error());
}

/* ---- a worker that receives forged handles ------------------------------------------------- */

#define S_N 100000                 /* floats in each region: 400,000 bytes, above ACT_SHM_MIN */
#define S_RECV_MS 5000

typedef struct {
    char endpoint[128];
    atomic_bool stop;
    int rc;
} s_worker;

static bool s_stopped(void *arg) { return atomic_load(&((s_worker *)arg)->stop); }

static void *s_worker_main(void *arg)
{
    s_worker *w = arg;
    w->rc = act_worker_run(w->endpoint, 0, "cpu", s_stopped, w);
    return NULL;
}

typedef struct {
    s_worker worker;
    pthread_t thread;
    zsock_t *ctl;                  /* the worker's controller */
    zsock_t *as[3];                /* DEALERs to its peer socket as devices 1 and 2 ("w1", "w2") */
    zsock_t *lender[3];            /* the peer sockets of devices 1 and 2: releases arrive there */
    uint64_t seq, peer_seq;
} s_rig;

static void s_send_one(zsock_t *sock, const char *rid, mb_kind kind, uint32_t sender, uint64_t seq, mb_writer *body)
{
    mb_header h = {MB_VERSION, kind, seq, sender, 1};
    size_t size = body->size;
    cr_assert_eq(mb_send(sock, rid, rid ? strlen(rid) : 0, &h, (mb_buf){mb_w_release(body), size, mb_buf_free, NULL},
                         NULL, 0),
                 0);
}

/* The next message on sock other than the worker's heartbeats. */
static void s_recv(zsock_t *sock, bool router, mb_message *m)
{
    zsock_set_rcvtimeo(sock, S_RECV_MS);
    for (;;) {
        cr_assert_eq(mb_recv(sock, router, false, m), 0, "%s", dt_last_error());
        if (m->header.kind != MB_HEARTBEAT)
            return;
        mb_message_close(m);
    }
}

static void s_tell_process(s_rig *r, int64_t device, int64_t pid)
{
    mb_writer body = {0};
    mb_encode_process(&body, device, pid);
    s_send_one(r->ctl, "d0", MB_PROCESS, MB_SENDER_CONTROLLER, r->seq++, &body);
}

static void s_rig_start(s_rig *r)
{
    memset(r, 0, sizeof *r);
    snprintf(r->worker.endpoint, sizeof r->worker.endpoint, "ipc:///tmp/dtorch-shmtest-%d.ipc", (int)getpid());
    r->ctl = mb_socket_new(MB_ROUTER, r->worker.endpoint, true, NULL);
    cr_assert_not_null(r->ctl, "%s", dt_last_error());
    for (int d = 1; d <= 2; d++) {
        char endpoint[200], rid[8];
        snprintf(endpoint, sizeof endpoint, "%s-peer-%d", r->worker.endpoint, d);
        r->lender[d] = mb_socket_new(MB_ROUTER, endpoint, true, NULL);
        snprintf(endpoint, sizeof endpoint, "%s-peer-0", r->worker.endpoint);
        snprintf(rid, sizeof rid, "w%d", d);
        r->as[d] = mb_socket_new(MB_DEALER, endpoint, false, rid);
        cr_assert(r->lender[d] && r->as[d], "%s", dt_last_error());
    }
    cr_assert_eq(pthread_create(&r->thread, NULL, s_worker_main, &r->worker), 0);
    mb_message hello;
    s_recv(r->ctl, true, &hello);
    cr_assert_eq(hello.header.kind, MB_HELLO);
    mb_message_close(&hello);
    /* the worker lends, device 1 is this process (its segments are the test's), device 2 lends nothing */
    s_tell_process(r, 0, getpid());
    s_tell_process(r, 1, getpid());
    s_tell_process(r, 2, 0);
}

static void s_rig_stop(s_rig *r)
{
    mb_header h = {MB_VERSION, MB_BYE, r->seq++, MB_SENDER_CONTROLLER, 0};
    mb_send(r->ctl, "d0", 2, &h, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0);
    pthread_join(r->thread, NULL);
    cr_expect_eq(r->worker.rc, 0);
    for (int d = 1; d <= 2; d++) {
        mb_socket_destroy(&r->as[d]);
        mb_socket_destroy(&r->lender[d]);
        char path[200];
        snprintf(path, sizeof path, "%s-peer-%d", r->worker.endpoint + 6, d);
        unlink(path);
    }
    mb_socket_destroy(&r->ctl);
    unlink(r->worker.endpoint + 6);
}

/* Sends the worker an ASSEMBLE of tensor id (S_N floats) from transfer `transfer` of device
 * `from`, then a FETCH of it as future id. */
static void s_assemble(s_rig *r, uint64_t id, int64_t from, uint64_t transfer)
{
    mb_writer body = {0};
    const int64_t shape[1] = {S_N}, zero[1] = {0};
    mb_encode_assemble(&body, id, DT_FLOAT32, 1, shape, 0, false, 1);
    mb_encode_part(&body, MB_PART_COPY, DT_REDUCE_SUM, from, transfer, 1, zero, 1, zero, 1, shape, 1);
    mb_encode_fetch(&body, id, id, 0);
    mb_header h = {MB_VERSION, MB_OPS, r->seq++, MB_SENDER_CONTROLLER, 2};
    size_t size = body.size;
    cr_assert_eq(mb_send(r->ctl, "d0", 2, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, NULL, 0), 0);
}

/* Device `as` (sending as device `sender` in the header) lends the region of transfer by handle. */
static void s_lend(s_rig *r, int as, uint32_t sender, uint64_t transfer, int64_t fd, uint64_t serial,
                   uint64_t offset, int64_t stride, uint64_t hold)
{
    mb_writer body = {0};
    const int64_t shape[1] = {S_N}, strides[1] = {stride};
    mb_encode_region(&body, transfer, 0, DT_FLOAT32, 1, shape, NULL, 0, 0, 1, strides, fd, serial, offset, hold);
    s_send_one(r->as[as], NULL, MB_PEER, sender, r->peer_seq++, &body);
}

/* The completions of the last batch: the fetch's ERROR message (NULL for a VALUE, whose handle
 * is copied to *value). */
static char *s_outcome(s_rig *r, mb_value_rec *value)
{
    mb_message m;
    s_recv(r->ctl, true, &m);
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
            cr_assert_eq(mb_decode_value(&rec, value), 0);
            answered = true;
        }
    }
    mb_message_close(&m);
    cr_assert(answered, "the fetch was answered");
    return error;
}

/* The worker gave hold back to device d. */
static void s_expect_release(s_rig *r, int d, uint64_t hold)
{
    mb_message m;
    s_recv(r->lender[d], true, &m);
    cr_assert_eq(m.header.kind, MB_RELEASE);
    cr_expect_eq(m.header.sender, 0);
    mb_body_reader br;
    mb_cursor rec;
    mb_release_rec got;
    cr_assert_eq(mb_body_init(&br, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count), 0);
    cr_assert_eq(mb_body_next(&br, &rec), 1);
    cr_assert_eq(mb_decode_release(&rec, &got), 0);
    cr_expect_eq(got.hold, hold);
    mb_message_close(&m);
}

static void s_expect_refused(s_rig *r, uint64_t id, const char *why)
{
    mb_value_rec value;
    char *error = s_outcome(r, &value);
    cr_assert_not_null(error, "case %" PRIu64 " was refused", id);
    cr_expect(strstr(error, "redistribute failed on device 0") && strstr(error, why), "case %" PRIu64 ": %s", id,
              error);
    free(error);
}

Test(shm, forged_handles_are_refused, .timeout = 180)
{
    s_rig r;
    s_rig_start(&r);
    dt_shm_seg *seg = dt_shm_seg_new((size_t)S_N * 4);
    cr_assert_not_null(seg);
    float *values = seg->data;
    for (int i = 0; i < S_N; i++)
        values[i] = (float)i * 0.5f;
    int null_fd = open("/dev/null", O_RDONLY);
    struct {
        int as;
        uint32_t sender;
        int64_t from, fd;
        uint64_t serial, offset;
        int64_t stride;
        const char *why;
    } forged[] = {
        {1, 1, 1, seg->fd, seg->serial, seg->size, 4, "outside its segment"},
        {1, 1, 1, seg->fd, seg->serial, seg->size - (uint64_t)S_N * 4 + 4, 4, "outside its segment"}, /* the end */
        {1, 1, 1, seg->fd, seg->serial, 0, INT64_MAX / 2, "beyond any segment"},
        {1, 1, 1, seg->fd, seg->serial, 0, -4, "negative"},
        {1, 1, 1, seg->fd, seg->serial + 77, 0, 4, "is not its shared segment"},
        {1, 1, 1, null_fd, seg->serial, 0, 4, "is not its shared segment"},
        {1, 1, 1, 1 << 20, seg->serial, 0, 4, "is not its shared segment"},       /* no such descriptor */
        {2, 2, 2, seg->fd, seg->serial, 0, 4, "cannot be mapped here"},          /* device 2 lends nothing */
        {2, 2, 1, seg->fd, seg->serial, 0, 4, "expected from device 1"},          /* not the sender the part names */
    };
    int n = (int)(sizeof forged / sizeof forged[0]);
    for (int k = 0; k < n; k++) {
        uint64_t id = 100 + (uint64_t)k, hold = 1000 + (uint64_t)k;
        s_assemble(&r, id, forged[k].from, id);
        s_lend(&r, forged[k].as, forged[k].sender, id, forged[k].fd, forged[k].serial, forged[k].offset,
               forged[k].stride, hold);
        s_expect_refused(&r, id, forged[k].why);
        s_expect_release(&r, forged[k].as, hold); /* a refused handle is given back all the same */
    }
    close(null_fd);

    /* a true handle after all that: the worker copies the bytes and lends its piece back to the
     * controller by handle, from a segment of its own */
    s_assemble(&r, 200, 1, 200);
    s_lend(&r, 1, 1, 200, seg->fd, seg->serial, 0, 4, 2000);
    mb_value_rec value;
    char *error = s_outcome(&r, &value);
    cr_assert_null(error, "%s", error);
    s_expect_release(&r, 1, 2000);
    cr_assert_geq(value.segment, 0, "a large value is lent by handle");
    cr_expect_eq(value.frame, -1);
    dt_shm_peer *worker = dt_shm_peer_new(getpid());
    const char *base;
    size_t size;
    cr_assert_null(dt_shm_peer_map(worker, value.segment, value.serial, &base, &size));
    cr_assert_null(dt_shm_region_check(size, value.offset, 1, (const int64_t[]){S_N}, (const int64_t[]){4}, 4));
    const float *got = (const float *)(base + value.offset);
    for (int i = 0; i < S_N; i++)
        if (got[i] != (float)i * 0.5f)
            cr_assert_fail("element %d: %g", i, got[i]);
    mb_writer body = {0};
    mb_encode_release(&body, value.hold);
    s_send_one(r.ctl, "d0", MB_RELEASE, MB_SENDER_CONTROLLER, r.seq++, &body);
    dt_shm_peer_destroy(&worker);
    dt_shm_seg_free(seg);
    s_rig_stop(&r);
}

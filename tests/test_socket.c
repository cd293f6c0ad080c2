/* mb_socket over inproc, ipc and tcp: round trips, zero-copy payloads, ordering under bursts,
 * malformed messages drained (more payload frames than records among them), frames past the bound a
 * socket takes cut off at their header, and buffers freed when a send fails. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dt_error.h"
#include "mb_socket.h"

#define MIB (1u << 20)
#define DEALER_ID "device-3"

static void s_count_free(void *data, void *hint)
{
    free(data);
    atomic_fetch_add((atomic_int *)hint, 1);
}

/* Polls up to one second: ZeroMQ may run free functions on its I/O thread. */
static void s_expect_count(atomic_int *count, int want)
{
    for (int i = 0; i < 1000 && atomic_load(count) < want; i++)
        zclock_sleep(1);
    cr_assert_eq(atomic_load(count), want);
}

typedef struct {
    zsock_t *router;
    zsock_t *dealer;
    char ipc_path[128];
} s_pair;

/* Binds a ROUTER to endpoint and connects a DEALER with routing id DEALER_ID to where it bound
 * (for tcp://...:* the port the ROUTER got). */
static s_pair s_pair_new(const char *endpoint)
{
    s_pair p = {0};
    p.router = mb_socket_new(MB_ROUTER, endpoint, true, NULL);
    cr_assert_not_null(p.router, "%s", dt_last_error());
    char *bound = zsock_last_endpoint(p.router);
    cr_assert_not_null(bound);
    p.dealer = mb_socket_new(MB_DEALER, bound, false, DEALER_ID);
    cr_assert_not_null(p.dealer, "%s", dt_last_error());
    if (strncmp(bound, "ipc://", 6) == 0)
        snprintf(p.ipc_path, sizeof p.ipc_path, "%s", bound + 6);
    free(bound);
    return p;
}

static void s_pair_destroy(s_pair *p)
{
    mb_socket_destroy(&p->dealer);
    mb_socket_destroy(&p->router);
    if (p->ipc_path[0])
        unlink(p->ipc_path);
}

static mb_header s_header(mb_kind kind, uint64_t seq, uint32_t sender, uint32_t count)
{
    return (mb_header){MB_VERSION, kind, seq, sender, count};
}

static void s_fill(unsigned char *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)(i * 131 + seed);
}

static void s_expect_frame(const zmq_msg_t *frame, const void *data, size_t size)
{
    cr_assert_eq(zmq_msg_size((zmq_msg_t *)frame), size);
    if (size)
        cr_assert_eq(memcmp(zmq_msg_data((zmq_msg_t *)frame), data, size), 0);
}

/* DEALER -> ROUTER with payloads of 0, 1 and 1 MiB bytes, then ROUTER -> DEALER back. */
static void s_round_trip(const char *endpoint)
{
    s_pair p = s_pair_new(endpoint);
    const size_t sizes[3] = {0, 1, MIB};
    unsigned char *expect[3];
    mb_buf payloads[3];
    atomic_int freed = 0;
    for (int i = 0; i < 3; i++) {
        expect[i] = malloc(sizes[i] + 1);
        s_fill(expect[i], sizes[i], (unsigned)i);
        void *copy = malloc(sizes[i] + 1);
        memcpy(copy, expect[i], sizes[i]);
        payloads[i] = (mb_buf){copy, sizes[i], s_count_free, &freed};
    }
    const char body[] = "\x92\x03\xcd\x12\x34"; /* [3, 0x1234] */
    mb_header h = s_header(MB_HELLO, UINT64_MAX - 1, 3, 3);
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){(void *)body, 5, NULL, NULL}, payloads, 3),
                 0, "%s", dt_last_error());

    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.routing_id_len, strlen(DEALER_ID));
    cr_assert_eq(memcmp(m.routing_id, DEALER_ID, m.routing_id_len), 0);
    cr_assert_eq(memcmp(&m.header, &h, sizeof h), 0);
    s_expect_frame(&m.body, body, 5);
    cr_assert_eq(m.npayloads, 3);
    for (int i = 0; i < 3; i++)
        s_expect_frame(&m.payloads[i], expect[i], sizes[i]);

    /* reply to the routing id just received, payloads copied this time */
    for (int i = 0; i < 3; i++)
        payloads[i] = (mb_buf){expect[i], sizes[i], NULL, NULL};
    mb_header back = s_header(MB_OPS, 0, MB_SENDER_CONTROLLER, 3);
    cr_assert_eq(mb_send(p.router, m.routing_id, m.routing_id_len, &back,
                         (mb_buf){"\x01\x02", 2, NULL, NULL}, payloads, 3), 0);
    mb_message_close(&m);
    mb_message_close(&m); /* closing twice is harmless */
    s_expect_count(&freed, 3);

    cr_assert_eq(mb_recv(p.dealer, false, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.routing_id_len, 0);
    cr_assert_eq(memcmp(&m.header, &back, sizeof back), 0);
    s_expect_frame(&m.body, "\x01\x02", 2);
    cr_assert_eq(m.npayloads, 3);
    for (int i = 0; i < 3; i++)
        s_expect_frame(&m.payloads[i], expect[i], sizes[i]);
    mb_message_close(&m);
    for (int i = 0; i < 3; i++)
        free(expect[i]);
    s_pair_destroy(&p);
}

Test(socket, round_trip_inproc)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://rt-%d", getpid());
    s_round_trip(ep);
}

Test(socket, round_trip_ipc)
{
    char ep[96];
    snprintf(ep, sizeof ep, "ipc:///tmp/dtorch-test-socket-%d.ipc", getpid());
    s_round_trip(ep);
}

Test(socket, round_trip_tcp)
{
    s_round_trip("tcp://127.0.0.1:*");
}

Test(socket, zero_copy_inproc)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://zc-%d", getpid());
    s_pair p = s_pair_new(ep);
    atomic_int freed = 0;
    size_t size = 4 * MIB;
    unsigned char *data = malloc(size);
    s_fill(data, size, 9);
    mb_buf payload = {data, size, s_count_free, &freed};
    mb_header h = s_header(MB_COMPLETIONS, 1, 0, 1);
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){NULL, 0, NULL, NULL}, &payload, 1), 0);

    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.npayloads, 1);
    cr_assert_eq(zmq_msg_data(&m.payloads[0]), (void *)data);
    cr_assert_eq(zmq_msg_size(&m.payloads[0]), size);
    cr_assert_eq(atomic_load(&freed), 0, "freed while the receiver still holds the frame");

    /* a frame moved out of the message outlives it, as workers adopting storage rely on */
    zmq_msg_t kept;
    zmq_msg_init(&kept);
    zmq_msg_move(&kept, &m.payloads[0]);
    mb_message_close(&m);
    cr_assert_eq(atomic_load(&freed), 0);
    cr_assert_eq(((unsigned char *)zmq_msg_data(&kept))[size - 1], data[size - 1]);
    zmq_msg_close(&kept);
    s_expect_count(&freed, 1);
    zclock_sleep(20);
    cr_assert_eq(atomic_load(&freed), 1);
    s_pair_destroy(&p);
}

Test(socket, burst_arrives_in_order)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://burst-%d", getpid());
    s_pair p = s_pair_new(ep);
    enum { N = 10000 };
    for (uint64_t i = 0; i < N; i++) {
        mb_header h = s_header(MB_COMPLETIONS, i, 3, 1);
        cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){"\x05", 1, NULL, NULL}, NULL, 0), 0);
    }
    for (uint64_t i = 0; i < N; i++) {
        mb_message m;
        cr_assert_eq(mb_recv(p.router, true, false, &m), 0, "%s", dt_last_error());
        cr_assert_eq(m.header.seq, i);
        cr_assert_eq(m.npayloads, 0);
        cr_assert_null(m.payloads);
        mb_message_close(&m);
    }
    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, true, &m), 1);
    s_pair_destroy(&p);
}

Test(socket, malformed_messages_are_drained)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://bad-%d", getpid());
    s_pair p = s_pair_new(ep);
    void *raw = zsock_resolve(p.dealer);
    mb_header good = s_header(MB_OPS, 0, 3, 0);
    char hbuf[MB_MAX_HEADER];
    size_t hlen = mb_header_encode(&good, hbuf);

    /* garbage header with a body and two payloads */
    zmq_send(raw, "\xc1garbage", 8, ZMQ_SNDMORE);
    zmq_send(raw, "body", 4, ZMQ_SNDMORE);
    zmq_send(raw, "p0", 2, ZMQ_SNDMORE);
    zmq_send(raw, "p1", 2, 0);
    /* a valid header with no body frame */
    zmq_send(raw, hbuf, hlen, 0);
    /* a header with trailing bytes */
    zmq_send(raw, "\x95\x01\x02\x00\x00\x00\x00", 7, ZMQ_SNDMORE);
    zmq_send(raw, "", 0, 0);
    good.seq = 42;
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &good, (mb_buf){NULL, 0, NULL, NULL}, NULL, 0), 0);

    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, false, &m), DT_EPROTO);
    cr_assert_eq(m.npayloads, 0);
    cr_assert_eq(mb_recv(p.router, true, false, &m), DT_EPROTO);
    cr_assert(strstr(dt_last_error(), "body"), "%s", dt_last_error());
    cr_assert_eq(mb_recv(p.router, true, false, &m), DT_EPROTO);
    cr_assert(strstr(dt_last_error(), "trailing"), "%s", dt_last_error());
    cr_assert_eq(mb_recv(p.router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.header.seq, 42);
    mb_message_close(&m);
    cr_assert_eq(mb_recv(p.router, true, true, &m), 1);
    s_pair_destroy(&p);
}

/* A record names at most one payload frame: a message with more frames than its header counts
 * records is drained whole, and the next one is read. */
Test(socket, payload_frames_beyond_the_records_are_drained)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://frames-%d", getpid());
    s_pair p = s_pair_new(ep);
    atomic_int freed = 0;
    mb_buf two[2] = {{malloc(MIB), MIB, s_count_free, &freed}, {malloc(MIB), MIB, s_count_free, &freed}};
    mb_header h = s_header(MB_COMPLETIONS, 0, 3, 1);
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){"\x01", 1, NULL, NULL}, two, 2), 0);
    mb_buf none = {malloc(1), 1, s_count_free, &freed};
    h = s_header(MB_HEARTBEAT, 1, 3, 0);
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){NULL, 0, NULL, NULL}, &none, 1), 0);
    mb_buf one = {malloc(MIB), MIB, s_count_free, &freed};
    h = s_header(MB_COMPLETIONS, 2, 3, 1);
    cr_assert_eq(mb_send(p.dealer, NULL, 0, &h, (mb_buf){"\x01", 1, NULL, NULL}, &one, 1), 0);

    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, false, &m), DT_EPROTO);
    cr_expect(strstr(dt_last_error(), "more payload frames than the 1 records"), "%s", dt_last_error());
    cr_assert_eq(mb_recv(p.router, true, false, &m), DT_EPROTO);
    cr_expect(strstr(dt_last_error(), "more payload frames than the 0 records"), "%s", dt_last_error());
    s_expect_count(&freed, 3); /* the refused frames are let go at once */
    cr_assert_eq(mb_recv(p.router, true, false, &m), 0, "%s", dt_last_error());
    cr_expect_eq(m.header.seq, 2);
    cr_expect_eq(m.npayloads, 1);
    mb_message_close(&m);
    s_expect_count(&freed, 4);
    s_pair_destroy(&p);
}

/* The bound every socket takes: a frame holds at most one piece and lands whole in this host's
 * memory; DTORCH_MAX_FRAME_MB lowers it, never below a body of records. */
Test(socket, max_frame_bound)
{
    unsetenv("DTORCH_MAX_FRAME_MB");
    int64_t host = mb_max_frame();
    cr_expect_geq(host, (int64_t)MB_MAX_BODY);
    cr_expect_leq(host, (int64_t)MB_MAX_PIECE);
    setenv("DTORCH_MAX_FRAME_MB", "100", 1);
    cr_expect_eq(mb_max_frame(), (int64_t)100 << 20);
    setenv("DTORCH_MAX_FRAME_MB", "1", 1);
    cr_expect_eq(mb_max_frame(), (int64_t)MB_MAX_BODY, "never below a body");
    setenv("DTORCH_MAX_FRAME_MB", "999999999999", 1);
    cr_expect_eq(mb_max_frame(), host, "never above what the host holds");
    setenv("DTORCH_MAX_FRAME_MB", "12x", 1);
    cr_expect_eq(mb_max_frame(), host, "not a number: ignored");
    setenv("DTORCH_MAX_FRAME_MB", "-5", 1);
    cr_expect_eq(mb_max_frame(), host);
    unsetenv("DTORCH_MAX_FRAME_MB");
}

/* A peer that sends a frame past the bound of the socket it reaches (here 64 MiB) is cut off at
 * the frame's header: the receiver gets nothing of that message, and the next message, which the
 * peer's socket sends once it has connected again, arrives. */
Test(socket, oversized_frames_cut_the_link, .timeout = 60)
{
    setenv("DTORCH_MAX_FRAME_MB", "64", 1);
    zsock_t *router = mb_socket_new(MB_ROUTER, "tcp://127.0.0.1:*", true, NULL);
    unsetenv("DTORCH_MAX_FRAME_MB");
    cr_assert_not_null(router, "%s", dt_last_error());
    char *bound = zsock_last_endpoint(router);
    zsock_t *raw = zsock_new(ZMQ_DEALER); /* a plain socket: it sends what it is given */
    cr_assert_not_null(raw);
    zsock_set_identity(raw, DEALER_ID);
    zsock_set_sndhwm(raw, 0);
    cr_assert_eq(zsock_connect(raw, "%s", bound), 0);
    free(bound);
    void *handle = zsock_resolve(raw);
    char hbuf[MB_MAX_HEADER];
    mb_header h = s_header(MB_COMPLETIONS, 0, 3, 1);
    size_t hlen = mb_header_encode(&h, hbuf);
    size_t big = ((size_t)64 << 20) + 1;
    zmq_msg_t frame;
    cr_assert_eq(zmq_msg_init_size(&frame, big), 0);
    memset(zmq_msg_data(&frame), 7, big);
    zmq_send(handle, hbuf, hlen, ZMQ_SNDMORE);
    zmq_send(handle, "\x01", 1, ZMQ_SNDMORE);
    cr_assert_eq(zmq_msg_send(&frame, handle, 0), (int)big);
    h.seq = 1;
    hlen = mb_header_encode(&h, hbuf);
    zmq_send(handle, hbuf, hlen, ZMQ_SNDMORE);
    zmq_send(handle, "\x01", 1, ZMQ_SNDMORE);
    zmq_send(handle, "small", 5, 0);

    zsock_set_rcvtimeo(router, 30000);
    mb_message m;
    cr_assert_eq(mb_recv(router, true, false, &m), 0, "%s", dt_last_error());
    cr_expect_eq(m.header.seq, 1, "the oversized message never arrives, the next one does");
    cr_expect_eq(m.npayloads, 1);
    s_expect_frame(&m.payloads[0], "small", 5);
    mb_message_close(&m);
    cr_assert_eq(mb_recv(router, true, true, &m), 1);
    zsock_destroy(&raw);
    mb_socket_destroy(&router);
}

Test(socket, dontwait_when_empty)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://empty-%d", getpid());
    s_pair p = s_pair_new(ep);
    mb_message m;
    cr_assert_eq(mb_recv(p.router, true, true, &m), 1);
    cr_assert_eq(mb_recv(p.dealer, false, true, &m), 1);
    s_pair_destroy(&p);
}

Test(socket, send_failure_releases_buffers)
{
    zsock_t *sub = zsock_new(ZMQ_SUB); /* a socket type that cannot send */
    cr_assert_not_null(sub);
    atomic_int freed = 0;
    mb_buf body = {malloc(8), 8, s_count_free, &freed};
    mb_buf payloads[2] = {{malloc(MIB), MIB, s_count_free, &freed}, {malloc(1), 1, s_count_free, &freed}};
    mb_header h = s_header(MB_OPS, 0, 0, 0);
    cr_assert_eq(mb_send(sub, NULL, 0, &h, body, payloads, 2), DT_ESYS);
    cr_assert_eq(atomic_load(&freed), 3);
    zsock_destroy(&sub);
}

Test(socket, router_drops_unknown_peer_and_frees)
{
    char ep[64];
    snprintf(ep, sizeof ep, "inproc://drop-%d", getpid());
    s_pair p = s_pair_new(ep);
    atomic_int freed = 0;
    mb_buf payload = {malloc(MIB), MIB, s_count_free, &freed};
    mb_header h = s_header(MB_BYE, 0, MB_SENDER_CONTROLLER, 0);
    cr_assert_eq(mb_send(p.router, "nobody", 6, &h, (mb_buf){NULL, 0, NULL, NULL}, &payload, 1), 0);
    s_expect_count(&freed, 1);
    s_pair_destroy(&p);
}

Test(socket, bad_arguments)
{
    cr_assert_null(mb_socket_new(MB_ROUTER, "bogus://nowhere", true, NULL));
    cr_assert_eq(dt_last_error_code(), DT_ESYS);
    char long_id[MB_MAX_ROUTING_ID + 2];
    memset(long_id, 'x', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    cr_assert_null(mb_socket_new(MB_DEALER, "inproc://unused", false, long_id));
    cr_assert_eq(dt_last_error_code(), DT_EINVAL);
    cr_assert_null(mb_socket_new(MB_DEALER, "inproc://unused", false, ""));
}

/* A worker's peer socket, against messages from anyone but the run's workers: a real worker thread,
 * given the run's secret as a worker process is, talks to this test's ROUTER as if it were the
 * controller, and the test's DEALERs play its peers, genuine (the secret in their routing id, under
 * their own device) or not. A region from a stranger, or one that names another device than its
 * link does, is refused unread and counted, and the ASSEMBLE that waits for the transfer takes the
 * genuine peer's region; what waits to be assembled is bounded in count and bytes, and a region
 * past the bytes fails its ASSEMBLE saying why instead of leaving it waiting. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "act_worker.h"
#include "dt_error.h"
#include "mb_rid.h"
#include "mb_schema.h"

static const char S_TOKEN[] = "00112233445566778899aabbccddeeff";

static zsock_t *s_router;
static pthread_t s_thread;
static atomic_bool s_stop;
static char s_endpoint[64], s_peer_endpoint[80], s_rid[MB_RID_MAX];
static uint64_t s_seq;

static bool s_should_stop(void *arg) { return atomic_load(&s_stop); }

static void *s_worker_main(void *arg)
{
    act_worker_link link = {.endpoint = s_endpoint, .device = 0, .device_type = "cpu", .token = S_TOKEN};
    act_worker_serve(&link, s_should_stop, NULL);
    return NULL;
}

static void s_start(void)
{
    static int n;
    snprintf(s_endpoint, sizeof s_endpoint, "inproc://test-peer-%d", n++);
    snprintf(s_peer_endpoint, sizeof s_peer_endpoint, "%s-peer-0", s_endpoint);
    s_router = mb_socket_new(MB_ROUTER, s_endpoint, true, NULL);
    cr_assert_not_null(s_router, "%s", dt_last_error());
    atomic_store(&s_stop, false);
    s_seq = 0;
    cr_assert_eq(pthread_create(&s_thread, NULL, s_worker_main, NULL), 0);
    mb_message m;
    cr_assert_eq(mb_recv(s_router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.header.kind, MB_HELLO);
    mb_rid_format(s_rid, 'd', 0, S_TOKEN);
    cr_assert_eq(m.routing_id_len, strlen(s_rid));
    cr_assert_eq(memcmp(m.routing_id, s_rid, m.routing_id_len), 0, "the worker's link carries the secret");
    mb_message_close(&m);
}

static void s_stop_worker(void)
{
    atomic_store(&s_stop, true);
    pthread_join(s_thread, NULL);
    mb_socket_destroy(&s_router);
}

/* Sends the controller's batch of n records in w. */
static void s_send_batch(mb_writer *w, uint32_t n)
{
    mb_header h = {MB_VERSION, MB_OPS, s_seq++, MB_SENDER_CONTROLLER, n};
    size_t size = w->size;
    cr_assert_eq(mb_send(s_router, s_rid, strlen(s_rid), &h, (mb_buf){mb_w_release(w), size, mb_buf_free, NULL},
                         NULL, 0), 0);
}

/* The completions of the last batch: a VALUE's bytes into value (size bytes), an ERROR's message into
 * error. */
static void s_reply(void *value, size_t size, char *error, size_t nerror)
{
    mb_message m;
    cr_assert_eq(mb_recv(s_router, true, false, &m), 0, "%s", dt_last_error());
    cr_assert_eq(m.header.kind, MB_COMPLETIONS);
    mb_body_reader r;
    cr_assert_eq(mb_body_init(&r, zmq_msg_data(&m.body), zmq_msg_size(&m.body), m.header.count), 0);
    mb_cursor rec;
    while (mb_body_next(&r, &rec) == 1) {
        int64_t code;
        cr_assert_eq(mb_record_code(&rec, &code), 0);
        if (code == MB_C_VALUE) {
            mb_value_rec v;
            cr_assert_eq(mb_decode_value(&rec, &v), 0);
            cr_assert(v.frame >= 0 && v.frame < m.npayloads && value);
            cr_assert_eq(zmq_msg_size(&m.payloads[v.frame]), size);
            memcpy(value, zmq_msg_data(&m.payloads[v.frame]), size);
        } else if (code == MB_C_ERROR) {
            mb_error_rec e;
            cr_assert_eq(mb_decode_error(&rec, &e), 0);
            cr_assert_not_null(error, "unexpected error: %.*s", (int)e.message.len, e.message.ptr);
            snprintf(error, nerror, "%.*s", (int)e.message.len, e.message.ptr);
        }
    }
    mb_message_close(&m);
}

static void s_stats(int64_t *stats)
{
    mb_writer w = {0};
    mb_encode_stats(&w, 1, 0, false);
    s_send_batch(&w, 1);
    s_reply(stats, MB_NSTATS * sizeof *stats, NULL, 0);
}

/* Asks for the counters until stat reaches want (the peer socket is read as messages come, which
 * the controller's batches do not wait for); the counters then. */
static void s_stats_when(int64_t *stats, mb_stat stat, int64_t want)
{
    for (int tries = 0; tries < 3000; tries++) {
        s_stats(stats);
        if (stats[stat] >= want)
            return;
        usleep(10000);
    }
    cr_assert_fail("counter %d stayed at %lld, not %lld", (int)stat, (long long)stats[stat], (long long)want);
}

/* A peer of the worker: a DEALER on its peer socket under routing id rid. */
static zsock_t *s_peer(const char *rid)
{
    zsock_t *sock = mb_socket_new(MB_DEALER, s_peer_endpoint, false, rid);
    cr_assert_not_null(sock, "%s", dt_last_error());
    return sock;
}

static void s_no_free(void *data, void *hint) {}

/* Sends a REGION of transfer from `sender` (as its header says): float32 of n elements at data (sent
 * in place), or, data NULL, a failure that says error. */
static void s_region(zsock_t *peer, uint32_t sender, uint64_t transfer, const float *data, int64_t n,
                     const char *error)
{
    mb_writer body = {0};
    mb_encode_region(&body, transfer, data ? 0 : DT_EKERNEL, DT_FLOAT32, 1, (const int64_t[]){n}, data ? NULL : error,
                     0, 0, 0, NULL, -1, 0, 0, 0);
    mb_header h = {MB_VERSION, MB_PEER, 0, sender, 1};
    size_t size = body.size;
    mb_buf frame = {(void *)data, (size_t)n * sizeof *data, s_no_free, NULL};
    cr_assert_eq(mb_send(peer, NULL, 0, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, &frame,
                         data ? 1 : 0), 0);
}

/* An ASSEMBLE of piece id (float32 of n) from transfer, sent by device 1, and a FETCH of it. */
static void s_assemble_and_fetch(uint64_t id, int64_t n, uint64_t transfer)
{
    mb_writer w = {0};
    const int64_t shape[] = {n}, origin[] = {0};
    mb_encode_assemble(&w, id, DT_FLOAT32, 1, shape, 0, false, 1);
    mb_encode_part(&w, MB_PART_COPY, DT_REDUCE_SUM, 1, transfer, 1, origin, 1, origin, 1, shape, 0);
    mb_encode_fetch(&w, id, 2, 0);
    s_send_batch(&w, 2);
}

Test(peer, only_the_run_s_workers_are_heard_each_as_itself, .timeout = 60)
{
    s_start();
    static const float forged[4] = {4242, 4242, 4242, 4242}, genuine[4] = {1, 2, 3, 4};
    char own[MB_RID_MAX], other[MB_RID_MAX];
    mb_rid_format(own, 'w', 1, S_TOKEN);
    mb_rid_format(other, 'w', 1, "ffeeddccbbaa99887766554433221100");
    /* a stranger under device 1's plain name, one with a made-up secret, and device 1's genuine link
     * naming device 2 in its header: all before the ASSEMBLE, which would take what waits */
    zsock_t *plain = s_peer("w1"), *guessed = s_peer(other), *peer = s_peer(own);
    s_region(plain, 1, 5, forged, 4, NULL);
    s_region(guessed, 1, 5, forged, 4, NULL);
    s_region(peer, 2, 5, forged, 4, NULL);
    int64_t stats[MB_NSTATS];
    s_stats_when(stats, MB_STAT_peer_messages_refused, 3);
    cr_expect_eq(stats[MB_STAT_peer_messages_refused], 3);
    cr_expect_eq(stats[MB_STAT_peer_messages_received], 0, "nothing of theirs was taken in");

    s_assemble_and_fetch(10, 4, 5);
    s_region(peer, 1, 5, genuine, 4, NULL);
    float got[4];
    s_reply(got, sizeof got, NULL, 0);
    cr_expect(memcmp(got, genuine, sizeof got) == 0, "assembled %g %g %g %g, not the genuine 1 2 3 4", got[0], got[1],
              got[2], got[3]);
    s_stats(stats);
    cr_expect_eq(stats[MB_STAT_peer_messages_received], 1);
    cr_expect_eq(stats[MB_STAT_peer_messages_refused], 3);
    mb_socket_destroy(&plain);
    mb_socket_destroy(&guessed);
    mb_socket_destroy(&peer);
    s_stop_worker();
}

Test(peer, regions_nobody_claims_are_bounded_in_count, .timeout = 120)
{
    s_start();
    char own[MB_RID_MAX];
    mb_rid_format(own, 'w', 1, S_TOKEN);
    zsock_t *peer = s_peer(own);
    /* failures, the smallest regions there are, for transfers no ASSEMBLE names */
    for (uint64_t t = 0; t < ACT_RECV_MAX + 2; t++)
        s_region(peer, 1, 1000 + t, NULL, 1, "a failure nobody claims");
    int64_t stats[MB_NSTATS];
    s_stats_when(stats, MB_STAT_peer_messages_received, ACT_RECV_MAX + 2);
    cr_expect_eq(stats[MB_STAT_peer_regions_dropped], 2, "two past the bound are dropped");
    /* one that was kept is still there for its ASSEMBLE */
    char error[512] = "";
    s_assemble_and_fetch(10, 1, 1000);
    s_reply(NULL, 0, error, sizeof error);
    cr_expect(strstr(error, "a failure nobody claims"), "%s", error);
    mb_socket_destroy(&peer);
    s_stop_worker();
}

Test(peer, regions_nobody_claims_are_bounded_in_bytes, .timeout = 120)
{
    /* five regions of 1 GiB, sent in place out of a mapping nobody writes: no memory is used */
    const int64_t n = (1ll << 30) / (int64_t)sizeof(float);
    size_t bytes = (size_t)n * sizeof(float);
    float *space = mmap(NULL, 5 * bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    cr_assert_neq(space, MAP_FAILED);
    s_start();
    char own[MB_RID_MAX];
    mb_rid_format(own, 'w', 1, S_TOKEN);
    zsock_t *peer = s_peer(own);
    for (uint64_t t = 0; t < 5; t++)
        s_region(peer, 1, 100 + t, space + t * (size_t)n, n, NULL);
    int64_t stats[MB_NSTATS];
    s_stats_when(stats, MB_STAT_peer_messages_received, 5);
    cr_expect_eq(stats[MB_STAT_peer_regions_dropped], (int64_t)(5 - ACT_RECV_MAX_BYTES / bytes));
    /* the ASSEMBLE of the one let go fails saying why, at once */
    char error[512] = "";
    s_assemble_and_fetch(10, 1, 104);
    s_reply(NULL, 0, error, sizeof error);
    cr_expect(strstr(error, "was let go on arrival") && strstr(error, "already waiting to be assembled"), "%s", error);
    mb_socket_destroy(&peer);
    s_stop_worker();
    munmap(space, 5 * bytes);
}

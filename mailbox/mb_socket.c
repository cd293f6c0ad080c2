/* mb_socket — actor messages over one ZeroMQ socket, payloads sent in place. */
#include "mb_socket.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include "dt_error.h"

/* Linger bounds how long closing a socket (and ZeroMQ's context teardown at exit) waits for
 * queued messages to reach their peer. 0 would drop the last message a worker sends before it
 * exits (its BYE); unbounded would hang exit forever when that peer is already dead. */
#define MB_LINGER_MS 1000
#define MB_SOCKET_MARGIN 16 /* sockets left to CZMQ and ZeroMQ themselves */
#define MB_SPARE_FDS 8      /* descriptors that must be free before a socket is made */

static pthread_once_t s_sigonce = PTHREAD_ONCE_INIT;
static atomic_int s_open;   /* sockets made here and not destroyed yet */
static pthread_mutex_t s_make_lock = PTHREAD_MUTEX_INITIALIZER;
static int s_limit;         /* how many ZeroMQ allows this process */

/* Before the first socket: CZMQ installs SIGINT/SIGTERM handlers on first use, which would take
 * Ctrl-C from the host program (Python), so they are turned off (the runtime reports interrupts
 * through its own wait hooks); and ZeroMQ's socket limit (1024 by default: a mesh of 32 thread
 * workers needed more) is raised to what the process's file limit allows, every socket holding
 * one descriptor. */
static void s_first_use(void)
{
    zsys_handler_set(NULL);
    struct rlimit files = {0, 0};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        setrlimit(RLIMIT_NOFILE, &files);
        getrlimit(RLIMIT_NOFILE, &files);
    }
    zsys_set_max_sockets(0); /* 0: as many as ZeroMQ supports; the file limit may say fewer */
    size_t limit = zsys_socket_limit();
    if (files.rlim_cur > 0 && files.rlim_cur < limit)
        limit = (size_t)files.rlim_cur;
    s_limit = limit > INT_MAX ? INT_MAX : (int)limit;
}

int64_t mb_max_frame(void)
{
    /* a frame is received whole into this host's memory before anything reads it */
    struct sysinfo si;
    uint64_t held = sysinfo(&si) == 0 ? ((uint64_t)si.totalram + si.totalswap) * si.mem_unit : 0;
    uint64_t bound = held > 0 && held < MB_MAX_PIECE ? held : MB_MAX_PIECE;
    const char *env = getenv("DTORCH_MAX_FRAME_MB");
    char *end;
    long long mb = env && *env ? strtoll(env, &end, 10) : 0;
    if (env && *env && *end == 0 && mb > 0 && (uint64_t)mb < bound >> 20)
        bound = (uint64_t)mb << 20;
    return (int64_t)(bound > MB_MAX_BODY ? bound : MB_MAX_BODY);
}

zsock_t *mb_socket_new(mb_role role, const char *endpoint, bool bind, const char *routing_id)
{
    return mb_socket_open(role, endpoint, bind, routing_id, NULL);
}

void mb_socket_init(void) { pthread_once(&s_sigonce, s_first_use); }

zsock_t *mb_socket_open(mb_role role, const char *endpoint, bool bind, const char *routing_id, const mb_curve *curve)
{
    mb_socket_init();
    size_t idlen = routing_id ? strlen(routing_id) : 0;
    if (routing_id && (idlen == 0 || idlen > MB_MAX_ROUTING_ID)) {
        dt_err(DT_EINVAL, "routing id must have 1..%d bytes", MB_MAX_ROUTING_ID);
        return NULL;
    }
    /* CZMQ aborts the process when ZeroMQ refuses a socket (too many sockets, or no file descriptor
     * for its mailbox): refuse first. Under a lock that every socket here is made under: below
     * ZeroMQ's count, and a few descriptors free (taken and given back at once; closing a ZeroMQ
     * socket frees its descriptor only later, so a trial socket would not tell) */
    int type = role == MB_ROUTER ? ZMQ_ROUTER : ZMQ_DEALER;
    pthread_mutex_lock(&s_make_lock);
    int spare[MB_SPARE_FDS], got = 0;
    bool room = atomic_load(&s_open) < s_limit - MB_SOCKET_MARGIN;
    while (room && got < MB_SPARE_FDS && (spare[got] = dup(STDERR_FILENO)) >= 0)
        got++;
    for (int i = 0; i < got; i++)
        close(spare[i]);
    zsock_t *sock = room && got == MB_SPARE_FDS ? zsock_new(type) : NULL;
    if (sock)
        atomic_fetch_add(&s_open, 1);
    pthread_mutex_unlock(&s_make_lock);
    if (!sock) {
        dt_err(DT_ESYS, "cannot create a socket: %s (%d open here; the process allows %d: raise the open-file "
               "limit, ulimit -n)", room ? "no file descriptors left" : "too many sockets", atomic_load(&s_open),
               s_limit);
        return NULL;
    }
    zsock_set_sndhwm(sock, 0);
    zsock_set_rcvhwm(sock, 0);
    zsock_set_linger(sock, MB_LINGER_MS);
    /* a peer that announces a larger frame is cut off at the frame's header, before ZeroMQ allocates
     * it (inproc carries no frames of bytes, so it is unaffected); set now: a link takes the bound
     * its socket had when it was bound or connected */
    int64_t max_frame = mb_max_frame();
    zmq_setsockopt(zsock_resolve(sock), ZMQ_MAXMSGSIZE, &max_frame, sizeof max_frame);
    if (routing_id)
        zsock_set_identity(sock, routing_id);
    if (curve && mb_curve_apply(sock, curve) != 0) {
        mb_socket_destroy(&sock);
        return NULL;
    }
    int rc = !endpoint ? 0 : bind ? zsock_bind(sock, "%s", endpoint) : zsock_connect(sock, "%s", endpoint);
    if (rc == -1) {
        dt_err(DT_ESYS, "cannot %s %s: %s", bind ? "bind" : "connect", endpoint,
               zmq_strerror(zmq_errno()));
        mb_socket_destroy(&sock);
    }
    return sock;
}

void mb_buf_free(void *data, void *hint) { free(data); }

void mb_socket_destroy(zsock_t **sock)
{
    if (*sock)
        atomic_fetch_sub(&s_open, 1);
    zsock_destroy(sock);
}

static void s_release(const mb_buf *b)
{
    if (b->free_fn)
        b->free_fn(b->data, b->hint);
}

/* Sends one frame; the buffer belongs to ZeroMQ (or is released) whatever happens. The free
 * function signatures of mb_buf and zmq_msg_init_data are the same, so no adapter is needed. */
static int s_send_frame(void *handle, const mb_buf *b, int flags)
{
    zmq_msg_t msg;
    if (b->free_fn) {
        if (zmq_msg_init_data(&msg, b->data, b->size, b->free_fn, b->hint) == -1) {
            s_release(b);
            return dt_err(DT_ENOMEM, "cannot create a frame of %zu bytes", b->size);
        }
    } else {
        if (zmq_msg_init_size(&msg, b->size) == -1)
            return dt_err(DT_ENOMEM, "cannot create a frame of %zu bytes", b->size);
        if (b->size)
            memcpy(zmq_msg_data(&msg), b->data, b->size);
    }
    int rc;
    while ((rc = zmq_msg_send(&msg, handle, flags)) == -1 && zmq_errno() == EINTR)
        ;
    if (rc == -1) {
        int err = zmq_errno();
        zmq_msg_close(&msg);
        return dt_err(DT_ESYS, "send failed: %s", zmq_strerror(err));
    }
    return 0;
}

int mb_send(zsock_t *sock, const void *routing_id, size_t routing_id_len, const mb_header *h,
            mb_buf body, const mb_buf *payloads, int npayloads)
{
    void *handle = zsock_resolve(sock);
    char hbuf[MB_MAX_HEADER];
    mb_buf head = {hbuf, mb_header_encode(h, hbuf), NULL, NULL};
    mb_buf rid = {(void *)routing_id, routing_id_len, NULL, NULL};
    int rc = 0;
    if (routing_id)
        rc = s_send_frame(handle, &rid, ZMQ_SNDMORE);
    if (rc == 0)
        rc = s_send_frame(handle, &head, ZMQ_SNDMORE);
    if (rc == 0)
        rc = s_send_frame(handle, &body, npayloads > 0 ? ZMQ_SNDMORE : 0);
    else
        s_release(&body);
    for (int i = 0; i < npayloads; i++) {
        if (rc == 0)
            rc = s_send_frame(handle, &payloads[i], i + 1 < npayloads ? ZMQ_SNDMORE : 0);
        else
            s_release(&payloads[i]);
    }
    return rc;
}

static int s_recv_frame(void *handle, zmq_msg_t *msg, int flags)
{
    int rc;
    while ((rc = zmq_msg_recv(msg, handle, flags)) == -1 && zmq_errno() == EINTR)
        ;
    return rc;
}

/* Moves n frames to a new array of cap; frames are relocated with zmq_msg_move, never memcpy. */
static int s_resize(zmq_msg_t **arr, int n, int cap)
{
    zmq_msg_t *moved = malloc((size_t)cap * sizeof *moved);
    if (!moved)
        return dt_err(DT_ENOMEM, "out of memory receiving %d payload frames", cap);
    for (int i = 0; i < n; i++) {
        zmq_msg_init(&moved[i]);
        zmq_msg_move(&moved[i], &(*arr)[i]);
    }
    free(*arr);
    *arr = moved;
    return 0;
}

static int s_push(zmq_msg_t **arr, int *n, int *cap, zmq_msg_t *frame)
{
    if (*n == *cap) {
        int ncap = *cap ? 2 * *cap : 4;
        int rc = s_resize(arr, *n, ncap);
        if (rc)
            return rc;
        *cap = ncap;
    }
    zmq_msg_init(&(*arr)[*n]);
    zmq_msg_move(&(*arr)[(*n)++], frame);
    return 0;
}

/* Stores frame number index of a message (0: routing id, 1: header, 2: body, then payloads): a
 * record names at most one payload frame, so a message has no more of them than its header counts
 * records. */
static int s_take_frame(mb_message *m, int index, zmq_msg_t *frame, int *cap)
{
    size_t size = zmq_msg_size(frame);
    switch (index) {
    case 0:
        if (size > MB_MAX_ROUTING_ID)
            return dt_err(DT_EPROTO, "routing id of %zu bytes", size);
        memcpy(m->routing_id, zmq_msg_data(frame), size);
        m->routing_id_len = size;
        return 0;
    case 1: return mb_header_decode(zmq_msg_data(frame), size, &m->header);
    case 2: return zmq_msg_move(&m->body, frame) == 0 ? 0 : dt_err(DT_ESYS, "frame move failed");
    default:
        if ((uint32_t)m->npayloads >= m->header.count)
            return dt_err(DT_EPROTO, "more payload frames than the %u records its header counts", m->header.count);
        return s_push(&m->payloads, &m->npayloads, cap, frame);
    }
}

int mb_recv(zsock_t *sock, bool router, bool dontwait, mb_message *m)
{
    void *handle = zsock_resolve(sock);
    memset(m, 0, sizeof *m);
    zmq_msg_init(&m->body);
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (s_recv_frame(handle, &frame, dontwait ? ZMQ_DONTWAIT : 0) == -1) {
        int err = zmq_errno();
        zmq_msg_close(&frame);
        if (dontwait && err == EAGAIN)
            return 1;
        return dt_err(DT_ESYS, "receive failed: %s", zmq_strerror(err));
    }

    /* Every frame of the message is read even after an error, so the next call starts at the
     * next message; ZeroMQ delivers a multi-part message whole, so these reads never block. */
    int rc = 0, cap = 0, index = router ? 0 : 1;
    for (;; index++) {
        bool more = zmq_msg_more(&frame); /* read before the frame is moved out */
        if (rc == 0)
            rc = s_take_frame(m, index, &frame, &cap);
        zmq_msg_close(&frame);
        if (!more)
            break;
        zmq_msg_init(&frame);
        if (s_recv_frame(handle, &frame, 0) == -1) {
            rc = dt_err(DT_ESYS, "receive failed: %s", zmq_strerror(zmq_errno()));
            zmq_msg_close(&frame);
            break;
        }
    }
    if (rc == 0 && index < 2)
        rc = dt_err(DT_EPROTO, "message of %d frames lacks a %s", router ? index + 1 : index,
                    index < 1 ? "header" : "body");
    /* callers get exactly npayloads frames, not the spare capacity of the growing array */
    if (rc == 0 && cap != m->npayloads)
        rc = s_resize(&m->payloads, m->npayloads, m->npayloads);
    if (rc)
        mb_message_close(m);
    return rc;
}

void mb_message_close(mb_message *m)
{
    zmq_msg_close(&m->body);
    zmq_msg_init(&m->body);
    for (int i = 0; i < m->npayloads; i++)
        zmq_msg_close(&m->payloads[i]);
    free(m->payloads);
    m->payloads = NULL;
    m->npayloads = 0;
}

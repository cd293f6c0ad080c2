/* mb_socket — sending and receiving actor messages over one ZeroMQ socket, any transport
 * (inproc://, ipc://, tcp://), with payload frames sent without copies where ZeroMQ allows.
 *
 * Sockets are not thread-safe: each mb socket is created and used by one thread.
 * High-water marks are off (0): callers bound traffic with credit windows instead, because a
 * ROUTER silently drops messages at its high-water mark.
 */
#ifndef MB_SOCKET_H
#define MB_SOCKET_H

#include <czmq.h>
#include <stdbool.h>
#include <stddef.h>

#include "mb_codec.h"
#include "mb_curve.h"

typedef enum { MB_ROUTER, MB_DEALER } mb_role;

/* A block of bytes to send. free_fn NULL: copied at send time; otherwise sent in place and
 * free_fn(data, hint) runs (on any thread) once ZeroMQ is done with it, also when a send fails. */
typedef struct {
    void *data;
    size_t size;
    void (*free_fn)(void *data, void *hint);
    void *hint;
} mb_buf;

/* The free_fn of a buffer from malloc. */
void mb_buf_free(void *data, void *hint);

/* The largest frame a socket made here accepts from a link (ZMQ_MAXMSGSIZE): a peer that announces
 * a larger one is disconnected before it is allocated. A frame holds at most one piece (MB_MAX_PIECE
 * bytes) and is received whole into this host's memory, so the bound is the smaller of the two (the
 * memory counted as RAM and swap); DTORCH_MAX_FRAME_MB (MiB) lowers it for a deployment that knows its
 * largest piece, never below MB_MAX_BODY. Read each time a socket is made. */
int64_t mb_max_frame(void);

/* A received message. Payload frames may be kept beyond mb_message_close by moving them out
 * (zmq_msg_move) — workers adopt them as tensor storage without a copy. */
#define MB_MAX_ROUTING_ID 255
typedef struct {
    uint8_t routing_id[MB_MAX_ROUTING_ID]; /* ROUTER only */
    size_t routing_id_len;
    mb_header header;
    zmq_msg_t body;
    int npayloads;
    zmq_msg_t *payloads; /* npayloads frames */
} mb_message;

/* Creates a socket and binds (bind=true) or connects it to endpoint (NULL: neither, the caller
 * connects it). routing_id: the identity the other side sees (NULL for none). NULL +
 * dt_last_error on failure, also when the process is out of sockets (never an abort). */
/* What must come before this process's first ZeroMQ socket, anyone's (done by mb_socket_new). */
void mb_socket_init(void);
zsock_t *mb_socket_new(mb_role role, const char *endpoint, bool bind, const char *routing_id);
/* The same with CURVE on the link (curve NULL: none), set before it binds or connects. */
zsock_t *mb_socket_open(mb_role role, const char *endpoint, bool bind, const char *routing_id, const mb_curve *curve);
void mb_socket_destroy(zsock_t **sock);

/* Sends [routing_id] header body payloads... as one message. Takes ownership of body and
 * payloads in every case (their free_fn runs even on failure). 0 or DT_ESYS. */
int mb_send(zsock_t *sock, const void *routing_id, size_t routing_id_len, const mb_header *h,
            mb_buf body, const mb_buf *payloads, int npayloads);

/* Receives one message (blocking unless dontwait). Strict: a message with a malformed header
 * or the wrong frame count (fewer than a header and a body, or more payload frames than the header
 * counts records) is drained and rejected with DT_EPROTO. Returns 0, DT_EPROTO,
 * DT_ESYS, or 1 when dontwait and nothing is waiting. On 0, close m with mb_message_close. */
int mb_recv(zsock_t *sock, bool router, bool dontwait, mb_message *m);
void mb_message_close(mb_message *m);

#endif

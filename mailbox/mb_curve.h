/* mb_curve — ZeroMQ CURVE on the links that leave a host: key pairs, the one client key a process
 * accepts, and tcp endpoints read and written from their parts.
 *
 * A run has two key pairs. The controller's (made at its start, or loaded) proves the controller
 * to its workers; the workers' one pair (made by `dtorch-worker --keygen`, its secret handed to
 * every worker host by the launch) proves each worker to the controller and to the other workers.
 * A CURVE server accepts exactly one client key: CZMQ's zauth actor checks every handshake
 * against it, so a peer without the secret is refused before a byte of its reaches dtorch.
 */
#ifndef MB_CURVE_H
#define MB_CURVE_H

#include <czmq.h>
#include <stdbool.h>
#include <stdint.h>

#define MB_KEY_CHARS 40 /* a key in Z85 text */

typedef struct {
    char public_key[MB_KEY_CHARS + 1];
    char secret_key[MB_KEY_CHARS + 1]; /* "" when only the public half is known */
} mb_keypair;

/* One side's keys on a socket: own pair, and the server's public key when it connects as a
 * client (NULL or "" for the server side of a link). */
typedef struct {
    const mb_keypair *own;
    const char *server_key;
} mb_curve;

int mb_keys_generate(mb_keypair *out);
/* Writes pub (the public key) and pub + "_secret" (both halves, mode 0600), CZMQ's zcert format. */
int mb_keys_save(const mb_keypair *keys, const char *path);
/* Reads a key pair: `text` is a certificate file (with its `_secret` file when need_secret; a
 * path to the `_secret` file itself works too) or, for a public key alone, its 40 Z85
 * characters. DT_EINVAL naming what is wrong. */
int mb_keys_load(const char *text, bool need_secret, mb_keypair *out);

/* From now on, every CURVE server socket of this process accepts only clients holding the secret
 * of client_public_key (a zauth actor; calling again replaces the key). */
int mb_curve_accept(const char *client_public_key);
void mb_curve_stop(void);

/* Applies curve to sock before it binds or connects. */
int mb_curve_apply(zsock_t *sock, const mb_curve *curve);

/* A tcp endpoint read strictly: "tcp://A.B.C.D:PORT" with a numeric IPv4 address (PORT 1-65535;
 * allow_any: also "*" or 0, and host "*" or "0.0.0.0" for a bind). 0 or DT_EINVAL. */
typedef struct {
    uint8_t addr[4];
    bool any_addr;   /* "*" */
    int port;        /* 0: any */
} mb_tcp_addr;

int mb_tcp_parse(const char *text, bool allow_any, mb_tcp_addr *out);
/* Writes the endpoint back from its parts ("tcp://A.B.C.D:PORT"). */
void mb_tcp_format(const mb_tcp_addr *a, char *buf, size_t size);

#endif

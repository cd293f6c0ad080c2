/* mb_rid — the routing ids of actor sockets, and the run's secret that local worker processes
 * carry in them.
 *
 * A worker names its sockets "<kind><device>": 'd' its link to the controller, 'h' its heartbeat
 * socket, 'w' its links to other workers' peer sockets. Worker processes the controller started
 * on its own host add ".<token>", the run's secret, which the controller handed each of them over
 * an inherited pipe and nobody else has: a ROUTER hears a message only under the routing id of the
 * link it came on, so a message whose routing id carries the token came from a worker of this run,
 * and the device it names is the one that worker serves. Another process of the same user that
 * connects to a socket of the run's directory cannot say a word under a worker's name, nor take
 * a name away from the worker it belongs to (a ROUTER refuses a second link under a name in use).
 * Worker threads (inproc: nothing outside the process reaches them) and workers on other hosts
 * (tcp, where CURVE authenticates every link) use no token.
 */
#ifndef MB_RID_H
#define MB_RID_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MB_TOKEN_BYTES 16                   /* random bytes of a run's secret */
#define MB_TOKEN_CHARS (2 * MB_TOKEN_BYTES) /* ... written as this many lowercase hex digits */
#define MB_RID_MAX 48                       /* room for any routing id made here, with its NUL */

/* A fresh secret from the kernel's random source, MB_TOKEN_CHARS hex digits and a NUL into
 * out (MB_TOKEN_CHARS + 1 bytes). 0 or DT_ESYS. */
int mb_token_new(char *out);
/* Whether text is a token as mb_token_new writes it (its length and digits). */
bool mb_token_valid(const char *text, size_t len);
/* "<kind><device>", and ".<token>" when token is not empty, into buf (MB_RID_MAX bytes). */
void mb_rid_format(char *buf, char kind, int64_t device, const char *token);
/* The device that routing id names as kind, when it is exactly what mb_rid_format makes of that
 * device and token (the token compared in constant time); -1 when it is not. */
int64_t mb_rid_device(const uint8_t *rid, size_t len, char kind, const char *token);

#endif

/* fake_worker — a stand-in for dtorch-worker that connects like it and says a wrong hello, for
 * the tests of the controller's refusal. DTORCH_FAKE_HELLO picks what is wrong: "protocol" (the
 * next protocol version), "registry" (another op registry), "type" (another device type) or
 * "garbage" (a body that is no HELLO record). It then waits to be killed. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "mb_schema.h"
#include "mb_socket.h"
#include "op_registry.h"

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *how = getenv("DTORCH_FAKE_HELLO");
    int64_t device = -1;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--connect") == 0)
            endpoint = argv[i + 1];
        else if (strcmp(argv[i], "--device") == 0)
            device = strtoll(argv[i + 1], NULL, 10);
    }
    if (!endpoint || device < 0 || !how)
        return 2;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    zsys_handler_set(NULL);
    char rid[32];
    snprintf(rid, sizeof rid, "d%" PRId64, device);
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
        mb_encode_hello(&body, device, (int64_t)getpid(), protocol, registry, type);
    }
    mb_header h = {MB_VERSION, MB_HELLO, 0, (uint32_t)device, 1};
    size_t size = body.size;
    mb_send(sock, NULL, 0, &h, (mb_buf){mb_w_release(&body), size, mb_buf_free, NULL}, NULL, 0);
    for (int i = 0; i < 300; i++)
        usleep(100000);
    mb_socket_destroy(&sock);
    return 0;
}

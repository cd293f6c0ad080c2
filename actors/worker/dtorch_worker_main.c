/* dtorch-worker — device actors in a process of their own.
 *
 * Started by the controller on its own host (process workers), never by hand:
 *     dtorch-worker --connect ipc://DIR/control-N --device ID [--device-type TYPE] --run-fd FD
 *   FD is the read end of a pipe from the controller's process: the run's secret (mb_rid.h), then
 *   nothing until that process ends, however it ends; the worker then leaves at once.
 * Started on any host by the site's launcher, for a controller that listens (dtorch.init(listen=...)):
 *     dtorch-worker --connect tcp://HOST:PORT --devices TYPE:IDS --key FILE --server-key KEY
 *                   [--peer-address IP] [--silent-timeout S] [--connect-timeout S] [--insecure]
 *   IDS are global device ids ("0-3", "4,5,8-11"), one thread each; --key is the workers' key pair
 *   (FILE and FILE_secret), --server-key the controller's public key (its 40 characters or a key
 *   file); --insecure runs tcp in plaintext, with no authentication. The workers leave when the
 *   controller says bye or has been silent for S seconds (DTORCH_SILENT_TIMEOUT, default 3), or
 *   has not said a first word in --connect-timeout seconds (DTORCH_CONNECT_TIMEOUT, default 60: a
 *   worker may be started before its controller listens).
 * Making the workers' key pair:
 *     dtorch-worker --keygen FILE          (writes FILE and FILE_secret, mode 0600)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "act_common.h"
#include "dt_error.h"
#include "mb_curve.h"
#include "mb_rid.h"

#define S_MAX_DEVICES 1024 /* devices one process serves */

#define S_USAGE                                                                                      \
    "usage: dtorch-worker --connect tcp://HOST:PORT --devices TYPE:IDS --key FILE --server-key KEY\n"    \
    "                     [--peer-address IP] [--silent-timeout S] [--connect-timeout S] [--insecure]\n" \
    "       dtorch-worker --keygen FILE\n"                                                              \
    "Serves the devices IDS (\"cpu:0-3\", \"cpu:4,5,8-11\") of a controller that listens on tcp (see\n"   \
    "docs/LAUNCH.md); --keygen writes a key pair. Local worker processes are started by the controller\n" \
    "itself (dtorch.init(workers=\"process\")), never by hand.\n"

static int s_usage(const char *why)
{
    fprintf(stderr, "dtorch-worker: %s\n" S_USAGE, why);
    return 2;
}

/* The secret at the start of the controller's pipe (fd), then a thread that waits for the pipe's end:
 * only the controller's process holds its write end, so the end comes when that process ends, by an
 * exit, a crash or kill -9, and the worker leaves at once (what it holds is of use to nobody then). */
static void *s_watch_controller(void *arg)
{
    int fd = (int)(intptr_t)arg;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        char byte;
        ssize_t n = poll(&p, 1, -1) < 0 ? -1 : read(fd, &byte, 1);
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN))
            _exit(0);
    }
    return NULL;
}

static int s_read_secret(int fd, char *token)
{
    size_t got = 0;
    while (got < MB_TOKEN_CHARS) {
        ssize_t n = read(fd, token + got, MB_TOKEN_CHARS - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        got += (size_t)n;
    }
    token[got] = 0;
    pthread_t watcher;
    if (!mb_token_valid(token, got) ||
        pthread_create(&watcher, NULL, s_watch_controller, (void *)(intptr_t)fd) != 0)
        return -1;
    pthread_detach(watcher);
    return 0;
}

/* "cpu:0-3,8" -> type "cpu", ids 0 1 2 3 8. */
static int s_parse_devices(const char *text, char *type, size_t type_size, int64_t *ids, int *n)
{
    const char *colon = strchr(text, ':');
    if (!colon || colon == text || (size_t)(colon - text) >= type_size)
        return -1;
    snprintf(type, type_size, "%.*s", (int)(colon - text), text);
    *n = 0;
    const char *p = colon + 1;
    while (*p) {
        char *end;
        long long a = strtoll(p, &end, 10), b = a;
        if (end == p || a < 0 || a > DT_MAX_DEVICE_ID)
            return -1;
        p = end;
        if (*p == '-') {
            b = strtoll(p + 1, &end, 10);
            if (end == p + 1 || b < a || b > DT_MAX_DEVICE_ID)
                return -1;
            p = end;
        }
        for (long long d = a; d <= b; d++) {
            if (*n >= S_MAX_DEVICES)
                return -1;
            ids[(*n)++] = d;
        }
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return *n > 0 ? 0 : -1;
}

/* The address of this host that the controller's host is reached from: where peers will reach
 * this one too (a connected UDP socket sends nothing; it only picks the route). */
static int s_peer_address(const char *endpoint, char *out, size_t size)
{
    const char *host = endpoint + 6, *colon = strrchr(host, ':');
    if (!colon || colon == host)
        return dt_err(DT_EINVAL, "'%s' is not tcp://HOST:PORT", endpoint);
    char name[256];
    snprintf(name, sizeof name, "%.*s", (int)(colon - host), host);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *found = NULL;
    if (getaddrinfo(name, colon + 1, &hints, &found) != 0 || !found)
        return dt_err(DT_EINVAL, "cannot resolve the controller's host '%s' to an IPv4 address", name);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in self;
    socklen_t len = sizeof self;
    int rc = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                     getsockname(fd, (struct sockaddr *)&self, &len) == 0
                 ? 0 : -1;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(found);
    if (rc != 0 || !inet_ntop(AF_INET, &self.sin_addr, out, (socklen_t)size))
        return dt_err(DT_ESYS, "cannot find this host's address towards %s: pass --peer-address", name);
    return 0;
}

typedef struct {
    act_worker_link link;
    pthread_t thread;
    int rc;
    char error[DT_ERRMSG_MAX];
} s_device;

static void *s_device_main(void *arg)
{
    s_device *d = arg;
    char name[16];
    snprintf(name, sizeof name, "dtorch-dev%u", (unsigned)(d->link.device % 100000));
    pthread_setname_np(pthread_self(), name);
    d->rc = act_worker_serve(&d->link, NULL, NULL);
    if (d->rc != 0)
        snprintf(d->error, sizeof d->error, "%s", dt_last_error());
    return NULL;
}

/* Serves the devices of a listening controller, one thread each, until every one has left. */
static int s_serve_remote(const char *endpoint, const char *devices, const char *key, const char *server_key,
                          const char *peer_address, double silent_s, double connect_s, bool insecure)
{
    char type[16];
    static int64_t ids[S_MAX_DEVICES];
    int n;
    if (s_parse_devices(devices, type, sizeof type, ids, &n) != 0)
        return s_usage("--devices takes TYPE:IDS, e.g. cpu:0-3 or cpu:4,5 (at most 1024 ids)");
    static mb_keypair keys;
    char server[MB_KEY_CHARS + 1] = "";
    if (!insecure) {
        mb_keypair controller;
        if (!key || !server_key)
            return s_usage("a tcp controller needs --key (the workers' key pair) and --server-key (the controller's "
                           "public key); --insecure runs without them, unauthenticated and in plaintext");
        if (mb_keys_load(key, true, &keys) != 0 || mb_keys_load(server_key, false, &controller) != 0) {
            fprintf(stderr, "dtorch-worker: %s\n", dt_last_error());
            return 2;
        }
        snprintf(server, sizeof server, "%s", controller.public_key);
        /* this process's peer sockets admit the run's workers, who hold the same pair */
        if (mb_curve_accept(keys.public_key) != 0) {
            fprintf(stderr, "dtorch-worker: %s\n", dt_last_error());
            return 1;
        }
    } else {
        fprintf(stderr, "dtorch-worker: WARNING: --insecure: the links to %s and to other workers are neither "
                "authenticated nor encrypted\n", endpoint);
    }
    char address[INET_ADDRSTRLEN] = "";
    if (peer_address)
        snprintf(address, sizeof address, "%s", peer_address);
    else if (s_peer_address(endpoint, address, sizeof address) != 0) {
        fprintf(stderr, "dtorch-worker: %s\n", dt_last_error());
        return 2;
    }
    s_device *ds = calloc((size_t)n, sizeof *ds);
    if (!ds)
        return 1;
    for (int i = 0; i < n; i++) {
        ds[i].link = (act_worker_link){.endpoint = endpoint, .device = ids[i], .device_type = type, .remote = true,
                                       .keys = insecure ? NULL : &keys, .server_key = server,
                                       .peer_host = address, .silent_s = silent_s, .connect_s = connect_s};
        if (pthread_create(&ds[i].thread, NULL, s_device_main, &ds[i]) != 0) {
            ds[i].rc = -1;
            snprintf(ds[i].error, sizeof ds[i].error, "cannot start its thread");
            ds[i].thread = 0;
        }
    }
    int status = 0;
    for (int i = 0; i < n; i++) {
        if (ds[i].thread)
            pthread_join(ds[i].thread, NULL);
        if (ds[i].rc != 0) {
            fprintf(stderr, "dtorch-worker %lld: %s\n", (long long)ids[i], ds[i].error);
            status = 1;
        }
    }
    free(ds);
    mb_curve_stop();
    return status;
}

/* A worker process of the controller's own host: it reaches the controller at the ipc endpoint of the
 * run's directory and proves it is the run's with the secret from the controller's pipe, the only way
 * in. Anything else (an inproc endpoint, which no other process reaches; an ipc one without the pipe,
 * as by hand) is refused at once rather than left waiting for a controller that never answers. */
static int s_serve_local(const char *endpoint, long long device, const char *device_type, long long run_fd)
{
    if (!endpoint)
        return s_usage("--connect tcp://HOST:PORT is required");
    if (strncmp(endpoint, "ipc://", 6) != 0 || run_fd < 0)
        return s_usage("--connect takes tcp://HOST:PORT (with --devices); local worker processes are started by "
                       "the controller, over its own pipe");
    if (device < 0 || device > DT_MAX_DEVICE_ID)
        return s_usage("--device takes a device id from 0 to 65535");
    char token[MB_TOKEN_CHARS + 1];
    if (s_read_secret((int)run_fd, token) != 0) {
        fprintf(stderr, "dtorch-worker %lld: no secret from the controller on descriptor %lld\n", device, run_fd);
        return 2;
    }
    act_worker_link link = {.endpoint = endpoint, .device = device, .device_type = device_type, .token = token};
    int rc = act_worker_serve(&link, NULL, NULL);
    if (rc != 0)
        fprintf(stderr, "dtorch-worker %lld: %s\n", device, dt_last_error());
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    const char *endpoint = NULL, *device_type = "cpu", *devices = NULL, *key = NULL, *server_key = NULL;
    const char *peer_address = NULL, *keygen = NULL;
    long long device = -1, run_fd = -1;
    bool insecure = false;
    const char *env = getenv("DTORCH_SILENT_TIMEOUT");
    double silent_s = env && atof(env) > 0 ? atof(env) : ACT_SILENT_S;
    env = getenv("DTORCH_CONNECT_TIMEOUT");
    double connect_s = env && atof(env) > 0 ? atof(env) : ACT_CONNECT_S;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fputs(S_USAGE, stdout);
            return 0;
        }
        if (strcmp(argv[i], "--insecure") == 0) {
            insecure = true;
            continue;
        }
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (!value)
            return s_usage("missing value after an option");
        char *end;
        if (strcmp(argv[i], "--connect") == 0)
            endpoint = value;
        else if (strcmp(argv[i], "--device") == 0)
            device = strtoll(value, &end, 10);
        else if (strcmp(argv[i], "--device-type") == 0)
            device_type = value;
        else if (strcmp(argv[i], "--run-fd") == 0) {
            run_fd = strtoll(value, &end, 10);
            if (*end || run_fd < 0 || run_fd > INT32_MAX)
                return s_usage("--run-fd takes a file descriptor");
        } else if (strcmp(argv[i], "--devices") == 0)
            devices = value;
        else if (strcmp(argv[i], "--key") == 0)
            key = value;
        else if (strcmp(argv[i], "--server-key") == 0)
            server_key = value;
        else if (strcmp(argv[i], "--peer-address") == 0)
            peer_address = value;
        else if (strcmp(argv[i], "--silent-timeout") == 0) {
            silent_s = strtod(value, &end);
            if (*end || !(silent_s > 0))
                return s_usage("--silent-timeout takes seconds > 0");
        } else if (strcmp(argv[i], "--connect-timeout") == 0) {
            connect_s = strtod(value, &end);
            if (*end || !(connect_s > 0))
                return s_usage("--connect-timeout takes seconds > 0");
        } else if (strcmp(argv[i], "--keygen") == 0)
            keygen = value;
        else
            return s_usage("unknown option");
        i++;
    }
    if (keygen) {
        mb_keypair keys;
        if (mb_keys_generate(&keys) != 0 || mb_keys_save(&keys, keygen) != 0) {
            fprintf(stderr, "dtorch-worker: %s\n", dt_last_error());
            return 1;
        }
        printf("%s\n", keys.public_key);
        return 0;
    }
    /* Ctrl-C in the user's terminal is for the controller to act on, not for its workers */
    signal(SIGINT, SIG_IGN);
    if (devices) {
        if (!endpoint || strncmp(endpoint, "tcp://", 6) != 0)
            return s_usage("--devices serves a listening controller: --connect tcp://HOST:PORT");
        return s_serve_remote(endpoint, devices, key, server_key, peer_address, silent_s, connect_s, insecure);
    }
    if (endpoint && strncmp(endpoint, "tcp://", 6) == 0 && run_fd < 0)
        return s_usage("--connect tcp://HOST:PORT serves the devices that --devices names");
    return s_serve_local(endpoint, device, device_type, run_fd);
}

/* mb_curve — CURVE key pairs, the zauth actor that admits one client key, tcp endpoints. */
#include "mb_curve.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dt_error.h"
#include "mb_socket.h"

static bool s_is_key(const char *text)
{
    if (!text || strlen(text) != MB_KEY_CHARS)
        return false;
    uint8_t bin[32];
    return zmq_z85_decode(bin, text) != NULL;
}

int mb_keys_generate(mb_keypair *out)
{
    if (zmq_curve_keypair(out->public_key, out->secret_key) != 0)
        return dt_err(DT_EUNSUPPORTED, "cannot make a CURVE key pair: %s (libzmq without CURVE?)",
                      zmq_strerror(zmq_errno()));
    return 0;
}

/* A zcert of Z85 keys (secret NULL: a public key alone). */
static zcert_t *s_cert(const char *public_key, const char *secret_key)
{
    uint8_t pub[32], sec[32] = {0};
    if (!zmq_z85_decode(pub, public_key) || (secret_key && !zmq_z85_decode(sec, secret_key)))
        return NULL;
    return zcert_new_from(pub, sec);
}

int mb_keys_save(const mb_keypair *keys, const char *path)
{
    zcert_t *cert = s_cert(keys->public_key, keys->secret_key);
    if (!cert)
        return dt_err(DT_ENOMEM, "out of memory");
    zcert_set_meta(cert, "made-by", "dtorch-worker --keygen");
    /* zcert_save_secret makes the secret file 0600 */
    int rc = zcert_save(cert, path);
    zcert_destroy(&cert);
    if (rc != 0)
        return dt_err(DT_ESYS, "cannot write the key files %s and %s_secret: %s", path, path, strerror(errno));
    return 0;
}

int mb_keys_load(const char *text, bool need_secret, mb_keypair *out)
{
    memset(out, 0, sizeof *out);
    if (!text || !*text)
        return dt_err(DT_EINVAL, "no key given");
    if (!need_secret && s_is_key(text)) {
        snprintf(out->public_key, sizeof out->public_key, "%s", text);
        return 0;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s", text);
    size_t n = strlen(path);
    if (n > 7 && strcmp(path + n - 7, "_secret") == 0)
        path[n - 7] = 0; /* zcert_load takes the public file's name and reads the secret one beside it */
    struct stat st;
    char secret[4110];
    snprintf(secret, sizeof secret, "%s_secret", path);
    if (need_secret && stat(secret, &st) != 0)
        return dt_err(DT_EINVAL, "no secret key file %s (make one with: dtorch-worker --keygen %s)", secret, path);
    if (need_secret && (st.st_mode & 077))
        return dt_err(DT_EINVAL, "the secret key file %s can be read by others (mode %03o): chmod 600 it", secret,
                      (unsigned)(st.st_mode & 0777));
    if (!need_secret && stat(path, &st) != 0 && stat(secret, &st) != 0)
        return dt_err(DT_EINVAL, "'%s' is neither a key (40 Z85 characters) nor a key file", text);
    zcert_t *cert = zcert_load(path);
    if (!cert)
        return dt_err(DT_EINVAL, "cannot read the key file %s (it is not in zcert format)", path);
    snprintf(out->public_key, sizeof out->public_key, "%s", zcert_public_txt(cert));
    const char *sk = zcert_secret_txt(cert);
    bool has_secret = s_is_key(sk) && strcmp(sk, "0000000000000000000000000000000000000000") != 0;
    if (has_secret)
        snprintf(out->secret_key, sizeof out->secret_key, "%s", sk);
    zcert_destroy(&cert);
    if (!s_is_key(out->public_key))
        return dt_err(DT_EINVAL, "the key file %s holds no valid public key", path);
    if (need_secret && !has_secret)
        return dt_err(DT_EINVAL, "the key file %s_secret holds no valid secret key", path);
    return 0;
}

static pthread_mutex_t s_auth_lock = PTHREAD_MUTEX_INITIALIZER;
static zactor_t *s_auth;

int mb_curve_accept(const char *client_public_key)
{
    if (!s_is_key(client_public_key))
        return dt_err(DT_EINVAL, "the client key '%s' is not a CURVE public key (40 Z85 characters)",
                      client_public_key ? client_public_key : "");
    zcert_t *cert = s_cert(client_public_key, NULL);
    zcertstore_t *store = zcertstore_new(NULL); /* in memory: no file to keep or remove */
    if (!cert || !store) {
        zcert_destroy(&cert);
        zcertstore_destroy(&store);
        return dt_err(DT_ENOMEM, "out of memory");
    }
    zcertstore_insert(store, &cert);
    mb_socket_init(); /* the actor makes sockets of its own */
    pthread_mutex_lock(&s_auth_lock);
    zactor_destroy(&s_auth);
    s_auth = zactor_new(zauth, store); /* owns the store from here */
    int rc = s_auth ? 0 : dt_err(DT_ESYS, "cannot start the CURVE authenticator");
    pthread_mutex_unlock(&s_auth_lock);
    return rc;
}

void mb_curve_stop(void)
{
    pthread_mutex_lock(&s_auth_lock);
    zactor_destroy(&s_auth);
    pthread_mutex_unlock(&s_auth_lock);
}

int mb_curve_apply(zsock_t *sock, const mb_curve *curve)
{
    const mb_keypair *own = curve->own;
    if (!s_is_key(own->public_key) || !s_is_key(own->secret_key))
        return dt_err(DT_EINVAL, "a CURVE socket needs its own key pair");
    zsock_set_curve_publickey(sock, own->public_key);
    zsock_set_curve_secretkey(sock, own->secret_key);
    if (curve->server_key && *curve->server_key) {
        if (!s_is_key(curve->server_key))
            return dt_err(DT_EINVAL, "the server key '%s' is not a CURVE public key", curve->server_key);
        zsock_set_curve_serverkey(sock, curve->server_key);
    } else {
        zsock_set_curve_server(sock, 1);
        zsock_set_zap_domain(sock, "dtorch");
    }
    return 0;
}

static bool s_number(const char **p, long max, long *out)
{
    const char *s = *p;
    if (!isdigit((unsigned char)*s))
        return false;
    long v = 0;
    int digits = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s++ - '0');
        if (++digits > 5 || v > max)
            return false;
    }
    *p = s;
    *out = v;
    return true;
}

int mb_tcp_parse(const char *text, bool allow_any, mb_tcp_addr *out)
{
    memset(out, 0, sizeof *out);
    const char *p = text;
    if (!p || strncmp(p, "tcp://", 6) != 0)
        goto bad;
    p += 6;
    if (*p == '*' && allow_any) {
        out->any_addr = true;
        p++;
    } else {
        for (int i = 0; i < 4; i++) {
            long v;
            if (!s_number(&p, 255, &v) || (i < 3 && *p++ != '.'))
                goto bad;
            out->addr[i] = (uint8_t)v;
        }
    }
    if (*p++ != ':')
        goto bad;
    long port;
    if (*p == '*' && allow_any) {
        port = 0;
        p++;
    } else if (!s_number(&p, 65535, &port) || (port == 0 && !allow_any)) {
        goto bad;
    }
    if (*p)
        goto bad;
    out->port = (int)port;
    return 0;
bad:
    return dt_err(DT_EINVAL, "'%.80s' is not a tcp endpoint of the form tcp://A.B.C.D:PORT", text ? text : "");
}

void mb_tcp_format(const mb_tcp_addr *a, char *buf, size_t size)
{
    char port[12] = "*";
    if (a->port > 0)
        snprintf(port, sizeof port, "%d", a->port);
    if (a->any_addr)
        snprintf(buf, size, "tcp://*:%s", port);
    else
        snprintf(buf, size, "tcp://%u.%u.%u.%u:%s", a->addr[0], a->addr[1], a->addr[2], a->addr[3], port);
}

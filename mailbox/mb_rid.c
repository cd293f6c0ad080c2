/* mb_rid — routing ids that say which device a link serves, with the run's secret. */
#include "mb_rid.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "dt_error.h"
#include "dtorch.h"

int mb_token_new(char *out)
{
    uint8_t bytes[MB_TOKEN_BYTES];
    size_t got = 0;
    while (got < sizeof bytes) {
        ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return dt_err(DT_ESYS, "cannot read the kernel's random source: %s", strerror(errno));
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof bytes; i++)
        snprintf(out + 2 * i, 3, "%02x", bytes[i]);
    return 0;
}

bool mb_token_valid(const char *text, size_t len)
{
    if (len != MB_TOKEN_CHARS)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!((text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f')))
            return false;
    return true;
}

void mb_rid_format(char *buf, char kind, int64_t device, const char *token)
{
    if (token && token[0])
        snprintf(buf, MB_RID_MAX, "%c%" PRId64 ".%.*s", kind, device, MB_TOKEN_CHARS, token);
    else
        snprintf(buf, MB_RID_MAX, "%c%" PRId64, kind, device);
}

int64_t mb_rid_device(const uint8_t *rid, size_t len, char kind, const char *token)
{
    if (len < 2 || rid[0] != kind)
        return -1;
    /* the device in the one way mb_rid_format writes it: no sign, no leading zero */
    size_t at = 1;
    int64_t device = 0;
    while (at < len && at <= 6 && rid[at] >= '0' && rid[at] <= '9')
        device = 10 * device + (rid[at++] - '0');
    if (at == 1 || (rid[1] == '0' && at > 2) || device > DT_MAX_DEVICE_ID)
        return -1;
    size_t want = token ? strlen(token) : 0;
    if (want == 0)
        return at == len ? device : -1;
    if (len != at + 1 + want || rid[at] != '.')
        return -1;
    /* every byte looked at whatever the first difference: the time taken says nothing of where */
    uint8_t diff = 0;
    for (size_t i = 0; i < want; i++)
        diff |= rid[at + 1 + i] ^ (uint8_t)token[i];
    return diff == 0 ? device : -1;
}

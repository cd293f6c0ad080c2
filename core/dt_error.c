/* dt_error — each thread's last error: dt_err records a code and a formatted message. */
#include "dt_error.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local int s_code;
static _Thread_local char s_message[DT_ERRMSG_MAX];

int dt_err(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s_message, sizeof s_message, fmt, ap);
    va_end(ap);
    s_code = code;
    return code;
}

void dt_err_clear(void)
{
    s_code = 0;
    s_message[0] = '\0';
}

const char *dt_last_error(void) { return s_message; }

int dt_last_error_code(void) { return s_code; }

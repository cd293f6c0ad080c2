/* dt_error — the calling thread's last error (code + message), shared by every layer. */
#ifndef DT_ERROR_H
#define DT_ERROR_H

#include "dtorch.h"

#define DT_ERRMSG_MAX 512

/* Records code and a printf-style message for this thread; returns code (for `return dt_err(...)`). */
int dt_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Clears the calling thread's error. */
void dt_err_clear(void);

#endif

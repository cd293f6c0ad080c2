/* op_backend — the device backends this build has, found by device type. Adding a backend is
 * one line in s_backends (and its files in the build); nothing above ops/ changes. */
#include "op_backend.h"

#include <stdio.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_dnnl.h"
#include "dt_error.h"
#ifdef DTORCH_HAVE_CUDA
#include "cuda_backend.h"
#endif

static const op_backend *const s_backends[] = {
    &cpu_backend,
#ifdef DTORCH_HAVE_CUDA
    &cuda_backend,
#endif
};

#define S_NBACKENDS (int)(sizeof s_backends / sizeof s_backends[0])

/* Device types DeviceMesh knows by name; a build serves those it has a backend for. */
static const char *const s_known[] = {"cpu", "cuda"};

#define S_NKNOWN (int)(sizeof s_known / sizeof s_known[0])

const op_backend *op_backend_find(const char *device_type)
{
    for (int i = 0; device_type && i < S_NBACKENDS; i++)
        if (strcmp(s_backends[i]->name, device_type) == 0)
            return s_backends[i];
    return NULL;
}

const op_backend *op_backend_host(void) { return &cpu_backend; }

int64_t op_backend_onednn_convs(void) { return cpu_dnnl_convs(); }
int64_t op_backend_onednn_matmuls(void) { return cpu_dnnl_matmuls(); }

void op_backend_names(char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < S_NBACKENDS && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s'%s'", i ? ", " : "", s_backends[i]->name);
}

int op_backend_check(const char *op, const char *device_type)
{
    if (op_backend_find(device_type))
        return 0;
    char names[128];
    for (int i = 0; device_type && i < S_NKNOWN; i++)
        if (strcmp(s_known[i], device_type) == 0) {
            op_backend_names(names, sizeof names);
            return dt_err(DT_EDEVICE, "%s: the '%s' device backend is not available in this build (it has %s)", op,
                          device_type, names);
        }
    size_t used = 0;
    for (int i = 0; i < S_NKNOWN && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s'%s'", i == 0 ? "" : i == S_NKNOWN - 1 ? " or " : ", ",
                                 s_known[i]);
    return dt_err(DT_EINVAL, "%s: unknown device type '%s' (expected %s)", op, device_type ? device_type : "(null)",
                  names);
}

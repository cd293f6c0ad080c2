/* op_backend_cpu — the CPU device backend: pooled host memory and the ops' CPU kernels. */
#include <string.h>

#include "cpu_ops.h"
#include "dt_pool.h"
#include "op_backend.h"

static const char *s_run(const op_def *def, op_kernel *k)
{
    cpu_op_kernel kernel = cpu_kernel_for(def->id);
    return kernel ? kernel(k) : "the op has no CPU kernel";
}

const op_backend op_backend_cpu = {
    .name = "cpu",
    .alloc = dt_pool_alloc,
    .free = dt_pool_free,
    .run = s_run,
};

const op_backend *op_backend_for(const char *device_type)
{
    return strcmp(device_type, "cpu") == 0 ? &op_backend_cpu : NULL;
}

/* op_backend — what a device type provides to its worker actors: memory for pieces and the
 * running of op kernels. The CPU backend is the reference; a CUDA backend implements the same
 * table (device memory, cuBLAS/NCCL kernels) and workers never ask which one they have. */
#ifndef OP_BACKEND_H
#define OP_BACKEND_H

#include <stddef.h>

#include "op_registry.h"

typedef struct {
    const char *name;                                   /* the DeviceMesh device type it serves */
    void *(*alloc)(size_t size);                        /* memory for a piece; NULL when out of it */
    void (*free)(void *data, size_t size);              /* gives back what alloc returned */
    /* runs def's kernel on this device's pieces: NULL, or why it failed (the op has no kernel
     * for this device type, bad data such as an index out of range, memory) */
    const char *(*run)(const op_def *def, op_kernel *k);
} op_backend;

extern const op_backend op_backend_cpu;

/* The backend of a device type, or NULL. */
const op_backend *op_backend_for(const char *device_type);

#endif

/* cpu_backend — the CPU device backend's table (ops/op_backend.h); reach it through
 * op_backend_find("cpu") or op_backend_host(). */
#ifndef CPU_BACKEND_H
#define CPU_BACKEND_H

#include "op_backend.h"

extern const op_backend cpu_backend;

#endif

/* cuda_backend — the CUDA device backend's table (ops/op_backend.h); reach it through
 * op_backend_find("cuda") in a build with the CUDA backend (meson's -Dcuda option). */
#ifndef CUDA_BACKEND_H
#define CUDA_BACKEND_H

#include "op_backend.h"

extern const op_backend cuda_backend;

#endif

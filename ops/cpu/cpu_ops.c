/* cpu_ops — the CPU kernel of every op, by id: the table ops/op_table.h's rows make (OP_KERNELS). */
#include "cpu_ops.h"

#define OP_KERNEL(name, id, kernel) [id] = cpu_k_##kernel,
static const cpu_op_kernel s_kernels[OP_ID_LIMIT] = {OP_KERNELS};
#undef OP_KERNEL

cpu_op_kernel cpu_kernel_for(int id) { return id >= 0 && id < OP_ID_LIMIT ? s_kernels[id] : NULL; }

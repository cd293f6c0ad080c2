/* cpu_ops — finding the CPU kernel of an op by id in the families' tables. */
#include "cpu_ops.h"

cpu_op_kernel cpu_kernel_for(int id)
{
    static const cpu_op_kernel *const families[] = {cpu_pointwise_kernels, cpu_reduce_kernels, cpu_view_kernels,
                                                    cpu_matmul_kernels, cpu_rope_kernels, cpu_write_kernels,
                                                    cpu_attention_kernels, cpu_image_kernels};
    if (id < 0 || id >= OP_ID_LIMIT)
        return NULL;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        if (families[f][id])
            return families[f][id];
    return NULL;
}

"""Neural-network functions with torch.nn.functional's names and signatures. The elementwise ones
are the registry's rows that say so (ops/op_table.h); the others are written in dtorch/_ops*.py."""
from .. import _ops
from .._ops import gelu
from .._ops_matmul import embedding, linear, scaled_dot_product_attention
from .._ops_write import rotary_embedding
from .._ops_reduce import layer_norm, nn_log_softmax as log_softmax, nn_softmax as softmax, rms_norm

globals().update(_ops.nn_functions)

__all__ = sorted(["embedding", "gelu", "layer_norm", "linear", "log_softmax", "rms_norm", "rotary_embedding",
                  "scaled_dot_product_attention", "softmax"] + list(_ops.nn_functions))

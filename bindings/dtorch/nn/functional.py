"""Neural-network functions with torch.nn.functional's names and signatures."""
from .._ops_reduce import layer_norm, nn_log_softmax as log_softmax, nn_softmax as softmax, rms_norm
from .._ops import gelu, relu, sigmoid, silu, tanh
from .._ops_matmul import embedding, linear, scaled_dot_product_attention
from .._ops_write import rotary_embedding

__all__ = ["embedding", "gelu", "layer_norm", "linear", "log_softmax", "relu", "rms_norm", "rotary_embedding",
           "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "tanh"]

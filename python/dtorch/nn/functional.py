"""Neural-network functions with torch.nn.functional's names and signatures. The elementwise ones
are the registry's rows that say so (ops/op_table.h); the others are written in dtorch/_ops*.py
(the image ops conv2d, group_norm, interpolate and pad in _ops_image.py), and ring_attention here."""
import numbers

from .. import _C, _ops
from .._ops import gelu
from .._ops_matmul import embedding, linear, scaled_dot_product_attention
from .._ops_write import rotary_embedding
from .._ops_image import conv2d, group_norm, interpolate, pad
from .._ops_reduce import layer_norm, nn_log_softmax as log_softmax, nn_softmax as softmax, rms_norm

globals().update(_ops.nn_functions)


def ring_attention(query, key, value, query_index, key_index, mesh_dim, is_causal=True, scale=None,
                   joint_key=None, joint_value=None, joint_index=None):
    """Ring attention (context parallelism): softmax(query @ key^T * scale, keys hidden by position)
    @ value over a sequence split along the mesh dim ``mesh_dim`` (an int or a mesh dim name), the
    ring, without gathering it on any device.

    query (B, Hq, Lq, D), key (B, Hkv, S, D), value (B, Hkv, S, Dv) share a floating dtype; Hkv
    divides Hq (grouped-query heads). query_index (B or 1, Lq) and key_index (B or 1, S) are int64
    DTensors of positions: key j is visible to query i iff key_index[j] >= 0 and (not is_causal or
    key_index[j] <= query_index[i]), so any order of the sequence is correct (a zig-zag layout
    that balances the causal work, uneven pieces, padding and empty cache slots as -1).

    Along the ring key and value are Shard(2) and key_index Shard(1). With query Shard(2) and
    query_index Shard(1) (prefill) every device keeps its queries while the blocks of keys and
    values travel around the ring, device to device, each worked on while the next arrives: a
    device never holds more than its own block and two travelling ones. With query and
    query_index Replicate (decode, e.g. one new token against a KV cache split by slots) each
    device attends to its own block and the small partial results are exchanged and merged. On
    the other mesh dims, each line of devices along ``mesh_dim`` is a ring of its own: inputs all
    Replicate, or query, key and value Shard(0) (batch; the indices too when their batch is above
    1) or Shard(1) (heads; the indices Replicate). Anything else raises ValueError naming the input,
    its placements and what is needed.

    joint_key (B, Hkv, Sj, D), joint_value (B, Hkv, Sj, Dv) and joint_index (B or 1, Sj), given
    together, are a joint block that every query attends to once besides the ring's keys: Replicate
    along the ring, placed like key on the other dims. It never travels (a diffusion transformer's
    text tokens beside its image tokens split over the ring).

    scale defaults to 1 / sqrt(D). Returns (B, Hq, Lq, Dv) with query's dtype and placements
    (computed in float32)."""
    if isinstance(query, _C.DTensor):  # otherwise the call below says what query should be
        mesh_dim = _mesh_dim(query.device_mesh, mesh_dim)
    return _C._ring_attention(query, key, value, query_index, key_index, mesh_dim, bool(is_causal), scale,
                              joint_key, joint_value, joint_index)


def _mesh_dim(mesh, mesh_dim):
    """The index of a mesh dim given by name or by int (negative counts from the end)."""
    if isinstance(mesh_dim, str):
        names = mesh.mesh_dim_names or ()
        if mesh_dim not in names:
            raise ValueError(f"ring_attention: mesh_dim {mesh_dim!r} is not a dim of the query's mesh "
                             f"(its dim names: {tuple(names)})")
        return names.index(mesh_dim)
    if not isinstance(mesh_dim, numbers.Integral) or isinstance(mesh_dim, bool):
        raise TypeError(f"ring_attention: mesh_dim must be an int or a mesh dim name, got {type(mesh_dim).__name__}")
    if not -mesh.ndim <= mesh_dim < mesh.ndim:
        raise ValueError(f"ring_attention: mesh_dim {mesh_dim} is out of range for a mesh of {mesh.ndim} dims")
    return int(mesh_dim) % mesh.ndim


__all__ = sorted(["conv2d", "embedding", "gelu", "group_norm", "interpolate", "layer_norm", "linear", "log_softmax",
                  "pad", "ring_attention", "rms_norm",
                  "rotary_embedding", "scaled_dot_product_attention", "softmax"] + list(_ops.nn_functions))

"""DTorch: a single-controller distributed tensor runtime.

    import dtorch
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    x = dtorch.rand((4, 3), device_mesh=mesh, placements=[dtorch.Shard(0)])
    print(f"{x=}")
"""
from . import _C, _dtype
from ._capture import CapturedFunction, capture
from ._dtype import bfloat16, bool, dtype, float16, float32, int32, int64
from ._factory import (arange, distribute_tensor, empty, empty_like, from_local, full, full_like, ones, ones_like, rand,
                       rand_like, randn, randn_like, zeros, zeros_like)
from ._mesh import DeviceMesh, init_device_mesh
from ._placement import Partial, Placement, Replicate, Shard
from ._redistribute import PlanStep, redistribute_many, redistribute_plan
from ._runtime import (WorkerInfo, controller_public_key, device_stats, generate_keypair, init, is_initialized,
                       listen_address, manual_seed, memory_stats, shutdown, synchronize, wait_for_workers, worker_info)
from ._tensor import DTensor, TensorFuture
from ._wait import ALL_COMPLETED, FIRST_COMPLETED, FIRST_EXCEPTION, wait
from ._ops import *  # noqa: F401,F403 (the registry's elementwise ops, and the hand-written ones)
from ._ops_view import (cat, chunk, concat, concatenate, flatten, index_select, movedim, narrow, permute,
                        reshape, select, split, squeeze, stack, swapaxes, swapdims, t, transpose, tril, triu, unbind,
                        unsqueeze)
from ._ops_matmul import bmm, embedding, linear, matmul, mm, scaled_dot_product_attention
from ._ops_image import conv2d, group_norm
from ._ops_reduce import (amax, amin, argmax, argmin, cumsum, layer_norm, log_softmax, max, mean, min, rms_norm,
                          softmax, std, sum, topk, var)
from . import nn, parallel, models, pipelines, profiler, schedulers, serving

_C._register(TensorFuture, DeviceMesh, Placement, _dtype._code_of)
set_strict, get_strict = _C.set_strict, _C.get_strict
DTorchValueError, DTorchTypeError, OutOfMemoryError = _C.DTorchValueError, _C.DTorchTypeError, _C.OutOfMemoryError

__version__ = "0.1.0"

__all__ = [
    "CapturedFunction", "DTensor", "DeviceMesh", "Partial", "Placement", "Replicate", "Shard", "TensorFuture",
    "arange", "capture", "bfloat16", "bool", "device_stats", "distribute_tensor", "dtype", "empty", "empty_like",
    "float16", "float32", "from_local", "full", "full_like", "init", "init_device_mesh", "int32", "int64",
    "is_initialized", "manual_seed", "ones", "ones_like", "PlanStep", "rand", "rand_like", "randn", "randn_like",
    "redistribute_many", "redistribute_plan", "shutdown", "synchronize", "zeros", "zeros_like",
]

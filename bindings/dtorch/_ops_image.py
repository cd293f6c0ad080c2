"""The ops of convolutional image models with torch.nn.functional's names and signatures: conv2d,
group_norm, interpolate and pad. Each turns torch's arguments into the C op's attributes (ops/op_image.c
checks shapes and dtypes and picks placements: batch shards stay, spatial shards are gathered).

An image split on a spatial dim (Shard(2) or Shard(3): by rows or columns) along one mesh dim, and
Replicate or Shard(0) on the others, stays split through conv2d, group_norm and nearest interpolate
by a power of two (a VAE decoder's ops): each device computes its own torch.chunk share of the
output, conv2d and interpolate from its own rows and the few of its neighbours' they read, fetched
worker to worker (dtensor/dt_halo.c); group_norm from statistics per (sample, group) summed over the
devices (a few floats each). The output is split as the input was."""
import math
import numbers

from . import _C, _dtype
from ._ops import ids


def _is_int(v):
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _pair(fn, name, v):
    """An int or a sequence of two ints, as torch's _pair takes them."""
    if _is_int(v):
        return int(v), int(v)
    if isinstance(v, (tuple, list)) and all(_is_int(i) for i in v):
        if len(v) == 2:
            return int(v[0]), int(v[1])
        raise RuntimeError(f"{fn}: expected {name} to be a single integer value or a list of 2 values to match the "
                           f"convolution dimensions, but got {name}={list(v)}")
    raise TypeError(f"{fn}(): argument '{name}' must be an int or a tuple of 2 ints, got {type(v).__name__}")


def _tensor(fn, name, v):
    if not isinstance(v, _C.DTensor):
        raise TypeError(f"{fn}(): argument '{name}' must be a DTensor, not {type(v).__name__}")
    return v


def _split_image(input, others=()):
    """The mesh dim along which ``input`` (N, C, *spatial) is split on a spatial dim, when the image
    ops can run over the split: one such mesh dim, the input Replicate or Shard(0) on every other,
    the tensors ``others`` (weight, bias) Replicate; otherwise None (the op's own rule: a gather)."""
    if not isinstance(input, _C.DTensor) or input.ndim < 3:
        return None
    split = None
    for m, p in enumerate(input.placements):
        if p.is_shard() and p.dim % input.ndim >= 2:
            if split is not None:
                return None
            split = m
        elif not (p.is_replicate() or p.is_shard(0)):
            return None
    for t in others:
        if t is not None and not (isinstance(t, _C.DTensor) and all(p.is_replicate() for p in t.placements)):
            return None
    return split


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """A 2-D convolution (cross-correlation, as torch's) of input (N, C, H, W) or (C, H, W) with
    weight (O, C / groups, kH, kW), plus bias (O,); padding an int, a pair, "valid" or "same"
    (stride 1; with an even kernel the extra row and column go at the bottom and right). float32
    inside. An input split on a spatial dim stays split (see the module's docstring)."""
    _tensor("conv2d", "input", input)
    _tensor("conv2d", "weight", weight)
    if bias is not None:
        _tensor("conv2d", "bias", bias)
    sh, sw = _pair("conv2d", "stride", stride)
    dh, dw = _pair("conv2d", "dilation", dilation)
    if not _is_int(groups):
        raise TypeError(f"conv2d(): argument 'groups' must be int, not {type(groups).__name__}")
    if isinstance(padding, str):
        if padding == "valid":
            pads = (0, 0, 0, 0)
        elif padding == "same":
            if sh != 1 or sw != 1:
                raise ValueError("padding='same' is not supported for strided convolutions")
            if weight.ndim != 4:
                raise RuntimeError(f"conv2d: Expected 4-dimensional weight, but got weight of size "
                                   f"{list(weight.shape)}")
            pads = ()
            for d, k in ((dh, weight.shape[2]), (dw, weight.shape[3])):
                total = d * (k - 1)
                pads += (total // 2, total - total // 2)
        else:
            raise ValueError(f"Invalid padding string '{padding}', should be one of {{'valid', 'same'}}")
    else:
        ph, pw = _pair("conv2d", "padding", padding)
        pads = (ph, ph, pw, pw)
    unbatched = input.ndim == 3
    if unbatched:
        input = input.unsqueeze(0)
    ints = (sh, sw) + pads + (dh, dw, int(groups))
    split = _split_image(input, (weight, bias)) if input.ndim == 4 else None
    if split is not None:
        out = _C._halo_conv2d(input, weight, bias, ints, split)
    else:
        tensors = (input, weight) if bias is None else (input, weight, bias)
        out = _C._op(ids["conv2d"], tensors, ints, None, None)
    return out.squeeze(0) if unbatched else out


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """Group normalisation of input (N, C, *): each sample's C channels in num_groups groups,
    each group normalised over its channels and spatial positions (biased variance), then times
    weight (C,) and plus bias (C,) per channel where given; float32 inside. An input split on a
    spatial dim stays split (see the module's docstring)."""
    _tensor("group_norm", "input", input)
    if not _is_int(num_groups):
        raise TypeError(f"group_norm(): argument 'num_groups' must be int, not {type(num_groups).__name__}")
    if _split_image(input, (weight, bias)) is not None and num_groups > 0 and input.shape[1] % num_groups == 0:
        return _group_norm_split(input, int(num_groups), weight, bias, float(eps))
    tensors, flags = [input], 0
    if weight is not None:
        tensors.append(_tensor("group_norm", "weight", weight))
        flags |= 1
    if bias is not None:
        tensors.append(_tensor("group_norm", "bias", bias))
        flags |= 2
    return _C._op(ids["group_norm"], tuple(tensors), (int(num_groups), flags), (float(eps),), None)


def _group_norm_split(input, groups, weight, bias, eps):
    """group_norm of an input split on a spatial dim, as the op computes it (float32 inside, biased
    variance of the deviations from the mean), from the per-(sample, group) means each device takes
    of its own rows: Partial, summed across the devices, only they move."""
    n, c, spatial = input.shape[0], input.shape[1], tuple(input.shape[2:])
    x = input if input.dtype == _dtype.float32 else input.to(_dtype.float32)
    x = x.reshape(n, groups, c // groups, *spatial)
    dims = tuple(range(2, x.ndim))
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    out = (centered * (var + eps).rsqrt()).reshape(n, c, *spatial)
    channel = (1, c) + (1,) * len(spatial)
    if weight is not None:
        out = out * weight.to(_dtype.float32).reshape(*channel)
    if bias is not None:
        out = out + bias.to(_dtype.float32).reshape(*channel)
    return out if input.dtype == _dtype.float32 else out.to(input.dtype)


_MODES = {"nearest": 0, "linear": 1, "bilinear": 1, "nearest-exact": 2}
_LINEAR_DIMS = {"linear": 3, "bilinear": 4}


def interpolate(input, size=None, scale_factor=None, mode="nearest", align_corners=None,
                recompute_scale_factor=None, antialias=False):
    """Resamples input (N, C, L) or (N, C, H, W) to size, or by scale_factor, as torch does:
    "nearest" (source floor(dst * scale)), "nearest-exact" (floor((dst + 0.5) * scale)), "linear"
    (3-D) and "bilinear" (4-D) with align_corners. The scale is input / output size, or 1 /
    scale_factor when one is given (unless recompute_scale_factor); the output size is
    floor(input size * scale_factor)."""
    _tensor("interpolate", "input", input)
    dim = input.ndim - 2
    if mode not in _MODES:
        if mode in ("bicubic", "trilinear", "area"):
            raise NotImplementedError(f"interpolate: mode {mode!r} is not supported (nearest, nearest-exact, linear, "
                                      "bilinear)")
        raise NotImplementedError(f"Input Error: Only 3D, 4D and 5D input Tensors supported (got {input.ndim}D) "
                                  f"for the modes: nearest | linear | bilinear | bicubic | trilinear | area | "
                                  f"nearest-exact (got {mode})")
    if mode in _LINEAR_DIMS:
        if align_corners is None:
            align_corners = False
    elif align_corners is not None:
        raise ValueError("align_corners option can only be set with the interpolating modes: linear | bilinear | "
                         "bicubic | trilinear")
    if antialias:
        raise NotImplementedError("interpolate: antialias=True is not supported")
    if dim not in (1, 2):
        raise NotImplementedError(f"interpolate: {input.ndim}D input is not supported (3D (N, C, L) and 4D "
                                  "(N, C, H, W))")
    if mode in _LINEAR_DIMS and input.ndim != _LINEAR_DIMS[mode]:
        raise NotImplementedError(f"Got {input.ndim}D input, but {mode} mode needs {_LINEAR_DIMS[mode]}D input")
    spatial = list(input.shape[2:])
    if size is not None and scale_factor is not None:
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        if isinstance(size, (list, tuple)):
            if len(size) != dim:
                raise ValueError(f"Input and output must have the same number of spatial dimensions, but got input "
                                 f"with spatial dimensions of {spatial} and output size of {size}. Please provide "
                                 "input tensor in (N, C, d1, d2, ...,dK) format and output size in (o1, o2, ...,oK) "
                                 "format.")
            sizes = list(size)
        else:
            sizes = [size] * dim
        if not all(_is_int(s) for s in sizes):
            raise TypeError(f"interpolate(): size must be an int or a tuple of ints, got {size!r}")
        sizes = [int(s) for s in sizes]
        scales = [0.0] * dim
    elif scale_factor is not None:
        if isinstance(scale_factor, (list, tuple)):
            if len(scale_factor) != dim:
                raise ValueError(f"Input and scale_factor must have the same number of spatial dimensions, but got "
                                 f"input with spatial dimensions of {spatial} and scale_factor of shape "
                                 f"{scale_factor}. Please provide input tensor in (N, C, d1, d2, ...,dK) format and "
                                 "scale_factor in (s1, s2, ...,sK) format.")
            scales = [float(s) for s in scale_factor]
        elif isinstance(scale_factor, numbers.Real) and not isinstance(scale_factor, bool):
            scales = [float(scale_factor)] * dim
        else:
            raise TypeError(f"interpolate(): scale_factor must be a number or a tuple of numbers, got "
                            f"{type(scale_factor).__name__}")
        if not all(math.isfinite(s) and s > 0 for s in scales):
            raise ValueError(f"interpolate: scale_factor must be positive and finite, got {scale_factor}")
        sizes = [math.floor(float(n) * s) for n, s in zip(spatial, scales)]
        if recompute_scale_factor:
            scales = [0.0] * dim
    else:
        raise ValueError("either size or scale_factor should be defined")
    if recompute_scale_factor and size is not None:
        raise ValueError("recompute_scale_factor is not meaningful with an explicit size.")
    ints = (_MODES[mode], int(bool(align_corners))) + tuple(sizes)
    split = _split_image(input) if mode != "linear" and mode != "bilinear" else None
    if split is not None:
        axis = input.placements[split].dim % input.ndim
        rows, out_rows = input.shape[axis], sizes[axis - 2]
        scale = out_rows // rows if rows > 0 else 0
        if scale >= 1 and scale * rows == out_rows and scale & (scale - 1) == 0 and scales[axis - 2] in (0.0, scale):
            return _C._halo_interpolate(input, ints, tuple(scales), split)
    return _C._op(ids["interpolate"], (input,), ints, tuple(scales), None)


_PAD_MODES = {"constant": 0, "reflect": 1, "replicate": 2}


def pad(input, pad, mode="constant", value=None):
    """Pads input by pad = (left, right) pairs from the last dim backwards (negative pads crop):
    "constant" with value (default 0) on any dims, "reflect" and "replicate" on the last 1 to 3
    dims of a (batched or not) input, as torch.nn.functional.pad."""
    _tensor("pad", "input", input)
    if not isinstance(pad, (tuple, list)) or not all(_is_int(p) for p in pad):
        raise TypeError(f"pad(): argument 'pad' must be tuple of ints, but got {type(pad).__name__}")
    if mode not in _PAD_MODES:
        if mode == "circular":
            raise NotImplementedError("pad: mode 'circular' is not supported (constant, reflect, replicate)")
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if mode != "constant" and value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    if value is not None and not (isinstance(value, numbers.Real)):
        raise TypeError(f"pad(): argument 'value' must be a number, not {type(value).__name__}")
    if len(pad) + 1 > 16:
        raise ValueError(f"pad: at most 7 (left, right) pairs, got padding length {len(pad)}")
    return _C._op(ids["pad"], (input,), (_PAD_MODES[mode],) + tuple(int(p) for p in pad),
                  (0.0 if value is None else float(value),), None)

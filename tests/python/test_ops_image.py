"""conv2d, group_norm, interpolate and pad (and the Conv2d, GroupNorm and Upsample layers) against
numpy references written from torch's documented semantics: a convolution as the sum over kernel
offsets, group statistics over channels x spatial positions, resampling from the source-index
formulas of torch's upsampling kernels (float32 positions), padding by np.pad.

Meshes of 1 and 2 devices and 2x2; batch shards uneven (N=3 over 2) and empty (N=1 over 2), weights
split by output channels, Partial inputs, spatial shards (gathered); thread and process workers."""
import math

import numpy as np
import pytest

import dtorch
from conftest import MESHES, local_slices
from dtorch import Partial, Replicate, Shard

F = dtorch.nn.functional


def _close(got, ref, what, rtol=1e-5):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape}, want {ref.shape}"
    scale = max(float(np.abs(ref).max()) if ref.size else 0.0, 1.0)
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * scale, err_msg=what)


def _partial(a, mesh, placements):
    """a laid out with placements by from_local: Partial(sum) mesh dims split each value into
    unequal parts (3/4 on the first device, the rest shared by the others)."""
    pieces = []
    for coord in np.ndindex(*mesh.shape):
        piece = a
        for m, p in enumerate(placements):
            if isinstance(p, Partial):
                piece = piece * (0.75 if coord[m] == 0 else 0.25 / (mesh.shape[m] - 1))
        sl = local_slices(a.shape, mesh.shape, placements, coord)
        pieces.append(np.ascontiguousarray(piece[tuple(slice(lo, hi) for lo, hi in sl)], np.float32))
    return dtorch.from_local(pieces, mesh, placements, shape=a.shape)


def _make(a, mesh, placements):
    a = np.ascontiguousarray(a, np.float32)
    if any(isinstance(p, Partial) for p in placements):
        return _partial(a, mesh, placements)
    return dtorch.distribute_tensor(a, mesh, placements)


def _layouts(mesh_name, ndim, partial=True):
    """Input placements to try: batch, channel and last-dim shards, Replicate, Partial."""
    if mesh_name == "1":
        return [[Replicate()], [Shard(0)]]
    if mesh_name == "2":
        out = [[Shard(0)], [Shard(1)], [Shard(ndim - 1)], [Replicate()]]
        return out + ([[Partial()]] if partial else [])
    out = [[Shard(0), Shard(0)], [Shard(0), Shard(1)], [Replicate(), Shard(ndim - 1)], [Shard(1), Replicate()]]
    return out + ([[Partial(), Shard(0)]] if partial else [])


# ---- conv2d ------------------------------------------------------------------------------------

def conv2d_ref(x, w, b=None, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """torch's conv2d (cross-correlation): out[n, o, i, j] = b[o] + sum over c in o's group and
    kernel offsets (ki, kj) of x[n, c, i * sh - top + ki * dh, j * sw - left + kj * dw] * w[o, c, ki, kj],
    zero outside the input. pads = (top, bottom, left, right)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    N, C, H, W = x.shape
    O, Cg, kH, kW = w.shape
    (sh, sw), (dh, dw), (t, bo, lf, r) = stride, dilation, pads
    xp = np.pad(x, ((0, 0), (0, 0), (t, bo), (lf, r)))
    OH = (H + t + bo - dh * (kH - 1) - 1) // sh + 1
    OW = (W + lf + r - dw * (kW - 1) - 1) // sw + 1
    out = np.zeros((N, O, OH, OW))
    Og = O // groups
    for g in range(groups):
        xg = xp[:, g * Cg:(g + 1) * Cg]
        wg = w[g * Og:(g + 1) * Og]
        for ki in range(kH):
            for kj in range(kW):
                patch = xg[:, :, ki * dh: ki * dh + sh * (OH - 1) + 1: sh, kj * dw: kj * dw + sw * (OW - 1) + 1: sw]
                out[:, g * Og:(g + 1) * Og] += np.einsum("nchw,oc->nohw", patch, wg[:, :, ki, kj])
    if b is not None:
        out += b.astype(np.float64)[None, :, None, None]
    return out


CONV_CASES = [
    # (C, O, k, kwargs, pads the reference uses)
    (4, 6, (3, 3), dict(padding=1), (1, 1, 1, 1)),
    (4, 6, (3, 2), dict(stride=2, padding=(0, 1), dilation=(1, 2), groups=2), (0, 0, 1, 1)),
    (4, 8, (1, 1), dict(), (0, 0, 0, 0)),
    (4, 4, (4, 4), dict(padding="same"), (1, 2, 1, 2)),
    (4, 6, (3, 3), dict(padding="valid", stride=(2, 1)), (0, 0, 0, 0)),
    (4, 4, (3, 3), dict(padding=1, groups=4), (1, 1, 1, 1)),
]


@pytest.mark.parametrize("mesh_name", ["1", "2", "2x2"])
def test_conv2d(mode, mesh_name):
    rng = np.random.default_rng(1)
    mesh = MESHES[mesh_name]()
    for N in (3, 1):
        x = rng.standard_normal((N, 4, 7, 6)).astype(np.float32)
        for C, O, k, kw, pads in CONV_CASES:
            w = rng.standard_normal((O, C // kw.get("groups", 1)) + k).astype(np.float32)
            b = rng.standard_normal(O).astype(np.float32)
            stride = kw.get("stride", 1)
            stride = (stride, stride) if isinstance(stride, int) else stride
            dil = kw.get("dilation", 1)
            dil = (dil, dil) if isinstance(dil, int) else dil
            for pl in _layouts(mesh_name, 4):
                if mode == "process" and pl != _layouts(mesh_name, 4)[0] and kw != {}:
                    continue
                xt = _make(x, mesh, pl)
                wt = _make(w, mesh, [Replicate()] * mesh.ndim)
                bt = _make(b, mesh, [Replicate()] * mesh.ndim)
                what = f"mesh={mesh_name} N={N} {kw} pl={pl}"
                got = F.conv2d(xt, wt, bt, **kw)
                _close(got.numpy(), conv2d_ref(x, w, b, stride, pads, dil, kw.get("groups", 1)), what)
                got = dtorch.conv2d(xt, wt, None, **kw)
                _close(got.numpy(), conv2d_ref(x, w, None, stride, pads, dil, kw.get("groups", 1)), what + " no bias")


def test_conv2d_placements(mode):
    """Batch shards stay, output channels follow a weight split, a Partial input passes without
    bias, a spatial shard stays split (test_vae_split.py checks how)."""
    rng = np.random.default_rng(2)
    mesh = MESHES["2"]()
    x = rng.standard_normal((3, 4, 5, 5)).astype(np.float32)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ref_b, ref = conv2d_ref(x, w, b, pads=(1, 1, 1, 1)), conv2d_ref(x, w, None, pads=(1, 1, 1, 1))
    R = [Replicate()]
    cases = [
        ([Shard(0)], R, R, [Shard(0)], True),
        (R, [Shard(0)], [Shard(0)], [Shard(1)], True),
        (R, [Shard(0)], R, [Shard(1)], True),   # the bias follows the weight's split
        ([Partial()], R, None, [Partial()], False),
        ([Partial()], R, R, [Replicate()], True),
        ([Shard(3)], R, R, [Shard(3)], True),     # a spatial shard stays (its halo is fetched)
        ([Shard(2)], R, None, [Shard(2)], False),
    ]
    for xp, wp, bp, want, with_bias in cases:
        xt, wt = _make(x, mesh, xp), _make(w, mesh, wp)
        bt = _make(b, mesh, bp) if bp is not None else None
        got = F.conv2d(xt, wt, bt, padding=1)
        assert list(got.placements) == want, f"x {xp} w {wp} b {bp}: {got.placements}"
        _close(got.numpy(), ref_b if with_bias else ref, f"x {xp} w {wp}")
    # a weight split by output channels on 2x2 with a batch split on the other mesh dim
    mesh = MESHES["2x2"]()
    got = F.conv2d(_make(x, mesh, [Shard(0), Replicate()]), _make(w, mesh, [Replicate(), Shard(0)]),
                   _make(b, mesh, [Replicate(), Shard(0)]), padding=1)
    assert list(got.placements) == [Shard(0), Shard(1)]
    _close(got.numpy(), ref_b, "2x2 batch x channels")


def test_conv2d_dtypes_and_unbatched(mode):
    rng = np.random.default_rng(3)
    mesh = MESHES["2"]()
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    ref = conv2d_ref(x, w, pads=(1, 1, 1, 1))
    for dt, tol in ((dtorch.float16, 2e-3), (dtorch.bfloat16, 2e-2)):
        xt = dtorch.distribute_tensor(x, mesh, [Shard(0)]).to(dt)
        wt = dtorch.distribute_tensor(w, mesh, [Replicate()]).to(dt)
        got = F.conv2d(xt, wt, padding=1)
        assert got.dtype == dt
        xr = xt.to(dtorch.float32).numpy()
        wr = wt.to(dtorch.float32).numpy()
        _close(got.to(dtorch.float32).numpy(), conv2d_ref(xr, wr, pads=(1, 1, 1, 1)), str(dt), rtol=tol)
    # (C, H, W): unbatched, as torch takes it
    got = F.conv2d(dtorch.distribute_tensor(x[0], mesh, [Replicate()]),
                   dtorch.distribute_tensor(w, mesh, [Replicate()]), padding=1)
    assert got.shape == (5, 6, 6)
    _close(got.numpy(), ref[0], "unbatched")


def _onednn_convs(mesh):
    return [s["onednn_convs"] for s in dtorch.device_stats(mesh)]


def test_conv2d_onednn_path(mode):
    """In a build with oneDNN every conv2d kernel here runs through it (device_stats' onednn_convs
    counts one per device per float32 call, one per image for 16-bit dtypes; 0 in a build without):
    odd sizes, stride 2, padding 0 and 1, bias or not, batches of 2 and 3, and an image split by
    rows over 3 devices (each device's piece has its own pads: the top one's top pad, none for the
    middle one, the bottom one's bottom pad), against the definition within 1e-5."""
    per = 1 if dtorch._C._HAVE_ONEDNN else 0
    rng = np.random.default_rng(5)
    mesh = MESHES["3"]()
    R = [Replicate()]
    cases = [
        # (x shape, w shape, x placements, kwargs, reference pads, stride)
        ((2, 16, 12, 13), (8, 16, 3, 3), [Shard(2)], dict(padding=1), (1, 1, 1, 1), (1, 1)),
        ((2, 9, 17, 11), (5, 9, 3, 3), [Shard(2)], dict(stride=2), (0, 0, 0, 0), (2, 2)),
        ((3, 5, 11, 9), (7, 5, 3, 3), [Shard(0)], dict(padding=1, stride=2), (1, 1, 1, 1), (2, 2)),
        ((3, 8, 9, 7), (4, 8, 1, 1), R, dict(), (0, 0, 0, 0), (1, 1)),
    ]
    for xs, ws, pl, kw, pads, stride in cases:
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        for bias in (b, None):
            before = _onednn_convs(mesh)
            got = F.conv2d(_make(x, mesh, pl), _make(w, mesh, R), None if bias is None else _make(b, mesh, R), **kw)
            what = f"x {xs} w {ws} {pl} {kw} bias {bias is not None}"
            _close(got.numpy(), conv2d_ref(x, w, bias, stride, pads), what)
            # a batch shard of 3 over 3 devices and a row split both leave each device one piece
            assert [a - c for a, c in zip(_onednn_convs(mesh), before)] == [per] * 3, what
    # 16-bit: converted to float32 an image at a time, each image one oneDNN call
    x = rng.standard_normal((2, 8, 6, 5)).astype(np.float32)
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    before = _onednn_convs(mesh)
    xt = dtorch.distribute_tensor(x, mesh, R).to(dtorch.bfloat16)
    wt = dtorch.distribute_tensor(w, mesh, R).to(dtorch.bfloat16)
    got = F.conv2d(xt, wt, padding=1)
    ref = conv2d_ref(xt.to(dtorch.float32).numpy(), wt.to(dtorch.float32).numpy(), pads=(1, 1, 1, 1))
    _close(got.to(dtorch.float32).numpy(), ref, "bfloat16", rtol=2e-2)
    assert [a - c for a, c in zip(_onednn_convs(mesh), before)] == [2 * per] * 3


def test_conv2d_large_image_chunks_im2col(thread_runtime):
    """Columns past 64 MiB go by chunks of output rows: 256 channels x 3x3 x 128 x 64 (the kernel is
    the same in both worker modes: thread workers only). A build with oneDNN runs it there instead;
    tests/test_conv.c checks im2col's chunks themselves."""
    rng = np.random.default_rng(4)
    mesh = MESHES["1"]()
    x = rng.standard_normal((1, 256, 130, 64)).astype(np.float32)
    w = (rng.standard_normal((2, 256, 3, 3)) / 48).astype(np.float32)
    got = F.conv2d(dtorch.distribute_tensor(x, mesh, [Replicate()]), dtorch.distribute_tensor(w, mesh, [Replicate()]),
                   padding=(0, 1))
    _close(got.numpy(), conv2d_ref(x, w, pads=(0, 0, 1, 1)), "chunked")


def test_conv2d_bad_arguments(mode):
    mesh = MESHES["2"]()
    x = dtorch.zeros((2, 4, 5, 5), device_mesh=mesh)
    w = dtorch.zeros((6, 4, 3, 3), device_mesh=mesh)
    with pytest.raises(RuntimeError, match="to have 3 channels, but got 4"):
        F.conv2d(x, dtorch.zeros((6, 3, 3, 3), device_mesh=mesh))
    with pytest.raises(ValueError, match="expected input.*to have 8 channels"):
        F.conv2d(x, w, groups=2)
    with pytest.raises(ValueError, match="strided convolutions"):
        F.conv2d(x, w, stride=2, padding="same")
    with pytest.raises(ValueError, match="Invalid padding string"):
        F.conv2d(x, w, padding="full")
    with pytest.raises(RuntimeError, match="Kernel size can't be greater"):
        F.conv2d(x, dtorch.zeros((6, 4, 7, 7), device_mesh=mesh))
    with pytest.raises(ValueError, match="bias to be 1-dimensional with 6 elements"):
        F.conv2d(x, w, dtorch.zeros((5,), device_mesh=mesh))
    with pytest.raises(TypeError, match="should be the same"):
        F.conv2d(x, w.to(dtorch.float16))
    with pytest.raises(ValueError, match="Expected 3D \\(unbatched\\) or 4D"):
        F.conv2d(dtorch.zeros((4, 5), device_mesh=mesh), w)
    with pytest.raises(RuntimeError, match="stride"):
        F.conv2d(x, w, stride=(1, 1, 1))
    with pytest.raises(TypeError):
        F.conv2d(x, np.zeros((6, 4, 3, 3)))
    # sizes whose sums and products pass int64 are refused with what they are, not wrapped
    with pytest.raises(ValueError, match="dilated kernel .* than int64 holds"):
        F.conv2d(x, w, dilation=2**62)
    with pytest.raises(ValueError, match="padded input .* than int64 holds"):
        F.conv2d(x, w, padding=2**62)
    with pytest.raises(ValueError, match="more channels than int64 holds"):
        F.conv2d(x, dtorch.zeros((0, 4, 3, 3), device_mesh=mesh), groups=2**62)
    # the runtime keeps working
    _close(F.conv2d(x, w).numpy(), np.zeros((2, 6, 3, 3)), "after errors")


# ---- group_norm --------------------------------------------------------------------------------

def group_norm_ref(x, G, w=None, b=None, eps=1e-5):
    x = x.astype(np.float64)
    N, C = x.shape[:2]
    g = x.reshape(N, G, -1)
    mean = g.mean(axis=2, keepdims=True)
    var = ((g - mean) ** 2).mean(axis=2, keepdims=True)
    y = ((g - mean) / np.sqrt(var + eps)).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.astype(np.float64).reshape(shape)
    if b is not None:
        y = y + b.astype(np.float64).reshape(shape)
    return y


@pytest.mark.parametrize("mesh_name", ["1", "2", "2x2"])
def test_group_norm(mode, mesh_name):
    rng = np.random.default_rng(5)
    mesh = MESHES[mesh_name]()
    for shape in ((3, 6, 4, 5), (1, 6, 7), (3, 4)):
        x = (rng.standard_normal(shape) * 3 + 5).astype(np.float32)  # an offset: the statistics must be careful
        w = rng.standard_normal(shape[1]).astype(np.float32)
        b = rng.standard_normal(shape[1]).astype(np.float32)
        for pl in _layouts(mesh_name, len(shape)):
            xt = _make(x, mesh, pl)
            wt = _make(w, mesh, [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
            bt = _make(b, mesh, [Replicate()] * mesh.ndim)
            for G in (1, 2, shape[1]):
                what = f"mesh={mesh_name} {shape} pl={pl} G={G}"
                got = F.group_norm(xt, G, wt, bt)
                _close(got.numpy(), group_norm_ref(x, G, w, b), what, rtol=1e-4)
                if isinstance(pl[0], Shard) and pl[0].dim == 0:
                    assert got.placements[0] == Shard(0), what
            _close(dtorch.group_norm(xt, 2, eps=1e-2).numpy(), group_norm_ref(x, 2, eps=1e-2), "no affine", 1e-4)
            _close(F.group_norm(xt, 2, None, bt).numpy(), group_norm_ref(x, 2, None, b), "bias only", 1e-4)


def test_group_norm_errors_and_16bit(mode):
    mesh = MESHES["2"]()
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 6, 3, 3)).astype(np.float32)
    xt = dtorch.distribute_tensor(x, mesh, [Shard(0)])
    with pytest.raises(ValueError, match="divisible by num_groups"):
        F.group_norm(xt, 4)
    with pytest.raises(ValueError, match="weight to be a vector of size equal to the number of channels"):
        F.group_norm(xt, 3, dtorch.ones((5,), device_mesh=mesh))
    with pytest.raises(TypeError, match="floating"):
        F.group_norm(xt.to(dtorch.int64), 3)
    with pytest.raises(TypeError, match="num_groups"):
        F.group_norm(xt, 1.5)
    h = xt.to(dtorch.bfloat16)
    got = F.group_norm(h, 3)
    assert got.dtype == dtorch.bfloat16
    _close(got.to(dtorch.float32).numpy(), group_norm_ref(h.to(dtorch.float32).numpy(), 3), "bf16", rtol=2e-2)


# ---- interpolate -------------------------------------------------------------------------------

def _axis(n_in, n_out, mode, align, factor):
    """torch's source taps of one axis (float32 positions): (i0, i1, weight of i1)."""
    f32 = np.float32
    o = np.arange(n_out)
    if mode in ("linear", "bilinear") and align:
        scale = f32(n_in - 1) / f32(n_out - 1) if n_out > 1 else f32(0)
    else:
        scale = f32(1.0 / factor) if factor else f32(n_in) / f32(n_out)
    if mode == "nearest":
        i = np.minimum(np.floor(scale * o.astype(f32)).astype(np.int64), n_in - 1)
        return i, i, np.zeros(n_out)
    if mode == "nearest-exact":
        i = np.minimum(np.floor(scale * (o.astype(f32) + f32(0.5))).astype(np.int64), n_in - 1)
        return i, i, np.zeros(n_out)
    if n_in == n_out:
        return o, o, np.zeros(n_out)
    src = scale * o.astype(f32) if align else np.maximum(scale * (o.astype(f32) + f32(0.5)) - f32(0.5), f32(0))
    i0 = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - i0.astype(f32), 0, 1).astype(np.float64)
    return i0, np.where(i0 < n_in - 1, i0 + 1, i0), lam


def interpolate_ref(x, size=None, scale_factor=None, mode="nearest", align_corners=False):
    x = x.astype(np.float64)
    spatial = x.shape[2:]
    dims = len(spatial)
    factors = [None] * dims
    if size is None:
        factors = list(scale_factor) if isinstance(scale_factor, (tuple, list)) else [scale_factor] * dims
        size = [math.floor(n * f) for n, f in zip(spatial, factors)]
    elif isinstance(size, int):
        size = [size] * dims
    out = x
    for d in range(dims):
        i0, i1, lam = _axis(spatial[d], size[d], mode, align_corners, factors[d])
        axis = 2 + d
        shape = [1] * x.ndim
        shape[axis] = -1
        lam = lam.reshape(shape)
        out = np.take(out, i0, axis=axis) * (1 - lam) + np.take(out, i1, axis=axis) * lam
    return out


INTERP_CASES = [
    dict(size=(7, 3)),
    dict(scale_factor=2),
    dict(scale_factor=1.5),
    dict(scale_factor=(0.5, 3)),
    dict(size=(6, 9), mode="bilinear"),
    dict(size=(6, 9), mode="bilinear", align_corners=True),
    dict(scale_factor=2, mode="bilinear"),
    dict(size=(2, 3), mode="bilinear"),
    dict(size=(1, 1), mode="bilinear", align_corners=True),
    dict(size=4, mode="bilinear"),
    dict(size=(6, 3), mode="nearest-exact"),
    dict(scale_factor=1.7, mode="nearest-exact"),
]


@pytest.mark.parametrize("mesh_name", ["1", "2", "2x2"])
def test_interpolate(mode, mesh_name):
    rng = np.random.default_rng(7)
    mesh = MESHES[mesh_name]()
    for N in (3, 1):
        x = rng.standard_normal((N, 3, 4, 5)).astype(np.float32)
        for pl in _layouts(mesh_name, 4):
            xt = _make(x, mesh, pl)
            for kw in INTERP_CASES:
                if mode == "process" and kw is not INTERP_CASES[0] and kw is not INTERP_CASES[5]:
                    continue
                what = f"mesh={mesh_name} N={N} pl={pl} {kw}"
                got = F.interpolate(xt, **kw)
                ref = interpolate_ref(x, kw.get("size"), kw.get("scale_factor"), kw.get("mode", "nearest"),
                                      kw.get("align_corners", False))
                _close(got.numpy(), ref, what)
                if isinstance(pl[0], Shard) and pl[0].dim in (0, 1):
                    assert got.placements[0] == pl[0], what
                if isinstance(pl[0], Shard) and pl[0].dim == 3:   # kept by nearest x2 (test_vae_split.py)
                    kept = kw.get("mode", "nearest") != "bilinear" and kw.get("scale_factor") == 2
                    assert got.placements[0] == (pl[0] if kept else Replicate()), what


def test_interpolate_3d_layer_and_bad_arguments(mode):
    rng = np.random.default_rng(8)
    mesh = MESHES["2"]()
    x = rng.standard_normal((3, 2, 7)).astype(np.float32)
    xt = dtorch.distribute_tensor(x, mesh, [Shard(0)])
    for kw in (dict(size=12, mode="linear"), dict(scale_factor=0.5, mode="linear", align_corners=True),
               dict(size=(4,)), dict(scale_factor=3, mode="nearest-exact")):
        ref = interpolate_ref(x, kw.get("size"), kw.get("scale_factor"), kw.get("mode", "nearest"),
                              kw.get("align_corners", False))
        _close(F.interpolate(xt, **kw).numpy(), ref, f"3-D {kw}")
    x4 = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    x4t = dtorch.distribute_tensor(x4, mesh, [Shard(1)])
    up = dtorch.nn.Upsample(scale_factor=2, mode="bilinear")
    _close(up(x4t).numpy(), interpolate_ref(x4, None, 2, "bilinear"), "Upsample")
    assert "scale_factor=2.0, mode='bilinear'" in repr(up)
    # recompute_scale_factor: the scale is the sizes' ratio, not 1 / scale_factor
    got = F.interpolate(x4t, scale_factor=1.7, recompute_scale_factor=True)
    _close(got.numpy(), interpolate_ref(x4, size=(6, 6)), "recompute_scale_factor")
    with pytest.raises(ValueError, match="only one of size or scale_factor"):
        F.interpolate(x4t, size=3, scale_factor=2)
    with pytest.raises(ValueError, match="either size or scale_factor"):
        F.interpolate(x4t)
    with pytest.raises(ValueError, match="align_corners option can only be set"):
        F.interpolate(x4t, size=3, align_corners=True)
    with pytest.raises(NotImplementedError, match="bilinear mode needs 4D input"):
        F.interpolate(xt, size=3, mode="bilinear")
    with pytest.raises(NotImplementedError, match="linear mode needs 3D input"):
        F.interpolate(x4t, size=3, mode="linear")
    with pytest.raises(ValueError, match="same number of spatial dimensions"):
        F.interpolate(x4t, size=(3, 3, 3))
    with pytest.raises(NotImplementedError):
        F.interpolate(x4t, size=3, mode="bicubic")
    with pytest.raises(ValueError, match="greater than 0"):
        F.interpolate(x4t, size=(0, 3))
    with pytest.raises(TypeError, match="floating"):
        F.interpolate(x4t.to(dtorch.int64), size=3)


# ---- pad ---------------------------------------------------------------------------------------

def pad_ref(x, pad, mode="constant", value=0.0):
    """np.pad of the (left, right) pairs from the last dim; negative pads crop first."""
    pairs = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        pairs[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    crop = tuple(slice(max(-lo, 0), x.shape[d] - max(-hi, 0)) for d, (lo, hi) in enumerate(pairs))
    x = x[crop]
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in pairs]
    if mode == "constant":
        return np.pad(x, grow, mode="constant", constant_values=value)
    return np.pad(x, grow, mode={"reflect": "reflect", "replicate": "edge"}[mode])


PAD_CASES = [
    ((1, 2), "constant", None),
    ((1, 2, 0, 1), "constant", 2.5),
    ((0, 0, 1, 1, 2, 0), "constant", -1.0),
    ((-1, 2, 1, -2), "constant", 0.0),
    ((2, 1), "reflect", None),
    ((1, 2, 3, 1), "reflect", None),
    ((2, 3, 1, 0), "replicate", None),
    ((0, 4), "replicate", None),
]


@pytest.mark.parametrize("mesh_name", ["1", "2", "2x2"])
def test_pad(mode, mesh_name):
    rng = np.random.default_rng(9)
    mesh = MESHES[mesh_name]()
    for N in (3, 1):
        x = rng.standard_normal((N, 4, 5)).astype(np.float32)
        for pl in _layouts(mesh_name, 3):
            xt = _make(x, mesh, pl)
            for pads, pmode, value in PAD_CASES:
                what = f"mesh={mesh_name} N={N} pl={pl} {pads} {pmode} {value}"
                got = F.pad(xt, pads, mode=pmode, value=value)
                _close(got.numpy(), pad_ref(x, pads, pmode, 0.0 if value is None else value), what, rtol=1e-6)
                padded = {x.ndim - 1 - i for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]}
                for p, q in zip(pl, got.placements):
                    if isinstance(p, Shard):
                        assert q == (Replicate() if p.dim in padded else p), what
    # integer and bool tensors pad too (data movement)
    xi = rng.integers(-5, 5, size=(2, 3, 4))
    xit = dtorch.distribute_tensor(xi, mesh, [Shard(0)] * mesh.ndim)
    np.testing.assert_array_equal(F.pad(xit, (1, 1, 2, 0), value=7).numpy(), pad_ref(xi, (1, 1, 2, 0), value=7))
    np.testing.assert_array_equal(F.pad(xit, (2, 2), mode="reflect").numpy(), pad_ref(xi, (2, 2), "reflect"))


def test_pad_partial_and_bad_arguments(mode):
    mesh = MESHES["2"]()
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    xp = _make(x, mesh, [Partial()])
    got = F.pad(xp, (1, 1))
    assert got.placements[0] == Partial()
    _close(got.numpy(), pad_ref(x, (1, 1)), "Partial, 0")
    got = F.pad(xp, (1, 1), value=1.0)
    assert got.placements[0] == Replicate()
    _close(got.numpy(), pad_ref(x, (1, 1), value=1.0), "Partial, 1")
    got = F.pad(xp, (2, 1, 1, 1), mode="reflect")
    assert got.placements[0] == Partial()
    _close(got.numpy(), pad_ref(x, (2, 1, 1, 1), "reflect"), "Partial, reflect")
    xt = dtorch.distribute_tensor(x, mesh, [Shard(0)])
    with pytest.raises(ValueError, match="Padding length must be divisible by 2"):
        F.pad(xt, (1, 2, 3))
    with pytest.raises(ValueError, match="less than or equal to two times"):
        F.pad(xt, (1,) * 8)
    with pytest.raises(ValueError, match="Padding size should be less than the corresponding input dimension"):
        F.pad(xt, (4, 0), mode="reflect")
    with pytest.raises(ValueError, match="negative output size"):
        F.pad(xt, (-3, -2))
    with pytest.raises(RuntimeError, match="reflect"):
        F.pad(xt, (1,) * 6, mode="reflect")
    with pytest.raises(RuntimeError, match="doesn't take in value"):
        F.pad(xt, (1, 1), mode="replicate", value=2.0)
    with pytest.raises(NotImplementedError):
        F.pad(xt, (1, 1), mode="circular")
    with pytest.raises(TypeError, match="tuple of ints"):
        F.pad(xt, 1)


# ---- layers ------------------------------------------------------------------------------------

def test_layers(mode):
    mesh = MESHES["2"]()
    rng = np.random.default_rng(10)
    conv = dtorch.nn.Conv2d(4, 6, 3, padding=1, device_mesh=mesh)
    assert conv.weight.shape == (6, 4, 3, 3) and conv.bias.shape == (6,)
    bound = 1 / math.sqrt(4 * 9)
    wv, bv = conv.weight.numpy(), conv.bias.numpy()
    assert np.abs(wv).max() <= bound and np.abs(bv).max() <= bound and np.abs(wv).max() > bound / 2
    assert [n for n, _ in conv.named_parameters()] == ["weight", "bias"]
    x = rng.standard_normal((3, 4, 5, 5)).astype(np.float32)
    xt = dtorch.distribute_tensor(x, mesh, [Shard(0)])
    _close(conv(xt).numpy(), conv2d_ref(x, wv, bv, pads=(1, 1, 1, 1)), "Conv2d")
    assert repr(conv).startswith("Conv2d(4, 6, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)")
    # padding_mode pads first, as torch's Conv2d does
    conv_r = dtorch.nn.Conv2d(4, 2, (3, 2), padding=(1, 2), padding_mode="reflect", bias=False, device_mesh=mesh)
    assert conv_r.bias is None
    xpad = pad_ref(x, (2, 2, 1, 1), "reflect")
    _close(conv_r(xt).numpy(), conv2d_ref(xpad, conv_r.weight.numpy()), "Conv2d reflect")
    conv_s = dtorch.nn.Conv2d(4, 4, 2, padding="same", groups=2, padding_mode="replicate", device_mesh=mesh)
    xpad = pad_ref(x, (0, 1, 0, 1), "replicate")
    _close(conv_s(xt).numpy(), conv2d_ref(xpad, conv_s.weight.numpy(), conv_s.bias.numpy(), groups=2), "same")
    with pytest.raises(ValueError, match="in_channels must be divisible by groups"):
        dtorch.nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="strided convolutions"):
        dtorch.nn.Conv2d(4, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding_mode must be one of"):
        dtorch.nn.Conv2d(4, 4, 3, padding_mode="mirror")
    gn = dtorch.nn.GroupNorm(2, 4, device_mesh=mesh)
    assert [n for n, _ in gn.named_parameters()] == ["weight", "bias"]
    np.testing.assert_array_equal(gn.weight.numpy(), np.ones(4, np.float32))
    np.testing.assert_array_equal(gn.bias.numpy(), np.zeros(4, np.float32))
    _close(gn(xt).numpy(), group_norm_ref(x, 2), "GroupNorm", rtol=1e-4)
    assert repr(gn) == "GroupNorm(2, 4, eps=1e-05, affine=True)"
    assert dtorch.nn.GroupNorm(2, 4, affine=False, device_mesh=mesh).weight is None
    with pytest.raises(ValueError, match="num_channels must be divisible by num_groups"):
        dtorch.nn.GroupNorm(3, 4)
    up = dtorch.nn.Upsample(size=(7, 3))
    _close(up(xt).numpy(), interpolate_ref(x, (7, 3)), "Upsample nearest")
    # a VAE-like block: conv, group norm, silu, nearest upsampling, conv
    block = dtorch.nn.Sequential(dtorch.nn.Conv2d(4, 8, 3, padding=1, device_mesh=mesh),
                                 dtorch.nn.GroupNorm(4, 8, device_mesh=mesh), dtorch.nn.SiLU(),
                                 dtorch.nn.Upsample(scale_factor=2.0),
                                 dtorch.nn.Conv2d(8, 4, 3, padding=1, device_mesh=mesh))
    y = block(xt)
    assert y.shape == (3, 4, 10, 10) and y.placements[0] == Shard(0)
    c0, g1, c4 = block[0], block[1], block[4]
    h = group_norm_ref(conv2d_ref(x, c0.weight.numpy(), c0.bias.numpy(), pads=(1, 1, 1, 1)), 4,
                       g1.weight.numpy(), g1.bias.numpy())
    h = h / (1 + np.exp(-h))
    h = h.repeat(2, axis=2).repeat(2, axis=3)
    _close(y.numpy(), conv2d_ref(h, c4.weight.numpy(), c4.bias.numpy(), pads=(1, 1, 1, 1)), "block", rtol=1e-4)

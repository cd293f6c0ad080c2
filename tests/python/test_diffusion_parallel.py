"""Joint image-text attention of the diffusion transformers (DiffusionParallel.attention) on every
layout the mesh dim names give, against numpy over the concatenated sequence; and ring_attention's
joint block on its own."""
import numpy as np
import pytest

import dtorch
from dtorch.models.diffusion_parallel import DiffusionParallel
from dtorch.nn import functional as F

from diffusion_reference import attention

H, LT, D = 4, 3, 8

# (mesh shape, dim names, batch, image tokens): uneven sequence pieces, an empty batch piece on dp
LAYOUTS = [
    ((1,), None, 2, 5),
    ((2,), ("dp",), 1, 6),
    ((2,), ("ulysses",), 2, 7),
    ((2,), ("ring",), 2, 7),
    ((3,), ("ring",), 2, 5),
    ((2,), ("ring",), 1, 1),
    ((2, 2), ("ulysses", "ring"), 2, 9),
    ((2, 2), ("dp", "ring"), 1, 3),
    ((2, 2, 2), ("dp", "ulysses", "ring"), 3, 7),
]


def _mesh(shape, names):
    return dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(), mesh_dim_names=names)


def _inputs(rng, B, L):
    return [rng.standard_normal(s).astype(np.float32) for s in [(B, H, L, D)] * 3 + [(B, H, LT, D)] * 3]


@pytest.mark.parametrize("shape,names,B,L", LAYOUTS)
@pytest.mark.parametrize("context_first", [False, True])
def test_joint_attention_matches_numpy(thread_runtime, shape, names, B, L, context_first):
    rng = np.random.default_rng(L * 10 + B)
    arrays = _inputs(rng, B, L)
    mesh = _mesh(shape, names)
    parallel = DiffusionParallel(mesh, H, "test")
    names = names or ("none",)
    image = [dtorch.Shard(0) if n == "dp" else dtorch.Shard(2) if n != "none" else dtorch.Replicate() for n in names]
    text = [dtorch.Shard(0) if n == "dp" else dtorch.Replicate() for n in names]
    tensors = [dtorch.distribute_tensor(a, mesh, image if i < 3 else text) for i, a in enumerate(arrays)]
    out, context_out = parallel.attention(*tensors, context_first=context_first)
    q, k, v = (np.concatenate([arrays[i + 3], arrays[i]] if context_first else [arrays[i], arrays[i + 3]], axis=2)
               for i in range(3))
    want = attention(q, k, v)
    want_image, want_text = (want[:, :, LT:], want[:, :, :LT]) if context_first else (want[:, :, :L], want[:, :, L:])
    assert list(out.placements) == image and list(context_out.placements) == text
    np.testing.assert_allclose(out.numpy(), want_image, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(context_out.numpy(), want_text, rtol=1e-5, atol=1e-6)


def test_joint_attention_without_context(thread_runtime):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, H, 7, D)).astype(np.float32) for _ in range(3))
    mesh = _mesh((2, 2), ("ulysses", "ring"))
    pl = [dtorch.Shard(2), dtorch.Shard(2)]
    out, context_out = DiffusionParallel(mesh, H, "test").attention(*(dtorch.distribute_tensor(a, mesh, pl)
                                                                       for a in (q, k, v)))
    assert context_out is None
    np.testing.assert_allclose(out.numpy(), attention(q, k, v), rtol=1e-5, atol=1e-6)


def test_ring_joint_block_in_both_modes(mode):
    """Prefill (queries split along the ring) and decode (queries whole) with a joint block, worker
    threads and processes."""
    rng = np.random.default_rng(11)
    B, L = 2, 5
    q, k, v, _, jk, jv = _inputs(rng, B, L)
    mesh = _mesh((2,), ("ring",))
    split, whole = [dtorch.Shard(2)], [dtorch.Replicate()]
    zeros = lambda n, pl: dtorch.zeros((1, n), dtype=dtorch.int64, device_mesh=mesh, placements=pl)
    tk, tv = (dtorch.distribute_tensor(a, mesh, split) for a in (k, v))
    tjk, tjv = (dtorch.distribute_tensor(a, mesh, whole) for a in (jk, jv))
    want = attention(q, np.concatenate([jk, k], 2), np.concatenate([jv, v], 2))
    for q_pl, q_index_pl in ((split, [dtorch.Shard(1)]), (whole, whole)):
        out = F.ring_attention(dtorch.distribute_tensor(q, mesh, q_pl), tk, tv, zeros(L, q_index_pl),
                               zeros(L, [dtorch.Shard(1)]), "ring", is_causal=False, joint_key=tjk, joint_value=tjv,
                               joint_index=zeros(LT, whole))
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="joint_key has placements"):
        F.ring_attention(dtorch.distribute_tensor(q, mesh, split), tk, tv, zeros(L, [dtorch.Shard(1)]),
                         zeros(L, [dtorch.Shard(1)]), "ring", is_causal=False, joint_key=tk, joint_value=tv,
                         joint_index=zeros(L, [dtorch.Shard(1)]))


def test_layout_errors(thread_runtime):
    with pytest.raises(ValueError, match="unknown mesh dim name 'tp'"):
        DiffusionParallel(_mesh((2,), ("tp",)), H, "SD3Transformer2DModel")
    with pytest.raises(ValueError, match="ulysses size 3 does not divide the 4 attention heads"):
        DiffusionParallel(_mesh((3,), ("ulysses",)), H, "SD3Transformer2DModel")
    with pytest.raises(ValueError, match="name the dims"):
        DiffusionParallel(dtorch.DeviceMesh("cpu", [0, 1]), H, "SD3Transformer2DModel")

"""One denoising step of a small SD3-shaped transformer on a mesh of CPU devices, beside numpy.

    .venv/bin/python bench/bench_diffusion.py                     # 256 and 1024 image tokens
    .venv/bin/python bench/bench_diffusion.py --tokens 256 --repeats 3
    .venv/bin/python bench/bench_diffusion.py --vae 512,1024 --repeats 1   # the VAE decode split by rows

The model: 4 joint blocks of 8 heads x 32 (width 256), 32 text tokens, random weights, float32. A
step is one forward of the guidance pair (batch 2: the unconditional and the conditional rows) on
a latent of tokens x 4 patches. Each layout runs the same step: one device; dp2 (the pair split);
ulysses2 and ring2 (the image tokens split); beside the numpy reference of the tests
(tests/python/sd3_reference.py) in float32 with one BLAS thread (as one device has), timed in the
same run. With ``--vae SIZES`` it times instead the decode of one image of each size by a small
SD-shaped VAE (4 blocks of 16, 32, 64 and 64 channels, 4 latent channels, random weights) on 1, 2 and
4 devices split by rows (a mesh dim named ``height``), with each device's peak. Figures are medians of
``--repeats`` steps after one warm-up, with the spread, and the peak bytes each device held above
what it held before the step (dtorch.device_stats), for ring2 against one device.
"""
import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS on one core, as one device's
import numpy as np  # noqa: E402

import dtorch  # noqa: E402
from dtorch.models import SD3Transformer2DModel  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import diffusion_reference  # noqa: E402
import sd3_reference  # noqa: E402

CONFIG = dict(sample_size=64, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=32,
              num_attention_heads=8, joint_attention_dim=256, caption_projection_dim=256, pooled_projection_dim=128,
              out_channels=16, pos_embed_max_size=64)
LAYOUTS = [("one device", (1,), None), ("dp2", (2,), ("dp",)), ("ulysses2", (2,), ("ulysses",)),
           ("ring2", (2,), ("ring",))]


def _inputs(tokens, text=32):
    side = int(round(tokens ** 0.5))
    rng = np.random.default_rng(0)
    return dict(hidden_states=rng.standard_normal((2, 16, 2 * side, 2 * side)).astype(np.float32),
                encoder_hidden_states=rng.standard_normal((2, text, 256)).astype(np.float32),
                pooled_projections=rng.standard_normal((2, 128)).astype(np.float32),
                timestep=np.array([500.0, 500.0], dtype=np.float32))


VAE_CONFIG = dict(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                  block_out_channels=(16, 32, 64, 64), layers_per_block=1, norm_num_groups=8, latent_channels=4)


def _bench_vae(sizes, repeats):
    """The VAE decode of one image per size on 1, 2 and 4 devices split by rows: time and the peak
    bytes per device above what each held before."""
    from dtorch.models import AutoencoderKL
    dtorch.manual_seed(0)
    state = {k: v.numpy() for k, v in AutoencoderKL.from_config(
        VAE_CONFIG, device_mesh=dtorch.DeviceMesh("cpu", [0])).state_dict().items()}
    for size in sizes:
        z = np.random.default_rng(0).standard_normal((1, 4, size // 8, size // 8)).astype(np.float32)
        print(f"\n== VAE decode, one {size}x{size} image, blocks {VAE_CONFIG['block_out_channels']}")
        single_peak = None
        for n in (1, 2, 4):
            mesh = dtorch.DeviceMesh("cpu", list(range(n)), mesh_dim_names=("height",))
            vae = AutoencoderKL.from_config(VAE_CONFIG, device_mesh=mesh)
            vae.load_state_dict(state)
            zt = dtorch.distribute_tensor(z, mesh)
            times, peaks = [], []
            for _ in range(repeats):
                held = [s["bytes_in_use"] for s in dtorch.memory_stats(mesh, reset_peak=True)]
                start = time.perf_counter()
                out = vae.decode(zt).sample
                dtorch.synchronize()
                times.append(time.perf_counter() - start)
                peaks.append(max(s["peak_bytes"] - h for s, h in zip(dtorch.memory_stats(mesh), held)) / 2 ** 20)
                del out
            ms, low, high = (t * 1e3 for t in _median(times))
            peak = statistics.median(peaks)
            single_peak = peak if single_peak is None else single_peak
            print(f"  height{n:<6d} {ms:8.1f} ms  ({low:.1f}-{high:.1f})  peak {peak:7.1f} MiB per device "
                  f"({peak / single_peak:.2f}x one device)")
            del vae


def _median(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="256,1024", help="image tokens per step (squares)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vae", default="", help="image sizes for the VAE decode split by rows (e.g. 512,1024)")
    args = parser.parse_args()
    dtorch.init(workers="thread")
    if args.vae:
        _bench_vae([int(s) for s in args.vae.split(",")], args.repeats)
        dtorch.shutdown()
        return
    dtorch.manual_seed(0)
    base = SD3Transformer2DModel.from_config(CONFIG)
    state = {k: v.numpy() for k, v in base.state_dict().items()}
    diffusion_reference.DTYPE = np.float32
    for tokens in [int(t) for t in args.tokens.split(",")]:
        inputs = _inputs(tokens)
        print(f"\n== one step, batch 2 (the guidance pair), {tokens} image tokens + 32 text tokens, "
              f"{CONFIG['num_layers']} blocks of width 256")
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            sd3_reference.transformer(state, CONFIG, inputs["hidden_states"], inputs["encoder_hidden_states"],
                                      inputs["pooled_projections"], inputs["timestep"])
            times.append(time.perf_counter() - start)
        numpy_ms = _median(times)[0] * 1e3
        print(f"  {'numpy, 1 thread':12s} {numpy_ms:8.1f} ms  ({min(times) * 1e3:.1f}-{max(times) * 1e3:.1f})")
        single_peak = None
        for label, shape, names in LAYOUTS:
            mesh = dtorch.DeviceMesh("cpu", np.arange(int(np.prod(shape))).reshape(shape).tolist(),
                                     mesh_dim_names=names)
            model = SD3Transformer2DModel.from_config(CONFIG, device_mesh=mesh)
            model.load_state_dict({k: dtorch.distribute_tensor(v, mesh) for k, v in state.items()})
            model(**inputs).sample.numpy()
            times, peaks = [], []
            for _ in range(args.repeats):
                held = [s["bytes_in_use"] for s in dtorch.device_stats(mesh, reset_peak=True)]
                start = time.perf_counter()
                model(**inputs).sample.numpy()
                times.append(time.perf_counter() - start)
                peaks.append(max(s["peak_bytes"] - h for s, h in zip(dtorch.device_stats(mesh), held)) / 2 ** 20)
            ms, low, high = (t * 1e3 for t in _median(times))
            peak = statistics.median(peaks)
            single_peak = peak if single_peak is None else single_peak
            print(f"  {label:12s} {ms:8.1f} ms  ({low:.1f}-{high:.1f})  {numpy_ms / ms:5.2f}x numpy  "
                  f"peak {peak:6.1f} MiB per device above the weights ({peak / single_peak:.2f}x one device)")
            del model
    dtorch.shutdown()


if __name__ == "__main__":
    main()

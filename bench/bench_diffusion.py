"""One denoising step of a small SD3-shaped transformer on a mesh of CPU devices, beside numpy.

    .venv/bin/python bench/bench_diffusion.py                     # 256 and 1024 image tokens
    .venv/bin/python bench/bench_diffusion.py --tokens 256 --repeats 3
    .venv/bin/python bench/bench_diffusion.py --vae 512,1024 --repeats 1   # the VAE decode split by rows
    .venv/bin/python bench/bench_diffusion.py --prompts --ref-python /work/refvenv/bin/python --repeats 3

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

With ``--prompts`` it times instead, on two small random-weight diffusers pipeline directories
(SD3-shaped: CLIP-L, CLIP-G and T5 text encoders; FLUX-shaped: CLIP-L and T5; see _BUILD), first
the text encoders alone (batch 2, padded to 77 and to the pipeline's T5 length) on one device and
on dp2, then a whole run from prompt to numpy image (text encoders, ``--steps`` denoising steps,
VAE decode) on one device and on two (SD3: dp2, the guidance pair split; FLUX: ulysses2), one
denoising step alone (the transformer's forward on the inputs its pipeline gives it), and the
SD3 directory's VAE decoding one latent alone (one device; two split by rows, ``height``), beside
transformers' and diffusers' pipelines and AutoencoderKL with torch on ``--threads`` threads,
loading the same files, in the same run through ``--ref-python`` (a Python with torch, transformers and diffusers,
a venv of its own, run as a subprocess as bench_serve.py's --hf-python). The directories are
written once into bench/.cache by that Python with diffusers' own save_pretrained. Steps per second
come from the difference between a run of ``--steps`` steps and one of 1 step: (steps - 1) / (its
seconds - the 1-step run's), the text encoders and the decode cancelling out. The encoders and the
whole runs of the reference are timed before DTorch's; the step and the VAE decode alone alternate
with it, ``--rounds`` rounds of ``--repeats`` each (DTorch one device, DTorch two, torch's thread
counts, again), in a reference process kept for them, and print the two-device row against
torch's most threads round by round.
"""
import argparse
import os
import json
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS on one core, as one device's
import numpy as np  # noqa: E402

import dtorch  # noqa: E402
from dtorch.models import SD3Transformer2DModel  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests", "python")
CACHE = os.path.join(HERE, ".cache", "diffusion_pipelines")
sys.path.insert(0, TESTS)
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


# ---- prompt to image, beside transformers and diffusers -----------------------------------------

PROMPT, NEGATIVE = "a red fox sitting in the snow at sunset, highly detailed", "blurry, low quality"
PIPELINES = {"sd3": dict(guidance_scale=7.0, negative_prompt=NEGATIVE, encoders=(("text_encoder", 77),
                                                                               ("text_encoder_2", 77),
                                                                               ("text_encoder_3", 256))),
             "flux": dict(guidance_scale=3.5, negative_prompt=None, encoders=(("text_encoder", 77),
                                                                            ("text_encoder_2", 512)))}

# Run by --ref-python once: the two pipeline directories, written by diffusers' save_pretrained with
# the tokenizers and the order-1 random weights of the tests' fixtures (make_pipeline_fixtures.py),
# at sizes a 2-core machine runs in seconds: SD3-shaped (CLIP-L 128 wide, CLIP-G 192, T5 320 = their
# sum, 4 layers each; 4 joint blocks of 8 heads x 32; a VAE of 16 latent channels, blocks 16, 32, 64,
# 64) and FLUX-shaped (CLIP-L, T5; 2 double- and 4 single-stream blocks of 8 heads x 32).
_BUILD = """
import os, sys
sys.path.insert(0, sys.argv[2])
import torch
import make_pipeline_fixtures as fx
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, T5Config, T5EncoderModel
from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel,
                       SD3Transformer2DModel, StableDiffusion3Pipeline)
out = sys.argv[1]
fx.CLIP_MAX = 77
torch.manual_seed(0)
clip_vocab, t5_vocab = fx.clip_vocab(), fx.t5_vocab()
clip_tok, clip_tok_2 = fx.clip_tokenizer(*clip_vocab), fx.clip_tokenizer(*clip_vocab, pad_token="!")
t5_tok = fx.t5_tokenizer(t5_vocab)

def clip(cls, tok, seed, hidden, heads, act):
    config = CLIPTextConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, projection_dim=hidden,
                            num_hidden_layers=4, num_attention_heads=heads, max_position_embeddings=77, hidden_act=act,
                            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return fx.randomize(cls(config), seed)

def t5(seed):
    config = T5Config(vocab_size=len(t5_tok), d_model=320, d_kv=64, d_ff=512, num_layers=4, num_heads=5,
                      feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False)
    return fx.randomize(T5EncoderModel(config), seed)

def vae(seed, scaling, shift):
    return fx.randomize(AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(16, 32, 64, 64),
                                      down_block_types=("DownEncoderBlock2D",) * 4,
                                      up_block_types=("UpDecoderBlock2D",) * 4, latent_channels=16,
                                      norm_num_groups=8, layers_per_block=1, scaling_factor=scaling,
                                      shift_factor=shift, use_quant_conv=False, use_post_quant_conv=False), seed)

sd3 = StableDiffusion3Pipeline(
    transformer=fx.randomize(SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=32, num_attention_heads=8,
        joint_attention_dim=320, caption_projection_dim=256, pooled_projection_dim=320, out_channels=16,
        pos_embed_max_size=64), 1),
    scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae(2, 1.5305, 0.0609),
    text_encoder=clip(CLIPTextModelWithProjection, clip_tok, 3, 128, 2, "quick_gelu"), tokenizer=clip_tok,
    text_encoder_2=clip(CLIPTextModelWithProjection, clip_tok_2, 4, 192, 3, "gelu"), tokenizer_2=clip_tok_2,
    text_encoder_3=t5(5), tokenizer_3=t5_tok)
sd3.save_pretrained(os.path.join(out, "sd3"), safe_serialization=True)
flux = FluxPipeline(
    transformer=fx.randomize(FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=32,
        num_attention_heads=8, joint_attention_dim=320, pooled_projection_dim=128, axes_dims_rope=(8, 12, 12),
        guidance_embeds=True), 11),
    scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                              base_image_seq_len=256, max_image_seq_len=4096),
    vae=vae(12, 0.3611, 0.1159), text_encoder=clip(CLIPTextModel, clip_tok, 13, 128, 2, "quick_gelu"),
    tokenizer=clip_tok, text_encoder_2=t5(14), tokenizer_2=t5_tok)
flux.save_pretrained(os.path.join(out, "flux"), safe_serialization=True)
"""

# Run by --ref-python: the same directories through transformers and diffusers on torch threads; one
# JSON line per figure: [what, pipeline, name, threads, [seconds of each repeat]].
_REF = """
import json, sys, time
import numpy as np
import torch, transformers, diffusers
torch.set_grad_enabled(False)
args = json.loads(sys.argv[1])
classes = dict(sd3=diffusers.StableDiffusion3Pipeline, flux=diffusers.FluxPipeline)
def timed(fn, repeats):
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return out
for threads in args["threads"]:
    torch.set_num_threads(threads)
    for name, spec in args["pipelines"].items():
        pipe = classes[name].from_pretrained(spec["path"], dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        for part, length in spec["encoders"]:
            encoder = getattr(pipe, part)
            ids = torch.from_numpy(np.random.default_rng(0).integers(0, encoder.config.vocab_size, (2, length)))
            fn = lambda: encoder(ids, output_hidden_states=True)
            print(json.dumps(["encoder", name, part, threads, timed(fn, args["repeats"])]), flush=True)
        for steps in (1, args["steps"]):
            kw = dict(prompt=args["prompt"], height=args["size"], width=args["size"], num_inference_steps=steps,
                      guidance_scale=spec["guidance_scale"], output_type="np")
            if spec["negative_prompt"]:
                kw["negative_prompt"] = spec["negative_prompt"]
            fn = lambda: pipe(**kw, generator=torch.Generator().manual_seed(0)).images
            print(json.dumps(["image", name, steps, threads, timed(fn, args["repeats"])]), flush=True)
"""

# Run by --ref-python beside DTorch for the step and VAE rows (_RefParts): one request per line on stdin,
# [what ("step" or "vae"), the pipeline's directory, the step inputs' .npz or the VAE's image size,
# threads, repeats], answered by one line of the repeats' seconds (after one untimed call). The
# models are loaded at their first request and kept.
_REF_PARTS = """
import json, sys, time
import numpy as np
import torch, diffusers
torch.set_grad_enabled(False)
models = {}
def model(cls, path, subfolder):
    if (path, subfolder) not in models:
        models[path, subfolder] = getattr(diffusers, cls).from_pretrained(path, subfolder=subfolder,
                                                                          low_cpu_mem_usage=False).eval()
    return models[path, subfolder]
for line in sys.stdin:
    what, path, arg, threads, repeats = json.loads(line)
    torch.set_num_threads(threads)
    if what == "step":   # the transformer's forward on the inputs step_inputs() wrote
        config = json.load(open(path + "/transformer/config.json"))
        net = model(config["_class_name"], path, "transformer")
        inputs = {k: torch.from_numpy(v) for k, v in np.load(arg).items()}
        fn = lambda: net(**inputs).sample
    else:                # the VAE decoding the latent vae_latent() draws
        vae = model("AutoencoderKL", path, "vae")
        z = torch.from_numpy(np.random.default_rng(0).standard_normal(
            (1, vae.config.latent_channels, arg // 8, arg // 8)).astype(np.float32))
        fn = lambda: vae.decode(z).sample
    fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    print(json.dumps(out), flush=True)
"""


class _RefParts:
    """diffusers' transformer step and VAE decode in a process of its own (_REF_PARTS), asked for one
    figure at a time so that its timings alternate with DTorch's."""

    def __init__(self, python):
        self.proc = subprocess.Popen([python, "-c", _REF_PARTS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def __call__(self, what, path, arg, threads, repeats):
        self.proc.stdin.write(json.dumps([what, path, arg, threads, repeats]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"bench_diffusion: the reference process ended (status {self.proc.wait()})")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _build_directories(python):
    """bench/.cache's pipeline directories, written by ``python``'s diffusers the first time."""
    if all(os.path.exists(os.path.join(CACHE, name, "model_index.json")) for name in PIPELINES):
        return
    if python is None:
        sys.exit(f"bench_diffusion --prompts: {CACHE} holds no pipeline directories yet; pass --ref-python (a Python "
                 "with torch, transformers and diffusers) once to write them")
    os.makedirs(CACHE, exist_ok=True)
    subprocess.run([python, "-c", _BUILD, CACHE, os.path.abspath(TESTS)], check=True)


def _reference(python, repeats, steps, size, threads):
    """{(what, pipeline, name or steps, threads): seconds of each repeat} from transformers and
    diffusers on ``python``."""
    spec = {name: dict(path=os.path.join(CACHE, name), encoders=p["encoders"], guidance_scale=p["guidance_scale"],
                       negative_prompt=p["negative_prompt"])
            for name, p in PIPELINES.items()}
    args = json.dumps(dict(pipelines=spec, repeats=repeats, steps=steps, size=size, threads=threads, prompt=PROMPT))
    out = subprocess.run([python, "-c", _REF, args], check=True, capture_output=True, text=True).stdout
    return {tuple(row[:4]): row[4] for row in (json.loads(line) for line in out.splitlines() if line.startswith("["))}


def _timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _line(label, times, unit=1e3, suffix="ms", digits=1):
    mid, low, high = (t * unit for t in _median(times))
    return f"  {label:42s} {mid:9.{digits}f} {suffix} ({low:.{digits}f}-{high:.{digits}f})"


def _bench_prompts(args, threads, ref, parts):
    """The text encoders alone, then prompt to image, DTorch's layouts beside torch's threads (``ref``:
    _reference's figures, measured before DTorch's workers started); then the step and the VAE decode
    alone, alternated with ``parts`` (a _RefParts, or None without a reference)."""
    from dtorch.models import CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel
    from dtorch.pipelines import FluxPipeline, StableDiffusion3Pipeline
    classes = {"sd3": (StableDiffusion3Pipeline, (CLIPTextModelWithProjection, CLIPTextModelWithProjection,
                                                  T5EncoderModel), ("dp",)),
               "flux": (FluxPipeline, (CLIPTextModel, T5EncoderModel), ("ulysses",))}
    one = dtorch.DeviceMesh("cpu", [0])
    for name, spec in PIPELINES.items():
        path = os.path.join(CACHE, name)
        pipeline, encoders, split = classes[name]
        two = dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=split)
        print(f"\n== {name}: text encoders alone, batch 2, float32")
        for (part, length), cls in zip(spec["encoders"], encoders):
            for label, mesh in (("one device", one), ("dp2", dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=("dp",)))):
                encoder = cls.from_pretrained(path, subfolder=part, device_mesh=mesh)
                ids = np.random.default_rng(0).integers(0, encoder.config.vocab_size, (2, length))
                times = _timed(lambda: encoder(ids, output_hidden_states=True).last_hidden_state.numpy(), args.repeats)
                print(_line(f"{part} ({length} tokens), {label}", times))
                del encoder
            for t in threads:
                if ("encoder", name, part, t) in ref:
                    print(_line(f"{part}, torch {t} thread{'s' if t > 1 else ''}", ref[("encoder", name, part, t)]))
        print(f"\n== {name}: prompt to numpy image, {args.size}x{args.size}, {args.steps} steps"
              + (", guidance pair (batch 2)" if spec["negative_prompt"] else ", batch 1")
              + "; seconds per image, steps/s from (steps - 1) / (its seconds - a 1-step run's)")
        rows = {}
        for label, mesh in (("one device", one), (split[0] + "2", two)):
            pipe = pipeline.from_pretrained(path, device_mesh=mesh)
            kw = dict(prompt=PROMPT, height=args.size, width=args.size, guidance_scale=spec["guidance_scale"],
                      output_type="np", seed=0, progress=False)
            if spec["negative_prompt"]:
                kw["negative_prompt"] = spec["negative_prompt"]
            rows[f"DTorch, {label}"] = {steps: _timed(lambda: pipe(**kw, num_inference_steps=steps).images,
                                                      args.repeats) for steps in (1, args.steps)}
            del pipe
        for t in threads:
            if ("image", name, args.steps, t) in ref:
                rows[f"diffusers, torch {t} thread{'s' if t > 1 else ''}"] = {
                    steps: ref[("image", name, steps, t)] for steps in (1, args.steps)}
        for label, by in rows.items():
            whole, first = statistics.median(by[args.steps]), statistics.median(by[1])
            rate = (args.steps - 1) / (whole - first) if args.steps > 1 and whole > first else float("nan")
            print(_line(label, by[args.steps], 1, "s per image", 2) + f"  {rate:6.2f} steps/s")
        _bench_step(name, path, split, args, threads, parts)
        if name == "sd3":
            _bench_vae_decode(path, args, threads, parts)
    print("\nload average after: %.2f %.2f %.2f (figures are for the record only where it stayed under 1.5)"
          % os.getloadavg())


def step_inputs(name, size):
    """The inputs of one denoising step of the pipeline ``name`` at a size x size image, as its
    pipeline calls its transformer (SD3: the guidance pair, 333 text tokens; FLUX: one image, 512
    text tokens, with positions and guidance), standard normal (seed 0); written once as an .npz in
    bench/.cache for the reference Python to read the same arrays. Returns the file's path."""
    file = os.path.join(CACHE, f"step-{name}-{size}.npz")
    if os.path.exists(file):
        return file
    with open(os.path.join(CACHE, name, "transformer", "config.json")) as f:
        config = json.load(f)
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    side, text = size // 8, config["joint_attention_dim"]
    if name == "sd3":
        arrays = dict(hidden_states=normal(2, config["in_channels"], side, side),
                      encoder_hidden_states=normal(2, 77 + 256, text),
                      pooled_projections=normal(2, config["pooled_projection_dim"]),
                      timestep=np.full(2, 500.0, np.float32))
    else:
        grid = np.stack(np.meshgrid(np.arange(side // 2), np.arange(side // 2), indexing="ij"), -1).reshape(-1, 2)
        arrays = dict(hidden_states=normal(1, (side // 2) ** 2, config["in_channels"]),
                      encoder_hidden_states=normal(1, 512, text),
                      pooled_projections=normal(1, config["pooled_projection_dim"]),
                      timestep=np.full(1, 0.5, np.float32), guidance=np.full(1, 3.5, np.float32),
                      img_ids=np.concatenate([np.zeros((len(grid), 1)), grid], 1).astype(np.float32),
                      txt_ids=np.zeros((512, 3), np.float32))
    np.savez(file, **arrays)
    return file


def _alternated(rows, args, ratio):
    """Times every row's fn (label -> fn returning seconds of args.repeats calls) in turn, args.rounds
    times, so that DTorch's and the reference's figures share the machine's phases; prints each row
    over all rounds, then ``ratio`` (a row divided by another) round by round."""
    times = {label: [] for label in rows}
    per_round = []
    for _ in range(args.rounds):
        medians = {}
        for label, fn in rows.items():
            got = fn()
            times[label] += got
            medians[label] = statistics.median(got)
        per_round.append(medians)
    for label in rows:
        print(_line(label, times[label]))
    if ratio and all(label in rows for label in ratio):
        mine, theirs = ratio
        print(f"  {theirs} / {mine}, round by round: "
              + ", ".join(f"{r[theirs] / r[mine]:.2f}x" for r in per_round))


def _bench_step(name, path, split, args, threads, ref):
    """One denoising step alone (the transformer's forward on step_inputs()), on one device and on
    two laid out as the pipeline row's, beside diffusers' transformer on the same inputs, alternated."""
    from dtorch.models import FluxTransformer2DModel
    cls = SD3Transformer2DModel if name == "sd3" else FluxTransformer2DModel
    file = step_inputs(name, args.size)
    inputs = dict(np.load(file))
    print(f"\n== {name}: one denoising step alone, {args.size}x{args.size} "
          f"({(args.size // 16) ** 2} image tokens), batch {len(inputs['hidden_states'])}, "
          f"{args.rounds} rounds of {args.repeats} alternated")
    rows = {}   # each row's function holds its model
    for label, mesh in (("one device", dtorch.DeviceMesh("cpu", [0])),
                        (split[0] + "2", dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=split))):
        model = cls.from_pretrained(path, subfolder="transformer", device_mesh=mesh)
        rows[f"DTorch, {label}"] = lambda model=model: _timed(lambda: model(**inputs).sample.numpy(), args.repeats)
    for t in threads if ref else ():
        rows[f"diffusers, torch {t} thread{'s' if t > 1 else ''}"] = lambda t=t: ref("step", path, file, t,
                                                                                     args.repeats)
    _alternated(rows, args, (f"DTorch, {split[0]}2", f"diffusers, torch {max(threads)} threads"))


def _bench_vae_decode(path, args, threads, ref):
    """The SD3 directory's VAE decoding one latent (standard normal, seed 0) to an args.size image, on
    one device and split by rows on two (``height``), beside diffusers' decode of the same latent,
    alternated."""
    from dtorch.models import AutoencoderKL
    print(f"\n== sd3: the VAE decode alone, one {args.size}x{args.size} image, "
          f"{args.rounds} rounds of {args.repeats} alternated")
    rows = {}   # each row's function holds its VAE
    for label, mesh in (("one device", dtorch.DeviceMesh("cpu", [0])),
                        ("height2", dtorch.DeviceMesh("cpu", [0, 1], mesh_dim_names=("height",)))):
        vae = AutoencoderKL.from_pretrained(path, subfolder="vae", device_mesh=mesh)
        z = dtorch.distribute_tensor(vae_latent(vae.config.latent_channels, args.size), mesh)
        rows[f"DTorch, {label}"] = lambda vae=vae, z=z: _timed(lambda: vae.decode(z).sample.numpy(), args.repeats)
    for t in threads if ref else ():
        rows[f"diffusers, torch {t} thread{'s' if t > 1 else ''}"] = lambda t=t: ref("vae", path, args.size, t,
                                                                                     args.repeats)
    _alternated(rows, args, ("DTorch, height2", f"diffusers, torch {max(threads)} threads"))


def vae_latent(channels, size):
    """The latent both sides decode (the reference draws it alike in _REF)."""
    return np.random.default_rng(0).standard_normal((1, channels, size // 8, size // 8)).astype(np.float32)


def _median(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", default="256,1024", help="image tokens per step (squares)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vae", default="", help="image sizes for the VAE decode split by rows (e.g. 512,1024)")
    parser.add_argument("--prompts", action="store_true", help="the text encoders and prompt to image instead")
    parser.add_argument("--ref-python", help="a Python with torch, transformers and diffusers: theirs beside")
    parser.add_argument("--threads", default="1,2", help="torch's thread counts for the reference")
    parser.add_argument("--steps", type=int, default=4, help="denoising steps of a prompt-to-image run")
    parser.add_argument("--size", type=int, default=256, help="the image's height and width (--prompts)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--prompts: rounds of the step and VAE rows, DTorch's and the reference's alternated")
    args = parser.parse_args()
    if args.prompts:
        _build_directories(args.ref_python)
        print("load average before: %.2f %.2f %.2f" % os.getloadavg())
        threads = [int(t) for t in args.threads.split(",")]
        ref = _reference(args.ref_python, args.repeats, args.steps, args.size, threads) if args.ref_python else {}
    dtorch.init(workers="thread")
    if args.prompts:
        parts = _RefParts(args.ref_python) if args.ref_python else None
        _bench_prompts(args, threads, ref, parts)
        if parts:
            parts.close()
        dtorch.shutdown()
        return
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

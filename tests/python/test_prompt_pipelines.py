"""StableDiffusion3Pipeline and FluxPipeline from prompts, on whole diffusers pipeline directories
(fixtures/pipelines/, written by diffusers' own save_pretrained: see make_pipeline_fixtures.py),
against what diffusers 0.42.1 computes on the same directories: encode_prompt's outputs, and the
images of 2-step runs from the same latents. On one device, and with the transformer on dp2 x
ulysses2 and the text encoders on a mesh of their own (their outputs cross to the transformer's
workers), in both worker modes; the SD3 directory without T5 gives zeros for T5's part as diffusers
does; a directory without text encoders runs from the embeddings diffusers computed; bad
directories and arguments raise errors naming what is wrong."""
import json
import os
import shutil

import numpy as np
import pytest

import dtorch
from dtorch.pipelines import FluxPipeline, StableDiffusion3Pipeline

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "pipelines")
TOL = 1e-4       # float32 against torch's float32: observed differences are near 1e-6

pytestmark = pytest.mark.usefixtures("thread_runtime")


def _fixture(name):
    path = os.path.join(FIXTURES, name)
    with open(os.path.join(path, "cases.json")) as f:
        cases = json.load(f)
    return path, cases, np.load(os.path.join(path, "expected.npz"))


def _value(x):
    return x.numpy() if isinstance(x, dtorch.DTensor) else np.asarray(x)


def _close(got, want, what, tol=TOL):
    got = _value(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    err = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    assert err <= tol, f"{what}: max |difference| {err:.3g} > {tol}"


def _one():
    return dtorch.DeviceMesh("cpu", [0])


def _parallel():
    """The transformer on dp2 x ulysses2 (devices 0-3), the text encoders on dp2 (devices 4, 5), the
    VAE on device 0."""
    return dict(device_mesh=dtorch.DeviceMesh("cpu", [[0, 1], [2, 3]], mesh_dim_names=("dp", "ulysses")),
                text_encoder_mesh=dtorch.DeviceMesh("cpu", [4, 5], mesh_dim_names=("dp",)), vae_mesh=_one())


SD3_OUTPUTS = ("prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds", "negative_pooled_prompt_embeds")


@pytest.mark.parametrize("name", ["sd3", "sd3_no_t5"])
def test_sd3_encode_prompt_matches_diffusers(name):
    path, cases, want = _fixture(name)
    pipe = StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    assert (pipe.text_encoder_3 is None) == (name == "sd3_no_t5")
    for case, kwargs in cases["encode"].items():
        out = pipe.encode_prompt(**kwargs)
        for key, value in zip(SD3_OUTPUTS, out):
            if f"{case}.{key}" not in want:
                assert value is None, f"{case}: {key} should be None without guidance"
                continue
            _close(value, want[f"{case}.{key}"], f"{name} {case} {key}")
    if name == "sd3_no_t5":   # T5's part of the sequence is zeros (after the CLIP tokens)
        embeds = want["enc_default.prompt_embeds"]
        assert embeds.shape[1] == pipe.tokenizer.model_max_length + 256
        assert not embeds[:, pipe.tokenizer.model_max_length:].any()


def test_flux_encode_prompt_matches_diffusers():
    path, cases, want = _fixture("flux")
    pipe = FluxPipeline.from_pretrained(path, device_mesh=_one())
    for case, kwargs in cases["encode"].items():
        embeds, pooled, text_ids = pipe.encode_prompt(**kwargs)
        _close(embeds, want[f"{case}.prompt_embeds"], f"flux {case} prompt_embeds")
        _close(pooled, want[f"{case}.pooled_prompt_embeds"], f"flux {case} pooled_prompt_embeds")
        _close(text_ids, want[f"{case}.text_ids"], f"flux {case} text_ids", tol=0)
    assert want["enc_default.prompt_embeds"].shape[1] == 512   # FLUX's default max_sequence_length


@pytest.mark.parametrize("name", ["sd3", "sd3_no_t5"])
def test_sd3_images_match_diffusers_one_device(name):
    path, cases, want = _fixture(name)
    pipe = StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    images = pipe(**cases["run"], latents=want["run.latents"]).images
    assert images.dtype == np.float32
    _close(images, want["run.images"], f"{name} images")


def test_flux_images_match_diffusers_one_device():
    path, cases, want = _fixture("flux")
    pipe = FluxPipeline.from_pretrained(path, device_mesh=_one())
    _close(pipe(**cases["run"], latents=want["run.latents"]).images, want["run.images"], "flux images")
    _close(pipe(**cases["cfg"], latents=want["cfg.latents"]).images, want["cfg.images"], "flux true-cfg images")


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_images_match_diffusers_on_meshes(workers):
    """dp2 x ulysses2 for the transformer, the text encoders on dp2 elsewhere: the embeddings cross
    meshes worker to worker and the images are diffusers'."""
    dtorch.shutdown()
    dtorch.init(workers=workers)
    try:
        path, cases, want = _fixture("sd3")
        pipe = StableDiffusion3Pipeline.from_pretrained(path, **_parallel())
        assert pipe.text_encoder_3.device_mesh.tolist() == [4, 5]
        out = pipe.encode_prompt(**cases["encode"]["enc_full"])
        assert out[0].device_mesh == pipe.mesh
        _close(out[0], want["enc_full.prompt_embeds"], "sd3 enc_full prompt_embeds on meshes")
        _close(pipe(**cases["run"], latents=want["run.latents"]).images, want["run.images"], "sd3 images on meshes")
        path, cases, want = _fixture("flux")
        pipe = FluxPipeline.from_pretrained(path, **_parallel())
        _close(pipe(**cases["run"], latents=want["run.latents"]).images, want["run.images"], "flux images on meshes")
    finally:
        dtorch.shutdown()
        dtorch.init(workers="thread")


VAE_HEIGHT = [((2,), ("height",)), ((3,), ("height",)), ((2, 2), ("dp", "height"))]


@pytest.mark.parametrize("workers", ["thread", "process"])
def test_vae_split_by_rows_through_from_pretrained(workers):
    """from_pretrained with a vae_mesh that has a dim named height: the decoder's image comes out split
    by rows over it (8 latent rows: even on 2 devices, 3, 3 and 2 on 3; the images' batch over dp
    beside it), and the images are the one-device pipeline's and diffusers' within 1e-4."""
    dtorch.shutdown()
    dtorch.init(workers=workers)
    try:
        for cls, name, runs in ((StableDiffusion3Pipeline, "sd3", ("run",)), (FluxPipeline, "flux", ("run", "cfg"))):
            path, cases, want = _fixture(name)
            single = cls.from_pretrained(path, device_mesh=_one())
            base = {run: single(**cases[run], latents=want[f"{run}.latents"]).images for run in runs}
            for shape, names in VAE_HEIGHT:
                devices = np.arange(1, 1 + int(np.prod(shape))).reshape(shape).tolist()
                vae_mesh = dtorch.DeviceMesh("cpu", devices, mesh_dim_names=names)
                pipe = cls.from_pretrained(path, device_mesh=_one(), vae_mesh=vae_mesh)
                rows = []
                pipe.vae.decoder.register_forward_hook(lambda module, args, out: rows.append(out.placements))
                for run in runs:
                    images = pipe(**cases[run], latents=want[f"{run}.latents"]).images
                    what = f"{name} {run} images, vae on {names} {shape}"
                    _close(images, base[run], what + " against one device")
                    _close(images, want[f"{run}.images"], what + " against diffusers")
                height = names.index("height")
                assert rows and all(p[height] == dtorch.Shard(2) for p in rows), rows
    finally:
        dtorch.shutdown()
        dtorch.init(workers="thread")


def test_default_vae_mesh_splits_rows_over_the_transformers_devices():
    """Without vae_mesh the VAE sits on the transformer's devices as one height dim, so one image's
    decode is split by rows over all of them (a dp2 x ulysses2 transformer: 4 devices), and the images
    are diffusers'; a one-device transformer keeps the VAE on its mesh."""
    path, cases, want = _fixture("sd3")
    mesh = dtorch.DeviceMesh("cpu", [[2, 3], [4, 5]], mesh_dim_names=("dp", "ulysses"))
    pipe = StableDiffusion3Pipeline.from_pretrained(path, device_mesh=mesh)
    assert pipe.vae.device_mesh.mesh_dim_names == ("height",)
    assert pipe.vae.device_mesh.tolist() == [2, 3, 4, 5]
    rows = []
    pipe.vae.decoder.register_forward_hook(lambda module, args, out: rows.append(out.placements))
    images = pipe(**cases["run"], latents=want["run.latents"]).images
    _close(images, want["run.images"], "sd3 images, the VAE on the default mesh")
    assert rows == [(dtorch.Shard(2),)], rows
    one = _one()
    assert StableDiffusion3Pipeline.from_pretrained(path, device_mesh=one).vae.device_mesh == one


def test_default_text_encoder_mesh_is_the_first_device():
    path, _, _ = _fixture("flux")
    mesh = dtorch.DeviceMesh("cpu", [2, 3], mesh_dim_names=("ulysses",))
    pipe = FluxPipeline.from_pretrained(path, device_mesh=mesh)
    assert pipe.text_encoder.device_mesh.tolist() == [2]
    assert pipe.text_encoder_2.device_mesh.tolist() == [2]


def _copy(tmp_path, name):
    dest = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), dest)
    return str(dest)


def _edit_index(path, **entries):
    file = os.path.join(path, "model_index.json")
    with open(file) as f:
        index = json.load(f)
    index.update(entries)
    with open(file, "w") as f:
        json.dump(index, f)


@pytest.mark.parametrize("name,cls", [("sd3", StableDiffusion3Pipeline), ("flux", FluxPipeline)])
def test_directory_without_text_encoders_runs_from_embeddings(tmp_path, name, cls):
    """The directory as DTorch's save_pretrained wrote it before text encoders: model_index.json names
    only the transformer, the VAE and the scheduler. Fed diffusers' embeddings, it makes diffusers' images."""
    path, cases, want = _fixture(name)
    bare = tmp_path / "bare"
    for part in ("transformer", "vae", "scheduler"):
        shutil.copytree(os.path.join(path, part), bare / part)
    with open(os.path.join(path, "model_index.json")) as f:
        index = {k: v for k, v in json.load(f).items() if k in ("_class_name", "transformer", "vae", "scheduler")}
    with open(bare / "model_index.json", "w") as f:
        json.dump(index, f)
    pipe = cls.from_pretrained(str(bare), device_mesh=_one())
    assert pipe.text_encoder is None and pipe.tokenizer is None
    run = {k: v for k, v in cases["run"].items() if k not in ("prompt", "negative_prompt", "max_sequence_length")}
    embeds = {k: want[f"enc_run.{k}"] for k in ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds",
                                                "negative_pooled_prompt_embeds") if f"enc_run.{k}" in want}
    _close(pipe(**run, **embeds, latents=want["run.latents"]).images, want["run.images"], f"{name} from embeddings")
    with pytest.raises(ValueError, match="no text encoders"):
        pipe(prompt="a red fox", height=16, width=16, num_inference_steps=1)
    # and save_pretrained writes such a directory again, text encoders null
    pipe.save_pretrained(str(tmp_path / "again"))
    with open(tmp_path / "again" / "model_index.json") as f:
        assert json.load(f)["text_encoder"] == [None, None]
    assert cls.from_pretrained(str(tmp_path / "again"), device_mesh=_one()).text_encoder is None


def test_save_pretrained_copies_text_encoders(tmp_path):
    path, cases, want = _fixture("sd3")
    pipe = StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    pipe.save_pretrained(str(tmp_path / "copy"))
    again = StableDiffusion3Pipeline.from_pretrained(str(tmp_path / "copy"), device_mesh=_one())
    _close(again.encode_prompt(**cases["encode"]["enc_run"])[0], want["enc_run.prompt_embeds"], "after saving")


def test_unknown_class_in_model_index(tmp_path):
    path = _copy(tmp_path, "sd3")
    _edit_index(path, text_encoder_3=["transformers", "UMT5EncoderModel"])
    with pytest.raises(ValueError, match="text_encoder_3 is a UMT5EncoderModel"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    _edit_index(path, text_encoder_3=["transformers", "T5EncoderModel"], transformer=["diffusers", "UNet2DModel"])
    with pytest.raises(ValueError, match="transformer is a UNet2DModel"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    # FLUX's directory under the SD3 pipeline: its CLIP has no projection
    with pytest.raises(ValueError, match="text_encoder is a CLIPTextModel"):
        StableDiffusion3Pipeline.from_pretrained(os.path.join(FIXTURES, "flux"), device_mesh=_one())
    _edit_index(path, transformer=["diffusers", "SD3Transformer2DModel"],
                controlnet=["diffusers", "SD3ControlNetModel"])
    with pytest.raises(ValueError, match="'controlnet'"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())


def test_missing_parts(tmp_path):
    path = _copy(tmp_path, "sd3")
    shutil.rmtree(os.path.join(path, "text_encoder_3"))
    with pytest.raises(FileNotFoundError, match="text_encoder_3"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    _edit_index(path, text_encoder_3=[None, None])
    with pytest.raises(ValueError, match="tokenizer_3 but no text_encoder_3"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    # without model_index.json: read as DTorch's first pipelines were saved, the three folders alone
    os.remove(os.path.join(path, "model_index.json"))
    assert StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one()).text_encoder is None
    shutil.rmtree(os.path.join(path, "vae"))
    with pytest.raises(OSError, match="vae"):
        StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())


def test_bad_arguments():
    path, cases, want = _fixture("sd3")
    pipe = StableDiffusion3Pipeline.from_pretrained(path, device_mesh=_one())
    run = dict(cases["run"], num_inference_steps=1)
    with pytest.raises(ValueError, match=r"latents must have shape \(2, 4, 8, 8\)"):
        pipe(**run, latents=want["run.latents"][:, :, :4])
    with pytest.raises(ValueError, match="not both"):
        pipe(**run, prompt_embeds=want["enc_run.prompt_embeds"])
    with pytest.raises(ValueError, match="negative_prompt has 1 prompts, but prompt has 2"):
        pipe(**dict(run, negative_prompt=["blurry"]))
    with pytest.raises(ValueError, match="max_sequence_length"):
        pipe(**dict(run, max_sequence_length=513))
    with pytest.raises(TypeError, match="prompt must be a string or a list of strings"):
        pipe.encode_prompt(prompt=3)
    # the runtime keeps working after
    _close(pipe.encode_prompt(**cases["encode"]["enc_run"])[0], want["enc_run.prompt_embeds"], "after errors")

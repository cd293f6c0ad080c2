"""FlowMatchEulerDiscreteScheduler against schedules computed by hand from diffusers' formulas."""
import json

import numpy as np
import pytest

import dtorch
from dtorch.schedulers import FlowMatchEulerDiscreteScheduler


def test_static_shift_schedule_by_hand():
    # shift 1: sigma_min = 1/1000, linspace(1000, 1, 4) / 1000, then 0 appended
    s = FlowMatchEulerDiscreteScheduler()
    s.set_timesteps(4)
    np.testing.assert_allclose(s.sigmas, [1.0, 0.667, 0.334, 0.001, 0.0], rtol=1e-6)
    np.testing.assert_allclose(s.timesteps, [1000.0, 667.0, 334.0, 1.0], rtol=1e-6)
    # shift 3 (SD3): the training sigmas are shifted, so sigma_min = 3 * 0.001 / 1.002 = 0.002994012;
    # linspace(1000, 2.994012, 4) / 1000 = 1, 0.667663, 0.335329, 0.002994, each shifted again by
    # 3s / (1 + 2s): 1, 2.002989 / 2.335326 = 0.857692, 1.005988 / 1.670659 = 0.602151, 0.008982 / 1.005988 = 0.00892857
    s = FlowMatchEulerDiscreteScheduler(shift=3.0)
    s.set_timesteps(4)
    np.testing.assert_allclose(s.sigmas, [1.0, 0.857692, 0.602151, 0.00892857, 0.0], rtol=2e-5)
    assert s.sigmas.dtype == np.float32 and s.timesteps.dtype == np.float32


def test_dynamic_shift_and_given_sigmas():
    # FLUX: sigmas 1, 0.75, 0.5, 0.25 shifted by e^mu / (e^mu + 1/s - 1), mu = 0.8 (e^0.8 = 2.225541):
    # 1, 2.225541 / 2.558874 = 0.869734, 2.225541 / 3.225541 = 0.689974, 2.225541 / 5.225541 = 0.425897
    s = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="mu="):
        s.set_timesteps(4)
    s.set_timesteps(sigmas=np.linspace(1.0, 0.25, 4), mu=0.8)
    np.testing.assert_allclose(s.sigmas, [1.0, 0.869734, 0.689974, 0.425897, 0.0], rtol=1e-5)
    np.testing.assert_allclose(s.timesteps, s.sigmas[:-1] * 1000, rtol=1e-6)


def test_euler_steps_on_arrays_and_dtensors(thread_runtime):
    s = FlowMatchEulerDiscreteScheduler(shift=3.0)
    s.set_timesteps(3)
    sigmas = s.sigmas.astype(np.float64)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    v = np.full((2, 3), 2.0, dtype=np.float32)
    mesh = dtorch.DeviceMesh("cpu", [0, 1])
    xd = dtorch.distribute_tensor(x, mesh, [dtorch.Shard(0)])
    vd = dtorch.distribute_tensor(v, mesh, [dtorch.Shard(0)])
    want = x.astype(np.float64)
    for i, t in enumerate(s.timesteps):
        x = s.step(v, t, x).prev_sample
        want = want + (sigmas[i + 1] - sigmas[i]) * 2.0
        np.testing.assert_allclose(x, want, rtol=1e-6, atol=1e-6)
    # the whole way from sigma 1 to 0 moves each value by -2 exactly (the steps telescope)
    np.testing.assert_allclose(x, np.arange(6).reshape(2, 3) - 2.0, rtol=1e-6, atol=1e-6)
    s.set_timesteps(3)
    for t in s.timesteps:
        (xd,) = s.step(vd, t, xd, return_dict=False)
    np.testing.assert_allclose(xd.numpy(), x, rtol=1e-6, atol=1e-6)
    with pytest.raises(IndexError, match="past the last timestep"):
        s.step(vd, s.timesteps[-1], xd)
    with pytest.raises(ValueError, match="integer indices"):
        FlowMatchEulerDiscreteScheduler().step(v, 3, x)
    with pytest.raises(ValueError, match="not one of the scheduler's timesteps"):
        FlowMatchEulerDiscreteScheduler().step(v, 0.5, x)


def test_scale_noise_and_config_round_trip(tmp_path):
    s = FlowMatchEulerDiscreteScheduler(shift=3.0)
    s.set_timesteps(2)
    sigma = float(s.sigmas[0])
    np.testing.assert_allclose(s.scale_noise(np.ones(3), s.timesteps[0], np.zeros(3)), (1 - sigma) * np.ones(3))
    s.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert config["_class_name"] == "FlowMatchEulerDiscreteScheduler" and config["shift"] == 3.0
    again = FlowMatchEulerDiscreteScheduler.from_pretrained(tmp_path)
    again.set_timesteps(2)
    np.testing.assert_array_equal(again.sigmas, s.sigmas)
    with pytest.raises(TypeError, match="unknown config argument"):
        FlowMatchEulerDiscreteScheduler(shfit=3.0)
    with pytest.raises(NotImplementedError, match="use_karras_sigmas"):
        FlowMatchEulerDiscreteScheduler(use_karras_sigmas=True)

"""Noise schedulers with diffusers' names, configs and semantics. Scalar work, so it runs on the
host in numpy; ``step`` combines the model's prediction and the sample where they live (DTensors on
their devices, or numpy arrays)."""
import dataclasses
import json
import math
import os

import numpy as np

from .models.modeling_diffusers import FrozenConfig, read_config


@dataclasses.dataclass
class FlowMatchEulerDiscreteSchedulerOutput:
    prev_sample: object


class FlowMatchEulerDiscreteScheduler:
    """Euler steps of the rectified-flow ODE (SD3, FLUX): x_next = x + (sigma_next - sigma) * v.

    The training schedule is sigma = t / num_train_timesteps for t = N .. 1, shifted by
    shift * s / (1 + (shift - 1) * s) (SD3: shift 3.0) unless ``use_dynamic_shifting``, where
    ``set_timesteps(mu=...)`` shifts by exp(mu) / (exp(mu) + (1 / s - 1)) (FLUX: mu from the image's
    token count). ``set_timesteps(n)`` spaces n timesteps evenly from the schedule's largest to its
    smallest sigma, shifts them, and appends sigma 0."""

    config_name = "scheduler_config.json"
    config_defaults = dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5,
                           max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096, invert_sigmas=False,
                           shift_terminal=None, use_karras_sigmas=False, use_exponential_sigmas=False,
                           use_beta_sigmas=False, time_shift_type="exponential", stochastic_sampling=False)
    order = 1

    def __init__(self, **config):
        unknown = sorted(k for k in config if k not in self.config_defaults and not k.startswith("_"))
        if unknown:
            raise TypeError(f"FlowMatchEulerDiscreteScheduler: unknown config argument(s) {', '.join(unknown)}")
        merged = dict(self.config_defaults)
        merged.update({k: v for k, v in config.items() if not k.startswith("_")})
        for flag in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "stochastic_sampling",
                     "invert_sigmas"):
            if merged[flag]:
                raise NotImplementedError(f"FlowMatchEulerDiscreteScheduler: {flag}=True is not supported")
        if merged["time_shift_type"] != "exponential":
            raise NotImplementedError("FlowMatchEulerDiscreteScheduler: time_shift_type must be 'exponential'")
        self.config = FrozenConfig(merged)
        n = self.config.num_train_timesteps
        timesteps = np.linspace(1, n, n, dtype=np.float32)[::-1].copy()
        sigmas = timesteps / np.float32(n)
        if not self.config.use_dynamic_shifting:
            sigmas = self._shifted(sigmas, self.config.shift)
        self.timesteps = (sigmas * n).astype(np.float32)
        self.sigmas = sigmas.astype(np.float32)
        self.sigma_min, self.sigma_max = float(self.sigmas[-1]), float(self.sigmas[0])
        self.num_inference_steps = None
        self._step_index = None
        self._begin_index = None

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        """The scheduler of ``scheduler_config.json`` in ``path`` (or ``path/subfolder``)."""
        return cls(**read_config(path, subfolder, cls.config_name))

    @classmethod
    def from_config(cls, config):
        return cls(**dict(config))

    def save_pretrained(self, save_directory):
        os.makedirs(save_directory, exist_ok=True)
        with open(os.path.join(save_directory, self.config_name), "w") as f:
            json.dump(dict(self.config, _class_name=type(self).__name__), f, indent=2, sort_keys=True)

    @staticmethod
    def _shifted(sigmas, shift):
        return shift * sigmas / (1 + (shift - 1) * sigmas)

    @staticmethod
    def time_shift(mu, sigma, t):
        return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)

    @property
    def shift(self):
        return self.config.shift

    @property
    def step_index(self):
        return self._step_index

    @property
    def begin_index(self):
        return self._begin_index

    def set_begin_index(self, begin_index=0):
        self._begin_index = begin_index

    def set_timesteps(self, num_inference_steps=None, device=None, sigmas=None, mu=None):
        """The inference schedule: ``num_inference_steps`` evenly spaced timesteps (or the given
        ``sigmas``), shifted, then sigma 0 appended."""
        if self.config.use_dynamic_shifting and mu is None:
            raise ValueError("FlowMatchEulerDiscreteScheduler: pass mu= when use_dynamic_shifting is set")
        n = self.config.num_train_timesteps
        if sigmas is None:
            if num_inference_steps is None or int(num_inference_steps) < 1:
                raise ValueError(f"num_inference_steps must be a positive int, got {num_inference_steps!r}")
            timesteps = np.linspace(self.sigma_max * n, self.sigma_min * n, int(num_inference_steps))
            sigmas = timesteps / n
        else:
            sigmas = np.asarray(sigmas, dtype=np.float32)
            num_inference_steps = len(sigmas)
        self.num_inference_steps = int(num_inference_steps)
        if self.config.use_dynamic_shifting:
            sigmas = self.time_shift(mu, 1.0, sigmas)
        else:
            sigmas = self._shifted(sigmas, self.config.shift)
        if self.config.shift_terminal:
            one_minus = 1 - sigmas
            sigmas = 1 - one_minus / (one_minus[-1] / (1 - self.config.shift_terminal))
        sigmas = np.asarray(sigmas, dtype=np.float32)
        self.timesteps = (sigmas * n).astype(np.float32)
        self.sigmas = np.concatenate([sigmas, np.zeros(1, dtype=np.float32)])
        self._step_index = None
        self._begin_index = None

    def index_for_timestep(self, timestep, schedule_timesteps=None):
        schedule = self.timesteps if schedule_timesteps is None else schedule_timesteps
        indices = np.nonzero(schedule == np.float32(timestep))[0]
        if len(indices) == 0:
            raise ValueError(f"timestep {timestep!r} is not one of the scheduler's timesteps")
        return int(indices[1 if len(indices) > 1 else 0])

    def step(self, model_output, timestep, sample, return_dict=True, **unused):
        """x + (sigma_next - sigma) * model_output for the step at ``timestep`` (one of
        ``self.timesteps``; the first call finds its index, later calls go on from it)."""
        if isinstance(timestep, (int, np.integer)) and not isinstance(timestep, bool):
            raise ValueError("Passing integer indices (e.g. from enumerate(timesteps)) as timesteps to step() is not "
                             "supported: pass one of scheduler.timesteps")
        if self._step_index is None:
            self._step_index = self._begin_index if self._begin_index is not None else self.index_for_timestep(timestep)
        if self._step_index + 1 >= len(self.sigmas):
            raise IndexError("FlowMatchEulerDiscreteScheduler.step: past the last timestep (call set_timesteps again)")
        sigma, sigma_next = self.sigmas[self._step_index], self.sigmas[self._step_index + 1]
        prev_sample = sample + model_output * float(sigma_next - sigma)
        self._step_index += 1
        if not return_dict:
            return (prev_sample,)
        return FlowMatchEulerDiscreteSchedulerOutput(prev_sample=prev_sample)

    def scale_noise(self, sample, timestep, noise):
        """The forward process at ``timestep``: sigma * noise + (1 - sigma) * sample."""
        index = self._begin_index if self._begin_index is not None else self.index_for_timestep(timestep)
        sigma = float(self.sigmas[index])
        return noise * sigma + sample * (1.0 - sigma)

    def __len__(self):
        return self.config.num_train_timesteps


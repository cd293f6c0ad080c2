"""dtorch.serving: serving many clients from one model: continuous batching of their requests over
shared decode steps (``ContinuousBatcher``, each request with its own ``SamplingParams``), and an
OpenAI-compatible HTTP server over it (``dtorch.serving.server``, the ``dtorch-serve`` command).
The engine knows nothing of HTTP."""
from .batcher import ContinuousBatcher, Request
from .sampling import SamplingParams

__all__ = ["ContinuousBatcher", "Request", "SamplingParams"]

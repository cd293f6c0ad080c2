"""dtorch.serving: serving many clients from one model: continuous batching of their requests over
shared decode steps (``ContinuousBatcher``). The engine knows nothing of HTTP."""
from .batcher import ContinuousBatcher, Request

__all__ = ["ContinuousBatcher", "Request"]

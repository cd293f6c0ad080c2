"""dtorch.parallel: tensor parallelism with torch.distributed.tensor.parallel's names and semantics,
pipeline schedules (torch.distributed.pipelining's shape), context parallelism for causal decoders
(``context``: Ulysses, ring) and sequence-parallel joint attention (``sequence``: Ulysses, ring) for
models with a joint attention slot."""
from .api import parallelize_module
from .pipeline import PipelineStage, ScheduleGPipe
from .sequence import RingJointAttention, UlyssesJointAttention
from .style import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleOutput, ReplicateHeadsParallel,
                    RowwiseParallel, SequenceParallel, distribute_module)

__all__ = ["ColwiseParallel", "ParallelStyle", "PipelineStage", "PrepareModuleInput", "PrepareModuleOutput",
           "ReplicateHeadsParallel", "RingJointAttention", "RowwiseParallel", "ScheduleGPipe", "SequenceParallel",
           "UlyssesJointAttention", "distribute_module", "parallelize_module"]

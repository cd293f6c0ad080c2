"""dtorch.parallel: tensor parallelism with torch.distributed.tensor.parallel's names and semantics,
pipeline schedules (torch.distributed.pipelining's shape) and context parallelism (``context``)."""
from .api import parallelize_module
from .pipeline import PipelineStage, ScheduleGPipe
from .style import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleOutput, ReplicateHeadsParallel,
                    RowwiseParallel, SequenceParallel, distribute_module)

__all__ = ["ColwiseParallel", "ParallelStyle", "PipelineStage", "ScheduleGPipe", "PrepareModuleInput", "PrepareModuleOutput", "ReplicateHeadsParallel",
           "RowwiseParallel", "SequenceParallel", "distribute_module", "parallelize_module"]

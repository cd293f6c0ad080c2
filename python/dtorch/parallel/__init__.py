"""dtorch.parallel: tensor parallelism with torch.distributed.tensor.parallel's names and semantics."""
from .api import parallelize_module
from .style import (ColwiseParallel, ParallelStyle, PrepareModuleInput, PrepareModuleOutput, ReplicateHeadsParallel,
                    RowwiseParallel, SequenceParallel, distribute_module)

__all__ = ["ColwiseParallel", "ParallelStyle", "PrepareModuleInput", "PrepareModuleOutput", "ReplicateHeadsParallel",
           "RowwiseParallel", "SequenceParallel", "distribute_module", "parallelize_module"]

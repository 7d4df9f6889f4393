"""Every spec a policy declares, by the policy method that returns it."""

from __future__ import annotations

from .model import CheckpointSpec, ChecksSpec, KernelSpec
from .parallel import DataParallelSpec, ExpertSpec, TensorParallelSpec
from .pipeline import PipelineSpec
from .sequence import SequenceSpec

#: ``{policy method: spec class}`` (a composite merges each with the class's ``merge``)
SPECS: dict[str, type] = {
    "tensor_parallel": TensorParallelSpec,
    "pipeline": PipelineSpec,
    "sequence": SequenceSpec,
    "experts": ExpertSpec,
    "data_parallel": DataParallelSpec,
    "kernels": KernelSpec,
    "checkpoints": CheckpointSpec,
    "checks": ChecksSpec,
}

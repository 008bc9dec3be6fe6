"""``transformer_engine.pytorch.GroupedLinear``: the name megatron-core subclasses at import, refused when built.

megatron-core >= 0.16 defines ``TEGroupedLinear(te.pytorch.GroupedLinear)`` when it imports its
TE extensions (for TE >= 1.9), so the class must exist for the TE layer spec to import at all.
The grouped GEMM behind it belongs to the MoE work (issue 12, item 4); until it lands, building
one says so and what to use meanwhile. MoE experts without ``--moe-grouped-gemm`` are
``TEColumnParallelLinear`` / ``TERowParallelLinear`` per expert and work.
"""

from __future__ import annotations

from typing import Any

from ._common import TEModule

__all__ = ["GroupedLinear"]


class GroupedLinear(TEModule):
    """Refused: see the module docstring."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "transformer_engine.pytorch.GroupedLinear (MoE experts with --moe-grouped-gemm under "
            "--transformer-impl transformer_engine) is not provided by ascend_patch's transformer_engine layer in "
            "this version; drop --moe-grouped-gemm (experts run as one TE linear each) or use "
            "--transformer-impl local")

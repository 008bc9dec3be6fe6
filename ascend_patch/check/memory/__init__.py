"""``ascend-patch check --memory``: will the launch fit on the NPU, on every rank? Estimated from a laptop.

The launch's own Megatron-LM builds the model, optimizer and schedule for one simulated rank of
every role, on torch's fake process group with fake tensors (:mod:`.simulate`), and runs two
real training iterations; torch's ``MemTracker`` tracks the live tensor bytes (:mod:`.tracking`,
:mod:`.megatron_lm`). Non-tensor terms (HCCL buffers, the allocator's margin, the runtime's
reservation) are added as named lines with their sources (:mod:`.overheads`).
"""

from __future__ import annotations

__all__: list[str] = []

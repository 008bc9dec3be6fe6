"""TEST DOUBLE: a stand-in for ``torch.npu`` so npu-target translation can be checked without torch_npu.

It records calls; it runs nothing on any device. The privateuse1 backend is renamed
to "npu" in the child process that uses it, so ``torch.device("npu", 1)`` exists.
"""

from __future__ import annotations


class FakeNpuModule:
    """Records what the patched ``torch.cuda.*`` calls reach."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self._index = 0

    def set_device(self, device):
        self.calls.append(("set_device", device))
        self._index = device if isinstance(device, int) else device.index

    def current_device(self):
        return self._index

    def device_count(self):
        return 8

    def synchronize(self, device=None):
        self.calls.append(("synchronize", device))

    def manual_seed(self, seed):
        self.calls.append(("manual_seed", seed))

    def is_bf16_supported(self):
        return True

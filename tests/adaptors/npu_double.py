"""TEST DOUBLE: a stand-in for ``torch.npu`` so npu-target translation can be checked without torch_npu.

It records calls; it runs nothing on any device. Tensors "on the npu" exist only when
:mod:`npu_tensor_double` installs its Python backend (host memory behind an ``npu``
device type). The privateuse1 backend is renamed to "npu" only in the child
processes that use it: that rename cannot be undone in a process.
"""

from __future__ import annotations

import os
import types

_UNSET = object()


class FakeNpuModule:
    """Records what the patched ``torch.cuda.*`` calls reach.

    ``matmul.allow_hf32`` and ``conv.allow_hf32`` model torch_npu's documented HF32
    switches (``torch.npu.matmul.allow_hf32``, ``torch.npu.conv.allow_hf32``), with
    torch_npu's defaults (matmul off, convolution on).
    """

    def __init__(self, count: int = 8) -> None:
        self.calls: list[tuple] = []
        self._index = 0
        self._count = count
        self.matmul = types.SimpleNamespace(allow_hf32=False)
        self.conv = types.SimpleNamespace(allow_hf32=True)
        self.visible_at_first_count = _UNSET  # ASCEND_RT_VISIBLE_DEVICES when devices were first counted

    def set_device(self, device):
        self.calls.append(("set_device", device))
        self._index = device if isinstance(device, int) else device.index

    def current_device(self):
        return self._index

    def device_count(self):
        if self.visible_at_first_count is _UNSET:
            self.visible_at_first_count = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
        return self._count

    def synchronize(self, device=None):
        self.calls.append(("synchronize", device))

    def manual_seed(self, seed):
        self.calls.append(("manual_seed", seed))

    # torch.npu.get_rng_state / set_rng_state: TorchDynamo saves and restores the device generator's
    # state around tracing whenever torch.cuda.is_available() says True (patched: the npu)
    def get_rng_state(self, device="npu"):
        import torch

        if not hasattr(self, "_rng_state"):
            self._rng_state = torch.Generator().get_state()
        return self._rng_state.clone()

    def set_rng_state(self, new_state, device="npu"):
        self._rng_state = new_state.clone()

    def is_bf16_supported(self):
        return True

    # what torch asks of a registered device module (torch.utils.backend_registration, autocast)
    def is_available(self):
        return self._count > 0

    def is_initialized(self):
        return True

    def _is_in_bad_fork(self):
        return False

    def manual_seed_all(self, seed):
        self.calls.append(("manual_seed_all", seed))

    def get_amp_supported_dtype(self):
        import torch

        return [torch.float16, torch.bfloat16]

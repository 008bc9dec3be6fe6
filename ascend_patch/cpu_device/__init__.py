"""The cpu target's device module: ``torch.cuda``'s API with meaningful host behaviour.

The host is presented as ``device_count()`` virtual devices (the entries of
``CUDA_VISIBLE_DEVICES`` when set, else ``LOCAL_WORLD_SIZE`` when a launcher set it,
else 1) so that ``torch.cuda.set_device(local_rank)`` works for every worker; all
of them are the same host memory. Events really time (wall clock), memory
statistics come from the process (resident set and its high-water mark), the RNG
functions act on the generator that host tensors use, and a stream context works
(there is one execution queue, so waiting and synchronising return at once).

Each public callable carries an ``__ascend_action__`` of ``emulated`` or ``no-op``:
the migration report says what a call did.
"""

from .module import CpuDeviceModule, CpuDeviceProperties
from .nvtx import nvtx
from .streams import CpuEvent, CpuStream

__all__ = ["CpuDeviceModule", "CpuDeviceProperties", "CpuEvent", "CpuStream", "nvtx"]

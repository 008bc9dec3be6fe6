"""Measure the same terms on a real run: ``torchrun ... -m ascend_patch.check.memory.measure --out DIR script.py ARGS``.

Runs the launch's script unchanged (patched for the target the environment selects, as
``-m ascend_patch`` does), with the recording of :mod:`.megatron_lm` on real tensors: the
terms of its second iteration, tracked by torch's ``MemTracker`` exactly as the estimate
tracks them, are written to ``DIR/rank<N>.json`` by every rank, and the run goes on. The
accuracy tests compare the estimate with these files; on an NPU host the same command
measures the live tensor bytes there (what the estimate's tensor terms stand for).

On gloo, a blocking exchange's worker thread lets go of the caller's input and output a moment
after the call returns, so when the input's last reference was the caller's, its memory was
freed on that thread, sometimes after the next allocations of the step (measured: Megatron's
MoE token buffers, the tracked peak of one rank varied by 1.6 % between identical runs). Here
such exchanges run on untracked copies (:func:`exchanges_on_copies`): each tensor lives as long
as the program holds it, as the estimate counts it, and the peak is the same in every run.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import runpy
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

__all__ = ["exchanges_on_copies", "main"]

# torch.distributed's exchanges whose input the program drops right after (Megatron's MoE token and
# expert-output exchanges), (output, input, ...) first. Not the distributed optimizer's gathers and
# reduce-scatters: their tensors are its persistent buffers, and they run inside _coalescing_manager,
# where a blocking call only queues its work
EXCHANGES = ("all_to_all_single",)


def _coalescing(group: Any) -> bool:
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else c10d._get_default_group()
    return pg in getattr(c10d._world, "pg_coalesce_state", {})


def _on_copies(original: Any) -> Any:
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from ...comm.backend_names import real_backend

    signature = inspect.signature(original)

    def exchange(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        group, async_op = bound.arguments.get("group"), bound.arguments.get("async_op", False)
        if async_op or real_backend(group) != "gloo" or _coalescing(group):  # works that hold their tensors
            return original(*args, **kwargs)
        names = list(signature.parameters)[:2]
        output, given = bound.arguments[names[0]], bound.arguments[names[1]]
        with _disable_current_modes(), torch.no_grad():  # copies no tracker sees, and no autograd graph
            bound.arguments[names[0]] = out = torch.empty_like(output)
            bound.arguments[names[1]] = given.clone()
            result = original(*bound.args, **bound.kwargs)
            output.copy_(out)
        return result

    return exchange


@contextlib.contextmanager
def exchanges_on_copies() -> Iterator[None]:
    """While inside, blocking gloo exchanges (:data:`EXCHANGES`) hand the backend untracked copies of their tensors."""
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in EXCHANGES}
    for name, original in saved.items():
        setattr(dist, name, _on_copies(original))
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``script ARGS`` and write this rank's terms of iteration 2 to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m ascend_patch.check.memory.measure")
    parser.add_argument("--out", required=True, help="directory for rank<N>.json")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    import ascend_patch

    ascend_patch.apply()
    script = os.path.abspath(ns.script)
    sys.path.insert(0, os.path.dirname(script))
    os.makedirs(ns.out, exist_ok=True)

    def write(record: object) -> None:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        data = {"rank": rank, "terms": asdict(record.terms),  # type: ignore[attr-defined]
                "num_microbatches": record.num_microbatches}  # type: ignore[attr-defined]
        with open(os.path.join(ns.out, f"rank{rank}.json"), "w") as f:
            json.dump(data, f)

    from .megatron_lm import recorded_steps

    sys.argv = [script, *ns.args]
    with exchanges_on_copies(), recorded_steps(synthetic_data=False, stop_after=False, on_terms=write):
        runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())

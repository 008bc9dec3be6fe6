"""Megatron-LM's own ``pretrain``, run for two iterations with the memory terms recorded.

Both the estimate (fake tensors, one simulated rank) and ``measure`` (a real run) drive the
script the launch line names, unchanged: :func:`capture_pretrain` runs its ``__main__`` block
with ``megatron.training.pretrain`` standing in to catch the arguments it passes (the model
provider, the forward step, ``args_defaults``, ...), and :func:`recorded_steps` hooks four
names of ``megatron.training.training`` while the real ``pretrain`` runs:

* ``setup_model_and_optimizer``: tracked from the first tensor of the model on;
* ``train_step``: the measured iteration is tracked with the tracker entered afresh (its
  peak restarts), after the optimizer state exists; the terms are taken after it
  (:mod:`.tracking`);
* (estimate only) the data pipeline's preparation (``ESTIMATE_SKIPS``: compiling the
  dataset helpers), which the estimate never uses, and the functions :mod:`.shortcuts` runs as
  their allocations alone on fake tensors;
* ``build_train_valid_test_data_iterators``: each micro-batch reaches the step as a device copy
  (:func:`_device_batches`); in the estimate the data set's files are not on this machine, so
  the host micro-batches have the shapes and dtypes Megatron's GPT data set yields;
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import AscendPatchError
from . import shortcuts
from .megatron_names import BATCH_KEYS, ESTIMATE_SKIPS, TEARDOWN, TRAINING_HOOKS
from .formula import megatron_formula
from .tracking import Terms, peak_tracker, state_tensors, state_terms, step_terms

__all__ = ["MeasuredStep", "PretrainCall", "StepsDone", "capture_pretrain", "recorded_steps", "teardown"]


class _Captured(Exception):
    def __init__(self, args: tuple, kwargs: dict) -> None:
        super().__init__("pretrain captured")
        self.call_args, self.call_kwargs = args, kwargs


class StepsDone(BaseException):  # noqa: N818 (a signal, not an error)
    """Raised after the measured step when the run should stop there (the estimate).

    A BaseException, as SystemExit is: it unwinds Megatron-LM's training loop, whose ``except Exception``
    handlers must not take it for a failure, and it is never an error a user sees."""


@dataclass
class PretrainCall:
    """What the script's ``__main__`` passed to ``pretrain``."""

    script: str
    args: tuple
    kwargs: dict

    def run(self) -> Any:
        """The real ``megatron.training.training.pretrain`` with the script's arguments."""
        from megatron.training import training

        return training.pretrain(*self.args, **self.kwargs)


def capture_pretrain(script: str, argv: Sequence[str]) -> PretrainCall:
    """Run ``script`` as ``__main__`` until it calls ``megatron.training.pretrain``; return that call."""
    import megatron.training as package

    original, saved_argv = package.pretrain, sys.argv

    def capture(*args: Any, **kwargs: Any) -> Any:
        raise _Captured(args, kwargs)

    package.pretrain = capture
    sys.argv = [script, *argv]
    try:
        runpy.run_path(script, run_name="__main__")
    except _Captured as caught:
        return PretrainCall(script, caught.call_args, caught.call_kwargs)
    finally:
        package.pretrain = original
        sys.argv = saved_argv
    raise AscendPatchError(f"{script} ran to its end without calling megatron.training.pretrain: the memory "
                           "estimate drives Megatron-LM's pretrain (pretrain_gpt.py and scripts like it)")


@dataclass
class MeasuredStep:
    """The terms of the measured step, and the objects they were read from."""

    terms: Terms | None = None
    model: Any = None
    optimizer: Any = None
    steps: int = 0
    num_microbatches: int | None = None
    extra: dict = field(default_factory=dict)


def _batches(args: Any) -> Iterator[dict]:
    """Host micro-batches with the shapes and dtypes of Megatron's GPT data set (never written: no pages touched)."""
    import torch

    b, s = args.micro_batch_size, args.seq_length
    while True:
        batch = {}
        for key, dtype in BATCH_KEYS:
            if key == "attention_mask":
                if getattr(args, "create_attention_mask_in_dataloader", False):
                    batch[key] = torch.empty(b, 1, s, s, dtype=torch.bool)
            else:
                batch[key] = torch.empty(b, s, dtype=getattr(torch, dtype))
        yield batch


def _device_batches(iterator: Any) -> Any:
    """``iterator`` (a RerunDataIterator) whose micro-batches reach the tracked world as device copies.

    The data loader's tensors are host memory on an NPU: fetched with every dispatch mode off
    (untracked, fake or not), as are the copies Megatron's rerun machine keeps of a whole
    iteration's micro-batches. What the step receives is a copy made inside the modes: the
    device tensor ``.cuda()`` makes on an NPU (on the cpu target ``.cuda()`` is no copy, so
    without this the host batches would count as device memory).
    """
    import torch
    from megatron.core.rerun_state_machine import RerunDataIterator
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_map_only

    class DeviceBatches(RerunDataIterator):
        def __next__(self) -> Any:
            with _disable_current_modes():
                host = super().__next__()
            return tree_map_only(torch.Tensor, lambda t: t.clone(), host)

    if iterator is None:
        return None
    if isinstance(iterator, list):
        return [_device_batches(it) for it in iterator]
    inner = iterator.iterable if isinstance(iterator, RerunDataIterator) else iterator
    return DeviceBatches(inner)


@contextlib.contextmanager
def recorded_steps(*, synthetic_data: bool, stop_after: bool, state_only: bool = False,
                   on_terms: Callable[[MeasuredStep], None] | None = None) -> Iterator[MeasuredStep]:
    """While inside, ``pretrain`` records the terms of its measured iteration into the yielded :class:`MeasuredStep`.

    A real run (``synthetic_data=False``) is measured at its second iteration, when the first
    one has created the optimizer state. The estimate creates that state with one optimizer
    step on the zero gradients right after the model is built, and measures its first
    iteration: the same state, at a third less simulation than running an iteration more.
    ``state_only`` stops after that optimizer step, with the parameter, gradient and optimizer
    terms (activations 0).
    """
    from megatron.training import training
    from megatron.training.global_vars import get_args

    tracker = peak_tracker()
    record = MeasuredStep()
    original = {name: getattr(training, name) for name in TRAINING_HOOKS}
    measured = 1 if synthetic_data else 2

    def setup_model_and_optimizer(*args: Any, **kwargs: Any) -> Any:
        with tracker:
            result = original["setup_model_and_optimizer"](*args, **kwargs)
            record.model, record.optimizer = result[0], result[1]
            if synthetic_data:  # the optimizer state iteration 1 of the real run creates
                record.optimizer.zero_grad()
                record.optimizer.step()
        if state_only:
            record.terms = state_terms(record.model, record.optimizer)
            record.extra["formula"] = megatron_formula(get_args(), None)
            raise StepsDone()
        return result

    def train_step(*args: Any, **kwargs: Any) -> Any:
        record.steps += 1
        if record.steps < measured:
            with tracker:
                return original["train_step"](*args, **kwargs)
        if record.steps != measured:
            return original["train_step"](*args, **kwargs)
        params, grads, opt = state_tensors(record.model, record.optimizer)
        tracker.track_external(*[t for t in params + grads + opt if t is not None])
        record.num_microbatches = original["get_num_microbatches"]()
        with tracker:
            result = original["train_step"](*args, **kwargs)
        record.terms = step_terms(tracker, record.model, record.optimizer)
        record.extra["formula"] = megatron_formula(get_args(), record.num_microbatches)
        if on_terms is not None:
            on_terms(record)
        if stop_after:
            raise StepsDone()
        return result

    def build_train_valid_test_data_iterators(*args: Any, **kwargs: Any) -> Any:
        if not synthetic_data:
            train, valid, test = original["build_train_valid_test_data_iterators"](*args, **kwargs)
            return _device_batches(train), valid, test
        megatron_args = get_args()  # what Megatron's own builder records for pretrain
        megatron_args.do_train, megatron_args.do_valid, megatron_args.do_test = True, False, False
        return _device_batches(_batches(megatron_args)), None, None

    replaced = {"setup_model_and_optimizer": setup_model_and_optimizer, "train_step": train_step,
                "build_train_valid_test_data_iterators": build_train_valid_test_data_iterators}
    for name, value in replaced.items():
        setattr(training, name, value)
    skipped = []
    if synthetic_data:
        import importlib

        for module_name, function in ESTIMATE_SKIPS:
            module = importlib.import_module(module_name)
            skipped.append((module, function, getattr(module, function)))
            setattr(module, function, lambda *args, **kwargs: None)
    try:
        with shortcuts.fake_shortcuts() if synthetic_data else contextlib.nullcontext():
            yield record
    finally:
        for name, value in original.items():
            setattr(training, name, value)
        for module, function, value in skipped:
            setattr(module, function, value)


def teardown() -> None:
    """Forget the Megatron globals one ``pretrain`` set, so the next role starts clean."""
    import importlib

    for module_name, function in TEARDOWN:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, function, None)
        if fn is not None:
            fn()

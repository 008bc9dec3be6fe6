"""``transformer_engine.pytorch.GroupedLinear``: one linear per expert, run as one grouped GEMM."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ....ops.grouped_gemm import grouped_matmul
from ._common import TEModule, refuse, target_device, tp_size_of
from .linear import default_init_method

__all__ = ["GroupedLinear"]


class GroupedLinear(TEModule):
    """TE's ``GroupedLinear(num_gemms, in_features, out_features, ...)``; forward ``(inp, m_splits)``.

    megatron-core's ``TEGroupedMLP`` (``--moe-grouped-gemm`` under ``--transformer-impl
    transformer_engine``) builds its experts' ``linear_fc1`` / ``linear_fc2`` on this class through
    ``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear``. TE's semantics:

    * ``num_gemms`` weights ``weight0 .. weight{n-1}``, each ``[out, in]`` (``bias{i}`` ``[out]``, zero
      at start, or an empty tensor without bias), each initialised by ``init_method`` inside
      ``get_rng_state_tracker().fork(rng_tracker_name)`` in that order; weights tagged
      ``tensor_model_parallel`` (dim 1 for ``parallel_mode="row"``, else 0);
    * ``forward(inp, m_splits)``: rows ``m_splits[0]`` go through expert 0, the next ``m_splits[1]``
      through expert 1, ...; the output keeps the input's leading shape. ``return_bias`` returns
      ``(out, [bias_i])`` with the biases not added (megatron scales them by the routing
      probabilities itself);
    * ``fuse_wgrad_accumulation`` (megatron's ``gradient_accumulation_fusion``) adds the weight
      gradients into each weight's ``main_grad`` instead of returning them;
    * the state dict holds ``_extra_state`` (empty, no FP8 state), and the FP8 bookkeeping megatron's
      wrapper reads to split it per expert (``fp8``, ``fp8_calibration``, ``fp8_meta``) says "none".

    The GEMM is :func:`ascend_patch.ops.grouped_gemm.grouped_matmul` (``npu_grouped_matmul`` on npu, a
    loop over the non-empty experts on cpu). Like TE's, this class communicates nothing: megatron's
    token dispatcher moves the tokens between expert-parallel and expert-tensor-parallel ranks and
    hands it ``parallel_mode=None``. Refused with what to do instead: TE-level tensor parallelism
    (``tp_size > 1`` with a ``parallel_mode``), userbuffer overlap, ``delay_wgrad_compute``.
    """

    def __init__(self, num_gemms: int, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Callable[[], Any] | None = None, rng_tracker_name: str | None = None,
                 init_method: Callable[[Tensor], Any] | None = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: torch.dtype | None = None, parallel_mode: str | None = None, device: Any = "cuda",
                 ub_overlap_rs: bool = False, ub_overlap_ag: bool = False, ub_name: str | None = None,
                 delay_wgrad_compute: bool = False, save_original_input: bool = False,
                 name: str | None = None) -> None:
        super().__init__()
        if ub_overlap_rs or ub_overlap_ag:
            raise refuse("GroupedLinear", "ub_overlap_rs/ub_overlap_ag=True", "TE itself has no userbuffer "
                         "overlap for grouped GEMMs", "drop --tp-comm-overlap")
        if delay_wgrad_compute:
            raise refuse("GroupedLinear", "delay_wgrad_compute=True", "the weight gradients are computed in the "
                         "backward grouped GEMM", "drop --delay-wgrad-compute")
        if parallel_mode not in (None, "column", "row"):
            raise ValueError(f"transformer_engine.pytorch.GroupedLinear: parallel_mode must be None, 'column' or "
                             f"'row', got {parallel_mode!r}")
        self.tp_size = tp_size_of(tp_group, tp_size)
        if parallel_mode is not None and self.tp_size > 1:
            raise refuse("GroupedLinear", f"parallel_mode={parallel_mode!r}, tp_size={self.tp_size}",
                         "the experts' tensor parallelism is megatron's (its dispatcher gathers and scatters the "
                         "tokens; megatron's TEGroupedLinear passes parallel_mode=None)",
                         "shard the experts with megatron-core's TEGroupedMLP and --expert-tensor-parallel-size")
        self.num_gemms = num_gemms
        self.in_features, self.out_features = in_features, out_features
        self.tp_group, self.parallel_mode = tp_group, parallel_mode
        self.sequence_parallel = False  # no TE-level tensor parallelism here (see above)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.use_bias, self.return_bias = bias, return_bias
        self.apply_bias = bias and not return_bias
        self.get_rng_state_tracker, self.rng_tracker_name = get_rng_state_tracker, rng_tracker_name
        self.ub_name, self.name, self.save_original_input = ub_name, name, save_original_input
        # TE's FP8 bookkeeping, which megatron's TEGroupedLinear reads to split _extra_state per expert
        self.fp8 = self.fp8_calibration = self.primary_weights_in_fp8 = False
        self.fp8_meta: dict[str, Any] = {"fp8_checkpoint": False, "recipe": None}
        dtype = params_dtype or torch.get_default_dtype()
        where = target_device(device)
        init = init_method if init_method is not None else default_init_method
        for i in range(num_gemms):
            weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=where))
            if where.type != "meta":
                with torch.no_grad(), self._rng():
                    init(weight)
            weight.tensor_model_parallel = True  # type: ignore[attr-defined]
            weight.partition_dim = 1 if parallel_mode == "row" else 0  # type: ignore[attr-defined]
            weight.partition_stride = 1  # type: ignore[attr-defined]
            self.register_parameter(f"weight{i}", weight)
            if bias:
                self.register_parameter(f"bias{i}", torch.nn.Parameter(torch.zeros(out_features, dtype=dtype,
                                                                                   device=where)))
            else:
                setattr(self, f"bias{i}", torch.empty(0, dtype=dtype, device=where))  # TE's "no bias"

    def _rng(self) -> Any:
        if self.get_rng_state_tracker is None:
            return contextlib.nullcontext()
        tracker = self.get_rng_state_tracker()
        return tracker.fork(self.rng_tracker_name) if self.rng_tracker_name else tracker.fork()

    @property
    def weights(self) -> list[Tensor]:
        return [getattr(self, f"weight{i}") for i in range(self.num_gemms)]

    @property
    def biases(self) -> list[Tensor]:
        return [getattr(self, f"bias{i}") for i in range(self.num_gemms)]

    def forward(self, inp: Tensor, m_splits: Sequence[int] | Tensor, is_first_microbatch: bool | None = None) -> Any:
        if len(m_splits) != self.num_gemms:
            raise ValueError(f"transformer_engine.pytorch.GroupedLinear: {len(m_splits)} splits for "
                             f"{self.num_gemms} GEMMs; pass one token count per expert")
        weights = self.weights
        if self.fuse_wgrad_accumulation and self.training and torch.is_grad_enabled():
            lacking = [i for i, w in enumerate(weights) if w.requires_grad and not hasattr(w, "main_grad")]
            if lacking:
                raise RuntimeError(f"transformer_engine.pytorch.GroupedLinear(fuse_wgrad_accumulation=True): weights "
                                   f"{lacking} have no main_grad to accumulate into; wrap the model in megatron's "
                                   "DistributedDataParallel (which creates it) or turn the fusion off "
                                   "(--no-gradient-accumulation-fusion)")
            accumulate = True
        else:
            accumulate = False
        x = inp.reshape(-1, self.in_features)
        out = grouped_matmul(x, weights, m_splits, trans_b=True, accumulate_wgrad=accumulate)
        if self.apply_bias:
            counts = torch.as_tensor(list(m_splits) if not isinstance(m_splits, Tensor) else m_splits,
                                     device=out.device)
            out = out + torch.repeat_interleave(torch.stack(self.biases).to(out.dtype), counts, dim=0,
                                                output_size=out.shape[0])
        out = out.view(*inp.shape[:-1], self.out_features)
        if self.return_bias:
            return out, [b.to(out.dtype) for b in self.biases]
        return out

    def init_fp8_metadata(self, num_gemms: int = 1) -> None:
        """TE's FP8 metadata set-up (megatron calls it before loading a checkpoint): nothing to set up."""

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE's hook for a TP group created after the module."""
        self.tp_group = tp_group

    def backward_dw(self) -> None:
        """TE's delayed weight-gradient step: nothing is delayed here (``delay_wgrad_compute`` is refused)."""

    def extra_repr(self) -> str:
        return (f"num_gemms={self.num_gemms}, in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.use_bias}, parallel_mode={self.parallel_mode}")

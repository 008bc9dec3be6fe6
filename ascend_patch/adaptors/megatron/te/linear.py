"""``transformer_engine.pytorch.Linear`` and ``LayerNormLinear`` on megatron-core's tensor-parallel functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ._common import TEModule, refuse, target_device, tp_size_of
from .fp8 import fp8_unavailable
from .norm import apply_norm, norm_parameters

__all__ = ["LayerNormLinear", "Linear", "default_init_method"]

PARALLEL_MODES = (None, "column", "row")


def default_init_method(weight: Tensor) -> Tensor:
    """TE's default weight init when ``init_method`` is None: normal(0, 0.023)."""
    return torch.nn.init.normal_(weight, mean=0.0, std=0.023)


def _check_options(api: str, *, parameters_split: Any, delay_wgrad_compute: bool, symmetric_ar_type: Any,
                   ub: dict[str, Any]) -> None:
    if parameters_split is not None:
        raise refuse(api, f"parameters_split={parameters_split!r}", "the layer keeps one weight per module",
                     "split the weight yourself after the GEMM")
    on = sorted(name for name, value in ub.items() if value)
    if on:
        raise refuse(api, ", ".join(f"{n}=True" for n in on), "TP communication/GEMM overlap needs TE's userbuffers "
                     "on NVLink", "drop --tp-comm-overlap (TransformerConfig.tp_comm_overlap=False)")
    if delay_wgrad_compute:
        raise refuse(api, "delay_wgrad_compute=True", "the weight gradient is computed in the backward GEMM",
                     "drop --delay-wgrad-compute")
    if symmetric_ar_type is not None:
        raise refuse(api, f"symmetric_ar_type={symmetric_ar_type!r}", "symmetric-memory all-reduce is a CUDA "
                     "feature", "drop --symmetric-ar-type")


class _ParallelLinear(TEModule):
    """The GEMM and parameter handling Linear and LayerNormLinear share.

    TE's semantics, as megatron-core's ``TELinear`` / ``TEColumnParallelLinear`` /
    ``TERowParallelLinear`` / ``TELayerNormColumnParallelLinear`` use them:

    * ``parallel_mode="column"``: the weight is ``[out / tp, in]``; with ``sequence_parallel``
      the input is all-gathered along the sequence (and its gradient reduce-scattered),
      otherwise its gradient is all-reduced over the TP group. ``"row"``: the weight is
      ``[out, in / tp]`` and the output is all-reduced (reduce-scattered under sequence
      parallelism), the bias added after the reduction. ``None``: no communication.
    * The GEMM is megatron's ``linear_with_grad_accumulation_and_async_allreduce``, the one
      its local ``ColumnParallelLinear`` / ``RowParallelLinear`` run, so both
      ``--transformer-impl`` choices compute the same numbers; ``fuse_wgrad_accumulation``
      (megatron's ``gradient_accumulation_fusion``) accumulates the weight gradient into
      ``weight.main_grad`` there.
    * Initialisation as TE: the weight is created empty and ``init_method`` runs inside
      ``get_rng_state_tracker().fork(rng_tracker_name)`` (the model-parallel stream by default);
      the bias is zero. megatron's local layers draw the same stream in the same order, so
      one seed gives both implementations the same weights.
    * Parameter tags as TE: weights ``tensor_model_parallel`` (dim 0, or 1 for row), a column
      bias dim 0, a row bias ``sequence_parallel``; LayerNormLinear's norm parameters
      ``sequence_parallel``. ``bias=False`` leaves ``bias`` an empty tensor, as TE does.
    * ``return_bias=True`` returns ``(out, bias)`` with the bias not added (megatron fuses it
      with dropout and the residual). The state dict holds ``_extra_state`` (empty).

    Refused with an error saying what to do: TP communication overlap (``ub_*``,
    ``--tp-comm-overlap``), ``delay_wgrad_compute``, ``symmetric_ar_type``, ``parameters_split``,
    and FP8 outputs.
    """

    def _setup_linear(self, api: str, in_features: int, out_features: int, *, sequence_parallel: bool,
                      fuse_wgrad_accumulation: bool, tp_group: Any, tp_size: int,
                      get_rng_state_tracker: Callable[[], Any] | None, rng_tracker_name: str | None,
                      init_method: Callable[[Tensor], Any] | None, bias: bool, return_bias: bool,
                      params_dtype: torch.dtype | None, parallel_mode: str | None, device: Any) -> None:
        if parallel_mode not in PARALLEL_MODES:
            raise ValueError(f"transformer_engine.pytorch.{api}: parallel_mode must be one of {PARALLEL_MODES}, "
                             f"got {parallel_mode!r}")
        self.tp_group = tp_group
        self.tp_size = tp_size_of(tp_group, tp_size)
        self.parallel_mode = parallel_mode
        self.sequence_parallel = self.tp_size > 1 and bool(sequence_parallel)
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.use_bias = bias
        self.return_bias = return_bias
        self.apply_bias = bias and not return_bias
        self.get_rng_state_tracker = get_rng_state_tracker
        self.rng_tracker_name = rng_tracker_name
        self.in_features, self.out_features = in_features, out_features
        split = {"column": "out_features", "row": "in_features"}.get(parallel_mode or "")
        if split is not None:  # this rank's shard of the split dimension
            full = getattr(self, split)
            if full % self.tp_size:
                raise ValueError(f"transformer_engine.pytorch.{api}: {split}={full} is not divisible by the "
                                 f"tensor-parallel size {self.tp_size}")
            setattr(self, split, full // self.tp_size)
        dtype = params_dtype or torch.get_default_dtype()
        where = target_device(device)
        self.weight = torch.nn.Parameter(torch.empty(self.out_features, self.in_features, dtype=dtype, device=where))
        init = init_method if init_method is not None else default_init_method
        if where.type != "meta":
            with torch.no_grad():
                if get_rng_state_tracker is None:
                    init(self.weight)
                elif rng_tracker_name:
                    with get_rng_state_tracker().fork(rng_tracker_name):
                        init(self.weight)
                else:
                    with get_rng_state_tracker().fork():
                        init(self.weight)
        self.weight.tensor_model_parallel = True  # type: ignore[attr-defined]
        self.weight.partition_dim = 1 if parallel_mode == "row" else 0  # type: ignore[attr-defined]
        self.weight.partition_stride = 1  # type: ignore[attr-defined]
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(self.out_features, dtype=dtype, device=where))
            if parallel_mode == "row":
                self.bias.sequence_parallel = self.sequence_parallel  # type: ignore[attr-defined]
            elif parallel_mode == "column":
                self.bias.tensor_model_parallel = True  # type: ignore[attr-defined]
                self.bias.partition_dim = 0  # type: ignore[attr-defined]
                self.bias.partition_stride = 1  # type: ignore[attr-defined]
        else:
            self.bias = torch.empty(0, dtype=dtype, device=where)  # TE's "no bias"

    def _group_keywords(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The process-group keywords for megatron's GEMM (``tp_group=``) and its reductions (``group=``).

        Releases before the fact ``tp_group_arguments`` take neither: their functions always use the global
        tensor-parallel group, which is then the only group this module can run on.
        """
        from ..releases import has

        if has("tp_group_arguments"):
            return {"tp_group": self.tp_group}, {"group": self.tp_group}
        from megatron.core import parallel_state

        own = parallel_state.get_tensor_model_parallel_group(check_initialized=False)
        if self.tp_group is not None and own is not None and self.tp_group is not own:
            from ..releases import current_version

            raise refuse(type(self).__name__, "tp_group=<not the tensor-parallel group>", (
                f"megatron-core {current_version()}'s tensor-parallel GEMM and reductions always use the global "
                "tensor-parallel group, and this module was given another one"), "give the layer the "
                "tensor-parallel group (parallel_state.get_tensor_model_parallel_group()), or use megatron-core "
                "0.13 or newer, whose functions take the group")
        return {}, {}

    def _gemm(self, inp: Tensor) -> Tensor:
        from megatron.core.tensor_parallel import mappings
        from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce as gemm

        bias = self.bias if self.apply_bias else None
        gemm_group, reduce_group = self._group_keywords()
        if self.parallel_mode == "column" and self.tp_size > 1:
            allreduce_dgrad = not self.sequence_parallel
            return gemm(inp, self.weight, bias, self.fuse_wgrad_accumulation, allreduce_dgrad,
                        self.sequence_parallel, **gemm_group)
        if self.parallel_mode == "row" and self.tp_size > 1:
            out = gemm(inp, self.weight, None, self.fuse_wgrad_accumulation, False, False, **gemm_group)
            if self.sequence_parallel:
                out = mappings.reduce_scatter_to_sequence_parallel_region(out, **reduce_group)
            else:
                out = mappings.reduce_from_tensor_model_parallel_region(out, **reduce_group)
            return out + bias if bias is not None else out
        return gemm(inp, self.weight, bias, self.fuse_wgrad_accumulation, False, False, **gemm_group)

    def _outputs(self, out: Tensor, *extra: Tensor) -> Any:
        if self.return_bias:
            return (out, self.bias, *extra)
        return (out, *extra) if extra else out

    def set_tensor_parallel_group(self, tp_group: Any) -> None:
        """TE's hook for a TP group created after the module."""
        self.tp_group = tp_group

    def backward_dw(self) -> None:
        """TE's delayed weight-gradient step: nothing is delayed here (``delay_wgrad_compute`` is refused)."""

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.use_bias}, "
                f"parallel_mode={self.parallel_mode}, tp_size={self.tp_size}")


class Linear(_ParallelLinear):
    """TE's ``Linear(in_features, out_features, ...)``; forward ``(inp, is_first_microbatch=None)``."""

    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Callable[[], Any] | None = None, rng_tracker_name: str | None = None,
                 init_method: Callable[[Tensor], Any] | None = None, bias: bool = True, return_bias: bool = False,
                 params_dtype: torch.dtype | None = None, parallel_mode: str | None = None,
                 parameters_split: Any = None, device: Any = "cuda", ub_overlap_ag: bool = False,
                 ub_overlap_rs: bool = False, ub_overlap_rs_dgrad: bool = False, ub_bulk_dgrad: bool = False,
                 ub_bulk_wgrad: bool = False, ub_name: str | None = None, delay_wgrad_compute: bool = False,
                 symmetric_ar_type: str | None = None, save_original_input: bool = False,
                 name: str | None = None) -> None:
        super().__init__()
        _check_options("Linear", parameters_split=parameters_split, delay_wgrad_compute=delay_wgrad_compute,
                       symmetric_ar_type=symmetric_ar_type,
                       ub={"ub_overlap_ag": ub_overlap_ag, "ub_overlap_rs": ub_overlap_rs,
                           "ub_overlap_rs_dgrad": ub_overlap_rs_dgrad, "ub_bulk_dgrad": ub_bulk_dgrad,
                           "ub_bulk_wgrad": ub_bulk_wgrad})
        self.name, self.ub_name = name, ub_name
        self.save_original_input = save_original_input  # the input is always kept in full precision here
        self._setup_linear("Linear", in_features, out_features, sequence_parallel=sequence_parallel,
                           fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group, tp_size=tp_size,
                           get_rng_state_tracker=get_rng_state_tracker, rng_tracker_name=rng_tracker_name,
                           init_method=init_method, bias=bias, return_bias=return_bias, params_dtype=params_dtype,
                           parallel_mode=parallel_mode, device=device)

    def forward(self, inp: Tensor, is_first_microbatch: bool | None = None, fp8_output: bool = False,
                fp8_grad: bool = False) -> Any:
        if fp8_output or fp8_grad:
            raise fp8_unavailable("transformer_engine.pytorch.Linear(fp8_output/fp8_grad=True)")
        return self._outputs(self._gemm(inp))


class LayerNormLinear(_ParallelLinear):
    """TE's ``LayerNormLinear``: LayerNorm/RMSNorm (``layer_norm_weight``, ``layer_norm_bias``), then Linear."""

    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group: Any = None, tp_size: int = 1,
                 get_rng_state_tracker: Callable[[], Any] | None = None, rng_tracker_name: str | None = None,
                 init_method: Callable[[Tensor], Any] | None = None, bias: bool = True,
                 normalization: str = "LayerNorm", return_bias: bool = False,
                 params_dtype: torch.dtype | None = None, parallel_mode: str | None = None,
                 return_layernorm_output: bool = False, return_layernorm_output_gathered: bool = False,
                 parameters_split: Any = None, zero_centered_gamma: bool = False, device: Any = "cuda",
                 ub_overlap_ag: bool = False, ub_overlap_rs_dgrad: bool = False, ub_bulk_wgrad: bool = False,
                 ub_bulk_dgrad: bool = False, ub_name: str | None = None, delay_wgrad_compute: bool = False,
                 symmetric_ar_type: str | None = None, name: str | None = None) -> None:
        super().__init__()
        _check_options("LayerNormLinear", parameters_split=parameters_split, delay_wgrad_compute=delay_wgrad_compute,
                       symmetric_ar_type=symmetric_ar_type,
                       ub={"ub_overlap_ag": ub_overlap_ag, "ub_overlap_rs_dgrad": ub_overlap_rs_dgrad,
                           "ub_bulk_wgrad": ub_bulk_wgrad, "ub_bulk_dgrad": ub_bulk_dgrad})
        if return_layernorm_output_gathered:
            raise refuse("LayerNormLinear", "return_layernorm_output_gathered=True", "the norm output is returned "
                         "as the local shard", "use return_layernorm_output=True and gather it yourself")
        self.name, self.ub_name = name, ub_name
        self.eps = eps
        self.normalization = normalization
        self.zero_centered_gamma = zero_centered_gamma
        self.return_layernorm_output = return_layernorm_output
        sp = tp_size_of(tp_group, tp_size) > 1 and bool(sequence_parallel)
        norm_parameters(self, normalization, in_features, prefix="layer_norm_", zero_centered_gamma=zero_centered_gamma,
                        sequence_parallel=sp, dtype=params_dtype, device=target_device(device))
        self._setup_linear("LayerNormLinear", in_features, out_features, sequence_parallel=sequence_parallel,
                           fuse_wgrad_accumulation=fuse_wgrad_accumulation, tp_group=tp_group, tp_size=tp_size,
                           get_rng_state_tracker=get_rng_state_tracker, rng_tracker_name=rng_tracker_name,
                           init_method=init_method, bias=bias, return_bias=return_bias, params_dtype=params_dtype,
                           parallel_mode=parallel_mode, device=device)

    def forward(self, inp: Tensor, is_first_microbatch: bool | None = None, fp8_output: bool = False,
                fp8_grad: bool = False) -> Any:
        if fp8_output or fp8_grad:
            raise fp8_unavailable("transformer_engine.pytorch.LayerNormLinear(fp8_output/fp8_grad=True)")
        ln_out = apply_norm(inp, self.normalization, self.layer_norm_weight, self.layer_norm_bias, self.eps,
                            self.zero_centered_gamma)
        out = self._gemm(ln_out)
        return self._outputs(out, ln_out) if self.return_layernorm_output else self._outputs(out)

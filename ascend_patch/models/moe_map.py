"""Mixture-of-experts layers in a weight map: a dense map's MLP replaced by a router and experts.

megatron-core 0.16 names an MoE layer's tensors (legacy state dict, stage-local layer j,
EP-rank-local expert x):

* ``decoder.layers.j.mlp.router.weight`` [experts, hidden], replicated on every TP and EP rank;
* ``SequentialMLP`` (the local spec, and the TE spec without grouped GEMM):
  ``decoder.layers.j.mlp.experts.local_experts.x.linear_fc1.weight`` (gate and up rows of the
  expert-TP rank, as a dense gated fc1) and ``...linear_fc2.weight`` (split on columns);
* ``TEGroupedMLP`` (TE spec, ``--moe-grouped-gemm``): ``decoder.layers.j.mlp.experts.linear_fc1.weight{x}``
  and ``...linear_fc2.weight{x}``, same shapes.

The pre-MLP norm of an MoE layer stays ``pre_mlp_layernorm.weight`` in the TE spec too
(megatron-core folds it into ``linear_fc1`` only for a dense MLP). The legacy
``GroupedMLP`` (local spec with ``--moe-grouped-gemm``) stores every expert transposed in one
``weight1`` / ``weight2``; the converter does not write it (see :data:`GROUPED_MLP_REFUSAL`).
"""

from __future__ import annotations

import dataclasses

from .hf_config import ConfigMismatch
from .weightmap import Experts, GatedMLP, Replicated, RowParallel, Rule, WeightMap

__all__ = ["GROUPED_MLP_REFUSAL", "with_experts"]

_M = "decoder.layers.{j}."
_SEQ = _M + "mlp.experts.local_experts.{x}."
GROUPED_MLP_REFUSAL = ("megatron-core's legacy GroupedMLP (local spec with --moe-grouped-gemm) keeps the experts "
                       "transposed in mlp.experts.weight1/weight2, which the converter does not write; convert with "
                       "the local spec (SequentialMLP) or --saver-transformer-impl transformer_engine "
                       "--moe-grouped-gemm (TEGroupedMLP): megatron-core loads either and trains the same model")


def with_experts(dense: WeightMap, *, router: str, gate: str, up: str, down: str) -> WeightMap:
    """``dense`` with each layer's MLP replaced by a router and ``config.num_experts`` SwiGLU experts.

    ``router`` is the HF template of the router weight (``{i}``: layer); ``gate`` / ``up`` /
    ``down`` those of an expert's projections (``{i}`` and ``{e}``: the global expert).
    """
    cfg = dense.config
    if not cfg.num_experts:
        raise ConfigMismatch(f"{cfg.family}: the config has no experts")
    if cfg.activation != "swiglu":
        raise ConfigMismatch(f"{cfg.family}: experts with {cfg.activation} are not part of this map (SwiGLU only)")
    h, f = cfg.hidden_size, cfg.moe_ffn_hidden_size or cfg.ffn_hidden_size
    layer: list[Rule | Experts] = []
    for rule in dense.layer:
        if ".mlp.linear_fc" in rule.mg:
            continue  # the dense MLP
        if rule.mg.endswith("pre_mlp_layernorm.weight"):
            rule = dataclasses.replace(rule, te=None)  # not folded into an fc1 in front of a router
        layer.append(rule)
    experts = Experts(
        count=cfg.num_experts,
        rules=(GatedMLP(mg=_SEQ + "linear_fc1.weight", gate=gate, up=up, shape=(f, h)),
               RowParallel(mg=_SEQ + "linear_fc2.weight", hf=down, shape=(h, f))),
        grouped={_SEQ + "linear_fc1.weight": _M + "mlp.experts.linear_fc1.weight{x}",
                 _SEQ + "linear_fc2.weight": _M + "mlp.experts.linear_fc2.weight{x}"},
        extra_state=("mlp.experts.local_experts.{x}.linear_fc1", "mlp.experts.local_experts.{x}.linear_fc2"),
        grouped_extra_state=("mlp.experts.linear_fc1", "mlp.experts.linear_fc2"),
    )
    layer += [Replicated(mg=_M + "mlp.router.weight", hf=router, shape=(cfg.num_experts, h)), experts]
    dense_mlp = ("mlp.linear_fc1", "mlp.linear_fc2")
    return dataclasses.replace(
        dense, layer=tuple(layer),  # type: ignore[arg-type]
        layer_extra_state=tuple(m for m in dense.layer_extra_state if m not in dense_mlp),
        te_layer_extra_state=tuple(m for m in dense.te_layer_extra_state if m not in dense_mlp))

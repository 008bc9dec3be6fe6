"""What ``ascend-patch check`` finds, as data: the rank layout, the model, the checkpoint, every error."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import Finding
from ..parallel import (
    DEFAULT_ORDER,
    TRAINING_FLAGS,
    Layout,
    ParallelConfigError,
    check_experts,
    check_ffn_hidden_size,
    check_heads,
    check_layers,
    check_query_groups,
    check_seq_length,
    collect,
    divisors,
    format_choices,
    parse_layer_list,
    stages_from_first_last,
    RankRow,
    training_split_flags,
)
from .checkpoint import checkpoint_findings
from .launch import launch_from_args
from .probe import CheckpointLayout, probe_checkpoint

# check takes a per-stage list (--num-layer-list) to describe the launch; remedies name training's flags
CHECK_FLAGS = replace(TRAINING_FLAGS, layer_list="--num-layer-list")

__all__ = ["CHECK_FLAGS", "CheckReport", "ModelDims", "preflight"]


@dataclass
class ModelDims:
    """The model numbers the layout checks need (any may be unknown)."""

    source: str = ""
    num_layers: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_experts: int | None = None


@dataclass
class CheckReport:
    """What ``check`` found. ``errors`` non-empty means the launch would fail."""

    world_size: int | None
    nproc_per_node: int | None
    layout: Layout | None
    model: ModelDims | None
    checkpoint: CheckpointLayout | None
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[RankRow]:
        return self.layout.rank_table(self.nproc_per_node) if self.layout is not None else []


def _model_from_hf(path: str) -> ModelDims:
    from ..models.hf_config import read_config_json
    from ..models.registry import get_spec_registry

    cfg = read_config_json(path)
    spec = get_spec_registry().for_hf_config(cfg)
    mc = spec.config_from_hf(cfg)
    # the family's config map reads its experts (a dense family has none, whatever keys config.json holds)
    return ModelDims(f"{spec.name} from {path}", mc.num_layers, mc.num_attention_heads, mc.num_query_groups,
                     mc.hidden_size, mc.ffn_hidden_size, mc.num_experts if mc.is_moe else None)


def _joint_tp_sizes(m: ModelDims, world_size: int, pp: int, cp: int) -> str:
    """The TP sizes every model rule and the world accept at once (each error lists its own rule's)."""
    import math

    dims = [d for d in (m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size) if d]
    common = math.gcd(*dims) if dims else 1
    fits = [t for t in divisors(common) if world_size % (t * pp * cp) == 0]
    return (f"TP sizes that fit the heads, query groups, FFN and {world_size} ranks (PP={pp}, CP={cp}) together: "
            f"{format_choices(fits)}")


def _model_from_args(args: dict[str, Any], source: str) -> ModelDims | None:
    dims = ModelDims(source, args.get("num_layers"), args.get("num_attention_heads"),
                     args.get("num_query_groups") if args.get("group_query_attention", True) else None,
                     args.get("hidden_size"), args.get("ffn_hidden_size"), args.get("num_experts"))
    known = [v for k, v in asdict(dims).items() if k != "source" and v is not None]
    return dims if known else None


def _node_warnings(report: CheckReport, layout: Layout) -> None:
    per_node = report.nproc_per_node
    if not per_node or per_node >= layout.world_size:
        return
    for dims, name, why in (("tp", "TP", "tensor parallelism all-reduces activations in every layer"),
                            ("cp", "CP", "context parallelism exchanges keys/values in every attention layer")):
        for group in layout.groups(dims):
            nodes = sorted({r // per_node for r in group})
            if len(nodes) > 1:
                report.warnings.append(Finding(
                    "group-spans-nodes", f"{name} group {group} spans nodes {', '.join(map(str, nodes))}: {why}",
                    f"keep {name} x (faster dimensions) within the {per_node} devices of a node"))
                break


# :func:`preflight` takes the world, the parallel sizes (Megatron's names), optionally the
# model (an HF config, sizes, a Megatron command line) and a checkpoint directory, and
# returns a :class:`CheckReport`; :mod:`.cli` prints it.
def preflight(world_size: int | None = None, nnodes: int | None = None, nproc_per_node: int | None = None,
              tp: int | None = None, pp: int | None = None, cp: int | None = None, ep: int | None = None,
              etp: int | None = None,
              order: str = DEFAULT_ORDER, num_layer_list: str | list[int] | None = None, vpp: int | None = None,
              seq_length: int | None = None, sequence_parallel: bool = False, hf_config: str | None = None,
              model: ModelDims | None = None, load: str | None = None, trust_checkpoint: bool = False,
              target: str = "npu", megatron_args: Sequence[str] | None = None,
              first_stage_layers: int | None = None, last_stage_layers: int | None = None) -> CheckReport:
    """Everything ``ascend-patch check`` reports, as data.

    With ``hf_config``, model sizes given on the command line (``model``) and the flags of a
    Megatron command line (``megatron_args``) are checked against config.json: each that
    disagrees is an error. An uneven pipeline split is given as ``num_layer_list`` or, as
    Megatron-LM takes it, ``first_stage_layers`` / ``last_stage_layers``. The parallel sizes
    (None: not given) are also read from ``megatron_args`` (:mod:`.launch`); a size given
    both ways with two values is an error, and without ``hf_config`` the command line's
    model sizes describe the model.
    """
    report = CheckReport(None, nproc_per_node, None, None, None)
    asked = launch_from_args(dict(tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, seq_length=seq_length,
                                   first_stage_layers=first_stage_layers, last_stage_layers=last_stage_layers),
                              sequence_parallel, megatron_args)
    report.errors.extend(asked.findings)
    tp, pp, cp, ep, etp, vpp = (asked.values[k] for k in ("tp", "pp", "cp", "ep", "etp", "vpp"))
    seq_length, sequence_parallel = asked.values["seq_length"], asked.sequence_parallel
    first_stage_layers, last_stage_layers = asked.values["first_stage_layers"], asked.values["last_stage_layers"]
    if nnodes is not None and nproc_per_node is not None:
        nodes_world = nnodes * nproc_per_node
        if world_size is not None and world_size != nodes_world:
            report.errors.append(Finding("world-size", f"--world-size {world_size} disagrees with --nnodes {nnodes} x "
                                         f"--nproc-per-node {nproc_per_node} = {nodes_world}"))
        world_size = world_size or nodes_world
    if world_size is None:
        report.errors.append(Finding("world-size", "give --world-size, or --nnodes and --nproc-per-node"))
        return report
    report.world_size = world_size
    if nproc_per_node and world_size % nproc_per_node:
        report.errors.append(Finding("nodes", f"world size {world_size} is not a whole number of nodes of "
                                     f"{nproc_per_node} devices"))
    try:
        layout = Layout.from_world(world_size, tp=tp, pp=pp, cp=cp, ep=ep, expert_tp=etp, order=order)
    except ParallelConfigError as exc:
        report.errors.append(exc.finding)
        layout = None
    report.layout = layout
    if hf_config:
        try:
            report.model = _model_from_hf(hf_config)
        except (ValueError, LookupError) as exc:
            report.errors.append(Finding("hf-config", f"--hf-config {hf_config}: {exc}"))
    if model is not None and report.model is not None and hf_config:
        for name, value in asdict(model).items():
            said = getattr(report.model, name)
            if name != "source" and value is not None and said is not None and value != said:
                report.errors.append(Finding("model-flag", f"--{name.replace('_', '-')} {value} disagrees with "
                                             f"{hf_config}, which says {said}", "drop the flag or fix it"))
    if megatron_args and not hf_config and asked.model:  # the command line is the model's description
        given = ModelDims("--megatron-args", **asked.model)
        for name, value in asdict(model or ModelDims()).items():
            said = getattr(given, name)
            if name != "source" and value is not None and said is not None and value != said:
                report.errors.append(Finding("model-flag", f"--{name.replace('_', '-')} {value} disagrees with "
                                             f"--megatron-args, which says {said}", "give each size once"))
        report.model = given
    if megatron_args:
        if hf_config and report.model is not None:
            from ..models.args_cli import disagreements
            from ..models.hf_config import read_config_json
            from ..models.registry import get_spec_registry

            cfg = read_config_json(hf_config)
            spec = get_spec_registry().for_hf_config(cfg)
            problems = disagreements(spec.config_from_hf(cfg), megatron_args, spec=spec.name)
            for p in problems:  # which config the flags were held against
                report.errors.append(replace(p, remedy=f"{p.remedy} ({hf_config})") if p.remedy
                                     else replace(p, message=f"{p.message} ({hf_config})"))
    if model is not None:
        base = report.model or ModelDims()
        merged = {k: (v if v is not None else getattr(base, k)) for k, v in asdict(model).items() if k != "source"}
        report.model = ModelDims(model.source or base.source, **merged)
    if load:
        report.checkpoint = probe_checkpoint(load, trust=trust_checkpoint)
        saved = _model_from_args(report.checkpoint.args, f"the args saved in {load}")
        if report.model is None:
            report.model = saved
        elif saved is not None:
            for name in ("num_layers", "num_attention_heads", "num_query_groups", "hidden_size", "ffn_hidden_size"):
                mine, theirs = getattr(report.model, name), getattr(saved, name)
                if mine is not None and theirs is not None and mine != theirs:
                    report.errors.append(Finding("checkpoint-model", f"the checkpoint was saved with {name}={theirs} "
                                                 f"but {report.model.source} says {mine}: they are different models"))
    stages = None
    layer_list = parse_layer_list(num_layer_list)
    m = report.model
    per_stage = asked.layers_per_virtual_stage
    if per_stage and vpp is None and m is not None and m.num_layers:  # Megatron-LM's other spelling of VPP
        if m.num_layers % (pp * per_stage) == 0 and m.num_layers // (pp * per_stage) > 1:
            vpp = m.num_layers // (pp * per_stage)
        elif m.num_layers % (pp * per_stage):
            report.errors.append(Finding("megatron-args", f"--num-layers-per-virtual-pipeline-stage {per_stage}: "
                                         f"{m.num_layers} layers cannot be split into chunks of {per_stage} over "
                                         f"{pp} pipeline stages"))
    kv_refusal: list[Finding] = []
    if m is not None:
        checks = []
        if m.num_attention_heads:
            checks.append(lambda: check_heads(m.num_attention_heads, tp))
        if m.num_query_groups:
            checks.append(lambda: check_query_groups(m.num_query_groups, tp, m.num_attention_heads))
        if m.ffn_hidden_size:
            checks.append(lambda: check_ffn_hidden_size(m.ffn_hidden_size, tp))
        if m.num_experts:
            checks.append(lambda: check_experts(m.num_experts, ep))
        tp_errors = collect(*checks)
        report.errors.extend(tp_errors)
        if m.num_query_groups and not any(e.code == "query-groups" for e in tp_errors):
            # megatron-core replicates KV heads over TP; ascend-patch convert cannot write such a checkpoint:
            # the converter's own rule and message, for wherever this launch needs one of its checkpoints
            kv_refusal = collect(lambda: check_query_groups(m.num_query_groups, tp, m.num_attention_heads,
                                                            allow_replication=False, flags=CHECK_FLAGS))
            if kv_refusal and hf_config and not load:  # the HF weights reach Megatron only through convert
                report.errors.extend(kv_refusal)
                kv_refusal = []
        if any(e.code in ("heads", "query-groups", "ffn") for e in tp_errors):
            report.notes.append(_joint_tp_sizes(m, world_size, pp, cp))
        if m.num_layers:
            try:
                if first_stage_layers is not None or last_stage_layers is not None:
                    if layer_list is not None:
                        raise ParallelConfigError("give the uneven split once: --num-layer-list, or "
                                                  "--decoder-first/last-pipeline-num-layers", "layer-list")
                    layer_list = stages_from_first_last(m.num_layers, pp, first_stage_layers, last_stage_layers)
                stages = check_layers(m.num_layers, pp, vpp, layer_list, flags=CHECK_FLAGS)
                if layer_list is not None and (flags := training_split_flags(stages)):
                    report.notes.append(f"layers per pipeline stage {','.join(map(str, stages))}: megatron-core "
                                        f"builds them with {flags}")
            except ParallelConfigError as exc:
                report.errors.append(exc.finding)
    elif layer_list is not None or first_stage_layers is not None or last_stage_layers is not None:
        report.notes.append("the uneven pipeline split was not checked: the number of layers is unknown (give "
                            "--hf-config or --num-layers)")
    if seq_length is not None:
        report.errors.extend(collect(lambda: check_seq_length(seq_length, cp, tp, sequence_parallel)))
    if layout is not None:
        _node_warnings(report, layout)
        if report.checkpoint is not None:
            try:  # the launch's layout with its model chunks, and its layers when the model is known
                launch = replace(layout, vpp=vpp or 1)
                if stages and m is not None and m.num_layers:
                    launch = launch.placed(m.num_layers, layer_list, flags=CHECK_FLAGS)
            except ParallelConfigError as exc:  # already reported when the model is known
                if exc.finding not in report.errors:
                    report.errors.append(exc.finding)
            else:
                errors, notes = checkpoint_findings(report.checkpoint, launch, layer_list)
                report.errors.extend(errors)
                report.notes.extend(notes)
                if kv_refusal and any(e.code.startswith("checkpoint-") for e in errors):  # the re-shard is refused
                    report.errors.extend(kv_refusal)
                kv_refusal = []
    elif report.checkpoint is not None:
        report.errors.extend(report.checkpoint.problems)
    if kv_refusal and not load:
        report.warnings.extend(replace(f, code="convert-query-groups", remedy=f"{f.remedy} to convert checkpoints "
                                       "for it (megatron-core itself runs this TP)") for f in kv_refusal)
    from ..comm.env import nccl_environment

    for finding in nccl_environment(target):
        if not finding.effective:
            report.warnings.append(Finding("nccl-environment", finding.detail))
    return report

"""Verification: re-read a converted checkpoint and prove it holds what the mapping says.

Two checks, both streaming:

* **tensors** — every physical tensor of the output is recomputed from the source
  through the weight map (the same pieces the converter used, composed afresh from the
  re-opened output) and compared bit for bit (after casting to the output dtype).
  Without a source, the output is checked against itself: replicated norms and the
  tied output-layer copy must equal the tensors they replicate.
* **keys** — each Megatron model chunk's key set (and shapes) equals what
  megatron-core's GPTModel builds for those sizes (:mod:`.mcore_keys`); an HF output's
  equals what transformers' model has (built on the meta device). No key is left to
  random initialisation, none is silently ignored.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from ..dtypes import itemsize
from ..errors import Finding
from ..models.weightmap import TensorPlan, compose
from ..parallel import LayoutError
from .blocks import BlockFiller, FileCache, raw_to_torch, row_blocks
from .formats import ConvertOptions, SourceCheckpoint, UnknownFormat, get_format_registry
from .megatron_layout import chunk_index, parse_rank_dir, rank_coordinates

__all__ = ["verify", "VerifyReport", "detect_loader", "compare_keys"]

_BLOCK = 16 * 1024 * 1024


@dataclass
class VerifyReport:
    """The outcome: ``ok`` when no problem was found."""

    output: str
    source: str | None
    tensors_checked: int = 0
    bytes_checked: int = 0
    key_sets_checked: int = 0
    seconds: float = 0.0
    problems: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        against = f"against {self.source}" if self.source else "for internal consistency"
        head = (f"verify {'OK' if self.ok else 'FAILED'}: {self.output} {against}: {self.tensors_checked} tensors "
                f"({self.bytes_checked / 1e6:.1f} MB) compared, {self.key_sets_checked} key sets checked, "
                f"{self.seconds:.2f} s")
        lines = [head] + [f"  - {p}" for p in self.problems] + [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def detect_loader(path: str) -> str:
    """The first registered loader whose ``detect`` accepts ``path``."""
    registry = get_format_registry()
    for loader in registry.all("loader"):
        if loader.detect(path):
            return loader.name
    raise UnknownFormat(f"{path}: no loader recognises this checkpoint (loaders: {registry.listing('loader')}); "
                     "pass --loader")


def verify(output: str, source: SourceCheckpoint | str | None = None, *, loader: str | None = None,
           source_loader: str | None = None, options: ConvertOptions | None = None,
           check_keys: bool = True) -> VerifyReport:
    """Check the checkpoint at ``output`` (against ``source`` when given); see the module docstring."""
    options = options or ConvertOptions()
    start = time.perf_counter()
    registry = get_format_registry()
    out = registry.loader(loader or detect_loader(output)).open(output, options)
    src: SourceCheckpoint | None
    if isinstance(source, str):
        src = registry.loader(source_loader or detect_loader(source)).open(source, options)
    else:
        src = source
    report = VerifyReport(output=output, source=src.path if src is not None else None)
    report.problems += out.problems
    if src is not None:
        report.problems += _compare_configs(src, out)
    _check_tensors(out, src, report)
    if check_keys:
        _check_key_sets(out, report)
    report.seconds = time.perf_counter() - start
    return report


def _compare_configs(src: SourceCheckpoint, out: SourceCheckpoint) -> list[Finding]:
    a, b = src.config.to_dict(), out.config.to_dict()
    fields = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
              "kv_channels", "vocab_size", "tie_word_embeddings", "qk_layernorm", "add_qkv_bias", "norm_epsilon",
              "rotary_base")
    return [Finding("config-mismatch", f"{f}: source {a[f]!r}, output {b[f]!r}") for f in fields if a[f] != b[f]]


def _check_tensors(out: SourceCheckpoint, src: SourceCheckpoint | None, report: VerifyReport) -> None:
    import numpy as np

    reference = src if src is not None else out
    files_out, files_ref = FileCache(), FileCache()
    actual = BlockFiller(out.tensors, files_out)
    expect = BlockFiller(reference.tensors, files_ref)
    bad: list[str] = []
    nonzero_padding = 0
    try:
        for pid, plan in out.plans.items():
            try:
                composed = compose(plan, reference.canonical)
            except LayoutError as exc:
                report.problems.append(Finding("verify-compose", f"{pid}: {exc}"))
                continue
            info = out.tensors[pid]
            shape = plan.shape or (1,)
            row_bytes = itemsize(info.dtype) * math.prod(shape[1:])
            mismatch = None
            for r0, r1 in row_blocks(shape[0], row_bytes, _BLOCK):
                got = actual.read_rows(pid, r0, r1).reshape(r1 - r0, *shape[1:])  # raw bits
                want = np.empty_like(got)
                ident = TensorPlan(plan.key, shape, composed.pieces)
                expect.fill(ident, r0, r1, want, info.dtype)  # cast to the output dtype where needed
                for piece in composed.pieces:
                    part = piece.rows(r0, r1)
                    if part is None:
                        continue
                    idx = tuple(slice(b - (r0 if k == 0 else 0), b - (r0 if k == 0 else 0) + n)
                                for k, (b, n) in enumerate(zip(part.dst_start, part.size)))
                    g, w = got[idx], want[idx]
                    if part.src is None:
                        nonzero_padding += int(np.count_nonzero(g))
                        continue
                    if src is None and part.src == pid:
                        continue  # a primary compared with itself
                    if not np.array_equal(g, w):
                        mismatch = _max_diff(g, w, info.dtype)
                        break
                if mismatch is not None:
                    break
            report.tensors_checked += 1
            report.bytes_checked += info.nbytes
            if mismatch is not None:
                rel = os.path.relpath(info.path, out.path)
                where = pid if rel in pid else f"{pid} in {rel}"
                bad.append(f"{where} (max |diff| {mismatch:.3g})")
    finally:
        files_out.close()
        files_ref.close()
    if bad:
        report.problems.append(Finding("tensor-mismatch", f"{len(bad)} tensor(s) differ from the "
                                       f"{'source' if src is not None else 'tensors they replicate'}: "
                                       f"{', '.join(bad[:8])}{' ...' if len(bad) > 8 else ''}"))
    if nonzero_padding:
        report.notes.append(f"{nonzero_padding} vocabulary-padding elements the source has no value for are "
                            "non-zero (Megatron-LM's tools/checkpoint pads with copies of the last row; harmless, "
                            "they are trimmed on export)")


def _max_diff(a: Any, b: Any, dtype: str) -> float:
    return float((raw_to_torch(a, dtype).double() - raw_to_torch(b, dtype).double()).abs().max())


def compare_keys(expected: dict[str, Any], found: dict[str, Any], where: str) -> list[Finding]:
    """Missing / unexpected keys and shape differences between two key -> shape maps."""
    problems = []
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found)
                   if expected[k] is not None and found[k] is not None and tuple(expected[k]) != tuple(found[k]))
    if missing:
        problems.append(Finding("keys-missing", f"{where} lacks {len(missing)} key(s) the model has, which would "
                                f"keep their random initialisation: {', '.join(missing[:8])}"))
    if unexpected:
        problems.append(Finding("keys-unexpected", f"{where} holds {len(unexpected)} key(s) the model does not "
                                f"have: {', '.join(unexpected[:8])}"))
    if wrong:
        problems.append(Finding("keys-shape", f"{where}: {len(wrong)} shape(s) differ from the model's: " + ", ".join(
            f"{k} {list(found[k])} vs {list(expected[k])}" for k in wrong[:8])))
    return problems


def _check_key_sets(out: SourceCheckpoint, report: VerifyReport) -> None:
    if out.format == "torch_dist":
        for where, found in out.inventory.items():
            report.problems += compare_keys(_dist_expected(out, found), found, f"{where} vs megatron-core GPTModel")
            report.key_sets_checked += 1
        return
    if out.layout is not None:
        from .mcore_keys import megatron_expected_state

        for where, found in sorted(out.inventory.items()):
            rel, _, chunk = where.partition("#")  # the mg loader's "<rank file>#<model chunk>"
            parts = parse_rank_dir(os.path.basename(os.path.dirname(rel)))
            if parts is None or not chunk:
                continue
            _, pp_rank, _ = rank_coordinates(parts, out.layout.pp, out.layout.ep)
            vp = chunk_index(chunk)
            expected = megatron_expected_state(out.config, out.layout, pp_rank, vp, out.naming or "local",
                                               out.padded_vocab)
            report.problems += compare_keys(expected, found, f"{where} vs megatron-core GPTModel")
            report.key_sets_checked += 1
        return
    expected = _transformers_state(out.path)
    if expected is None:
        report.notes.append("transformers is not installed: the HF key set was not checked")
        return
    found: dict[str, Any] = {}
    for inv in out.inventory.values():
        found.update(inv)
    found = {k: v for k, v in found.items() if not k.endswith("rotary_emb.inv_freq")}
    report.problems += compare_keys(expected, found, f"{out.path} vs transformers")
    report.key_sets_checked += 1


def _dist_expected(out: SourceCheckpoint, found: dict[str, Any]) -> dict[str, Any]:
    """The torch_dist keys of megatron-core's GPTModel (its TP 1 state dict, layers stacked; extra states as
    per-layer objects of the local or the TE spec, whichever the checkpoint holds; the output layer's is never
    saved)."""
    from ..parallel import Layout
    from .mcore_keys import megatron_expected_state
    from .megatron_layout import dist_cell, dist_local_spec_name, dist_object_key

    layers = out.config.num_layers
    grids = {0: (), 1: (layers,), 2: (layers, out.config.num_experts or 0)}
    layout = Layout.build(layers, 1, 1, 1)
    tensors: dict[str, Any] = {}
    objects: dict[str, dict[str, Any]] = {}
    for naming in ("local", "te"):
        objects[naming] = {}
        for key, shape in megatron_expected_state(out.config, layout, 0, 0, naming, out.padded_vocab).items():
            name, cell = dist_cell(key)
            if shape is None:
                if cell:
                    objects[naming][dist_object_key(name, cell, grids[len(cell)])] = None
            elif naming == "te":  # megatron-core's local spec saves its norms under the TE names too...
                # ...but an MoE model's pre-MLP norm under a name of its own: either (or both) will do
                alias = dist_local_spec_name(name)
                for held_as in [n for n in (name, alias) if n is not None and n in found] or [name]:
                    tensors[held_as] = (*grids[len(cell)], *shape)
    held = {k for k in found if found[k] is None}
    return {**tensors, **(objects["te"] if held == set(objects["te"]) else objects["local"])}


def _transformers_state(path: str) -> dict[str, tuple[int, ...]] | None:
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        return None
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    raw = model.state_dict()
    try:  # transformers 5 fuses experts in memory (mlp.experts.gate_up_proj); its files keep one tensor per expert
        from transformers.core_model_loading import revert_weight_conversion

        raw = revert_weight_conversion(model, raw)  # shape-only on the meta device, as save_pretrained does it
    except ImportError:  # transformers 4: the module's own keys are the file's
        pass
    state = {k: tuple(v.shape) for k, v in raw.items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    return state

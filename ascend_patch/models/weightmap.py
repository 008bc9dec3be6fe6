"""Declarative HF <-> Megatron weight maps: rules and parallel layouts (the piece algebra is :mod:`.pieces`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import FindingError
from ..parallel import Layout, LayoutError
from .hf_config import ModelConfig
from .pieces import Piece, Shape, TensorPlan, compose, coverage_gaps, invert, is_padding, padding_key

__all__ = [
    "Piece",
    "TensorPlan",
    "ExtraState",
    "Rule",
    "Replicated",
    "ColumnParallel",
    "RowParallel",
    "QKV",
    "GatedMLP",
    "VocabParallel",
    "Experts",
    "WeightMap",
    "NAMINGS",
    "RuleIncomplete",
    "WeightMapError",
    "invert",
    "compose",
    "padding_key",
    "is_padding",
    "coverage_gaps",
]

# A family's ``weights.py`` lists *rules* (``Replicated``, ``ColumnParallel``,
# ``RowParallel``, ``QKV``, ``GatedMLP``, ``VocabParallel``), each naming the Hugging
# Face tensor(s), their shape, and the megatron-core key. Given a
# :class:`~ascend_patch.parallel.Layout` (TP, PP, virtual pipeline chunks, layers per chunk) the map
# answers, for every Megatron rank, which tensors that rank holds and how each is
# assembled from rectangular *pieces* of the HF tensors. Inverting and composing
# pieces gives mg -> hf and mg -> mg without a second description, and lets the
# converter stream: every output block is filled from exactly the source bytes it needs.
#
# Megatron's vocabulary padding rows are pieces of a canonical tensor of their own,
# :func:`padding_key` of the HF key, which no HF checkpoint holds: an mg -> mg conversion
# carries the rows a Megatron source holds (Megatron-LM trains them, and its cross
# entropy includes their logits), and :func:`compose` fills the rows a source lacks
# (an HF source, or a larger padded vocabulary) with zeros.
#
# Nothing here imports torch: a map is plain data.
NAMINGS = ("local", "te", "te_grouped")


class WeightMapError(FindingError):
    """A weight map that does not describe its tensors consistently (a family's or a plugin's ``weights.py``)."""


class RuleIncomplete(WeightMapError, NotImplementedError):
    """A rule class that lacks part of the rule contract (also a NotImplementedError, as it was)."""  # te_grouped: the TE spec with grouped-GEMM experts (TEGroupedMLP)


@dataclass(frozen=True)
class ExtraState:
    """A ``<module>._extra_state`` entry megatron-core expects next to the weights (saved as None)."""

    key: str


def _full(key: str, shape: Shape) -> tuple[Piece, ...]:
    return (Piece(key, (0,) * len(shape), (0,) * len(shape), tuple(shape)),)


def _take_rows(segments: Sequence[tuple[str | None, int, int]], rest: Shape, start: int, stop: int) -> tuple[Piece, ...]:
    """Rows [start, stop) of the virtual concatenation of ``segments`` (src, src_row0, n_rows)."""
    pieces: list[Piece] = []
    pos = 0
    zeros = (0,) * len(rest)
    for src, row0, n in segments:
        lo, hi = max(start, pos), min(stop, pos + n)
        if lo < hi:
            pieces.append(Piece(src, (row0 + lo - pos, *zeros), (lo - start, *zeros), (hi - lo, *rest)))
        pos += n
    return tuple(pieces)


def _split(n: int, tp: int, what: str) -> int:
    if n % tp:
        raise LayoutError(f"{what} of size {n} cannot be split over {tp} tensor-parallel ranks")
    return n // tp


# ---------------------------------------------------------------------------------------------
# Rules. Templates use {i} for the global layer index (HF) and {j} for the stage-local one (Megatron).


@dataclass(frozen=True)
class Rule:
    """Base: ``hf`` keys (with their shapes) -> one Megatron key (local and TE spellings)."""

    mg: str
    te: str | None = None

    @property
    def kind(self) -> str:
        return type(self).__name__

    def hf_shapes(self) -> dict[str, Shape]:
        raise RuleIncomplete(f"weight-map rule {self.kind} ({self.mg}) does not say which HF tensors it reads",
                             "rule", "implement hf_shapes() in the rule class (see ascend_patch.models.weightmap)")

    def mg_key(self, naming: str) -> str:
        return self.te if (naming in ("te", "te_grouped") and self.te) else self.mg

    def shard(self, names: Mapping[str, str], tp: int, rank: int, padded_vocab: int) -> tuple[Shape, tuple[Piece, ...]]:
        """(shape, pieces) of TP rank ``rank``; ``names`` maps template -> concrete HF key."""
        raise RuleIncomplete(f"weight-map rule {self.kind} ({self.mg}) does not say how a TP rank's tensor is cut",
                             "rule", "implement shard() in the rule class (see ascend_patch.models.weightmap)")


@dataclass(frozen=True)
class Replicated(Rule):
    """Every TP rank holds the whole tensor (norm weights)."""

    hf: str = ""
    shape: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        return {self.hf: self.shape}

    def shard(self, names, tp, rank, padded_vocab):
        return self.shape, _full(names[self.hf], self.shape)


@dataclass(frozen=True)
class ColumnParallel(Rule):
    """Split along dim 0 (output features)."""

    hf: str = ""
    shape: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        return {self.hf: self.shape}

    def shard(self, names, tp, rank, padded_vocab):
        n = _split(self.shape[0], tp, self.hf)
        rest = self.shape[1:]
        return (n, *rest), _take_rows([(names[self.hf], 0, self.shape[0])], rest, rank * n, (rank + 1) * n)


@dataclass(frozen=True)
class RowParallel(Rule):
    """Split along dim 1 (input features): o_proj, down_proj."""

    hf: str = ""
    shape: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        return {self.hf: self.shape}

    def shard(self, names, tp, rank, padded_vocab):
        rows, cols = self.shape
        c = _split(cols, tp, self.hf)
        return (rows, c), (Piece(names[self.hf], (0, rank * c), (0, 0), (rows, c)),)


@dataclass(frozen=True)
class QKV(Rule):
    """q, k, v fused per query group: [q_g (heads/groups*d rows), k_g (d), v_g (d)] for each group g.

    Works for weights ([rows, H]) and biases ([rows]); ``rest`` is the trailing shape.
    """

    q: str = ""
    k: str = ""
    v: str = ""
    heads: int = 1
    groups: int = 1
    head_dim: int = 1
    rest: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        d = self.head_dim
        return {self.q: (self.heads * d, *self.rest), self.k: (self.groups * d, *self.rest),
                self.v: (self.groups * d, *self.rest)}

    def _segments(self, names: Mapping[str, str]) -> list[tuple[str | None, int, int]]:
        d, per = self.head_dim, self.heads // self.groups
        segs: list[tuple[str | None, int, int]] = []
        for g in range(self.groups):
            segs.append((names[self.q], g * per * d, per * d))
            segs.append((names[self.k], g * d, d))
            segs.append((names[self.v], g * d, d))
        return segs

    def shard(self, names, tp, rank, padded_vocab):
        if self.groups % tp:
            raise LayoutError(f"{self.groups} query groups cannot be split over {tp} tensor-parallel ranks")
        total = (self.heads + 2 * self.groups) * self.head_dim
        n = total // tp
        return (n, *self.rest), _take_rows(self._segments(names), self.rest, rank * n, (rank + 1) * n)


@dataclass(frozen=True)
class GatedMLP(Rule):
    """SwiGLU's fc1: rank r holds [gate rows of r; up rows of r]."""

    gate: str = ""
    up: str = ""
    shape: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        return {self.gate: self.shape, self.up: self.shape}

    def shard(self, names, tp, rank, padded_vocab):
        ffn, rest = self.shape[0], self.shape[1:]
        n = _split(ffn, tp, self.gate)
        segs = [(names[self.gate], rank * n, n), (names[self.up], rank * n, n)]
        return (2 * n, *rest), _take_rows(segs, rest, 0, 2 * n)


@dataclass(frozen=True)
class VocabParallel(Rule):
    """Embedding / output layer: rows padded to the padded vocabulary, then split on dim 0.

    The padding rows are rows of :func:`padding_key` (``hf``): a Megatron source's own
    padding, or zeros where the source has none (:func:`compose`).
    """

    hf: str = ""
    shape: Shape = ()

    def hf_shapes(self) -> dict[str, Shape]:
        return {self.hf: self.shape}

    def shard(self, names, tp, rank, padded_vocab):
        vocab, rest = self.shape[0], self.shape[1:]
        if padded_vocab < vocab:
            raise LayoutError(f"padded vocabulary {padded_vocab} is smaller than the vocabulary {vocab}")
        n = _split(padded_vocab, tp, "padded vocabulary")
        segs = [(names[self.hf], 0, vocab), (padding_key(names[self.hf]), 0, padded_vocab - vocab)]
        return (n, *rest), _take_rows(segs, rest, rank * n, (rank + 1) * n)


@dataclass(frozen=True)
class Experts:
    """A layer's experts: ``rules`` repeated for each of ``count`` experts, split over EP ranks.

    Inside ``rules``, HF templates use ``{e}`` (the global expert index) and Megatron keys
    ``{x}`` (the index among the EP rank's local experts: megatron-core's legacy state dict
    numbers each rank's experts from 0). Each expert's tensors are split over the expert
    tensor-parallel ranks as their rule says; EP rank ``r`` holds experts
    ``[r * count/EP, (r+1) * count/EP)``. ``grouped`` optionally renames each rule's key for
    Transformer Engine's grouped GEMM (``mlp.experts.linear_fc1.weight{x}``), keyed by the
    rule's ``mg`` template.
    """

    count: int
    rules: tuple[Rule, ...]
    grouped: Mapping[str, str] = field(default_factory=dict)
    extra_state: tuple[str, ...] = ()  # module paths per local expert ({x}), local and SequentialMLP TE spec
    grouped_extra_state: tuple[str, ...] = ()  # module paths (no {x}) of the grouped-GEMM experts

    @property
    def kind(self) -> str:
        return "Experts"

    def hf_shapes(self) -> dict[str, Shape]:
        """Every expert's HF tensors (``{e}`` filled in, ``{i}`` left for the layer)."""
        out: dict[str, Shape] = {}
        for e in range(self.count):
            for rule in self.rules:
                out.update({t.replace("{e}", str(e)): shape for t, shape in rule.hf_shapes().items()})
        return out

    def local(self, ep: int, ep_rank: int) -> range:
        """The global indices of the experts EP rank ``ep_rank`` holds."""
        if self.count % ep:
            raise LayoutError(f"{self.count} experts cannot be split over {ep} expert-parallel ranks")
        n = self.count // ep
        return range(ep_rank * n, (ep_rank + 1) * n)

    def key(self, rule: Rule, naming: str) -> str:
        if naming == "te_grouped" and rule.mg in self.grouped:
            return self.grouped[rule.mg]
        return rule.mg_key("te" if naming == "te_grouped" else naming)


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightMap:
    """A family's complete map: rules for the embedding, each layer, the final norm and the head."""

    config: ModelConfig
    embedding: tuple[Rule, ...]
    layer: tuple[Rule, ...]
    final: tuple[Rule, ...]
    output: Rule | None
    layer_extra_state: tuple[str, ...] = ()  # module paths under decoder.layers.{j} (local spec)
    te_layer_extra_state: tuple[str, ...] = ()  # module paths under decoder.layers.{j} (TE spec)
    output_extra_state: str | None = "output_layer"
    hf_layer_prefix: str = "model.layers.{i}."
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def tied(self) -> bool:
        return self.config.tie_word_embeddings

    # -- the HF side --------------------------------------------------------------------------
    def hf_tensors(self) -> dict[str, Shape]:
        """Every tensor an HF checkpoint of this model holds (a tied model has no lm_head)."""
        out: dict[str, Shape] = {}
        for rule in self.embedding:
            out.update(rule.hf_shapes())
        for i in range(self.config.num_layers):
            for rule in self.layer:
                for tmpl, shape in rule.hf_shapes().items():
                    out[tmpl.format(i=i)] = shape
        for rule in self.final:
            out.update(rule.hf_shapes())
        if self.output is not None and not self.tied:
            out.update(self.output.hf_shapes())
        return out

    # -- the Megatron side --------------------------------------------------------------------
    @property
    def experts(self) -> Experts | None:
        """The layer's experts (None for a dense model)."""
        return next((r for r in self.layer if isinstance(r, Experts)), None)

    def megatron_chunk(self, layout: Layout, tp_rank: int, pp_rank: int, vp: int = 0,
                       naming: str = "local", padded_vocab: int | None = None,
                       ep_rank: int = 0) -> list[TensorPlan | ExtraState]:
        """The state dict of one model chunk on one rank (``ep_rank``: its experts), in megatron-core's key order.

        With experts, the legacy layout names files by TP rank, so the experts are split over
        expert-TP = TP ranks (``tp_rank`` is the expert-TP rank too)."""
        if naming not in NAMINGS:
            raise LayoutError(f"unknown key naming {naming!r}; use one of {', '.join(NAMINGS)}")
        if ep_rank >= layout.ep:
            raise LayoutError(f"expert-parallel rank {ep_rank} is outside 0..{layout.ep - 1}")
        if padded_vocab is None:
            padded_vocab = self.config.vocab_size
        tp = layout.tp
        entries: list[TensorPlan | ExtraState] = []

        def add(rule: Rule, names: Mapping[str, str], mg_key: str) -> None:
            shape, pieces = rule.shard(names, tp, tp_rank, padded_vocab)
            entries.append(TensorPlan(mg_key, shape, pieces, rule.kind))

        first, last = layout.is_first(pp_rank, vp), layout.is_last(pp_rank, vp)
        if first:
            for rule in self.embedding:
                add(rule, _identity(rule), rule.mg_key(naming))
        te = naming in ("te", "te_grouped")
        for j, i in enumerate(layout.layers(pp_rank, vp)):
            for rule in self.layer:
                if isinstance(rule, Experts):
                    for x, e in enumerate(rule.local(layout.ep, ep_rank)):
                        for inner in rule.rules:
                            names = {t: t.format(i=i, e=e) for t in inner.hf_shapes()}
                            shape, pieces = inner.shard(names, layout.etp, tp_rank, padded_vocab)
                            entries.append(TensorPlan(rule.key(inner, naming).format(j=j, x=x), shape, pieces,
                                                      inner.kind))
                    continue
                names = {t: t.format(i=i) for t in rule.hf_shapes()}
                add(rule, names, rule.mg_key(naming).format(j=j))
            for module in (self.te_layer_extra_state if te else self.layer_extra_state):
                entries.append(ExtraState(f"decoder.layers.{j}.{module}._extra_state"))
            moe = self.experts
            if moe is not None:
                per_expert = () if naming == "te_grouped" else moe.extra_state
                for x in range(moe.count // layout.ep):
                    entries += [ExtraState(f"decoder.layers.{j}.{m.format(x=x)}._extra_state") for m in per_expert]
                if naming == "te_grouped":
                    entries += [ExtraState(f"decoder.layers.{j}.{m}._extra_state") for m in moe.grouped_extra_state]
        if last:
            for rule in self.final:
                add(rule, _identity(rule), rule.mg_key(naming))
            if self.output is not None:
                if not self.tied:
                    add(self.output, _identity(self.output), self.output.mg_key(naming))
                elif not first:
                    # PP > 1 with tied embeddings: the last stage keeps its own copy of the embedding.
                    emb = self.embedding[0]
                    add(emb, _identity(emb), self.output.mg_key(naming))
            if self.output_extra_state:
                entries.append(ExtraState(f"{self.output_extra_state}._extra_state"))
        return entries

    def megatron_ranks(self, layout: Layout, naming: str = "local",
                       padded_vocab: int | None = None) -> dict[tuple[int, int, int], list[list[TensorPlan | ExtraState]]]:
        """(tp_rank, pp_rank, ep_rank) -> one entry list per virtual chunk."""
        return {(t, p, e): [self.megatron_chunk(layout, t, p, v, naming, padded_vocab, e) for v in range(layout.vpp)]
                for t, p, e in layout.rank_files()}


def _identity(rule: Rule) -> dict[str, str]:
    return {t: t for t in rule.hf_shapes()}

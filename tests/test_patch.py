"""Patch records: one type per way of changing a target, each checking its own fields."""

from __future__ import annotations

import dataclasses

import pytest

from ascend_patch.patch import Action, Add, EnvVar, ModuleShim, Patch, PatchKind, Replace, Wrap


def test_each_record_type_carries_its_kind_and_common_fields():
    records = [Replace("m:a", "r", replacement=1), Add("m:b", "r", make=lambda _: 2),
               Wrap("m:c", "r", wrapper=lambda w, i, a, k: w(*a, **k)),
               ModuleShim("pkg.mod", "r", make=lambda name: None, hidden_from=("megatron",)),
               EnvVar("NAME", "r", make=lambda cur: cur, action=Action.NOOP, api="CUDA_NAME")]
    assert [r.kind for r in records] == [PatchKind.REPLACE, PatchKind.ADD, PatchKind.WRAP, PatchKind.MODULE,
                                         PatchKind.ENV]
    assert [(r.module, r.attribute) for r in records[:3]] == [("m", "a"), ("m", "b"), ("m", "c")]
    assert records[4].shown_as == "CUDA_NAME" and records[0].shown_as == "m.a"
    assert records[1].build(None) == 2 and records[0].build("orig") == 1 and records[4].build("x") == "x"
    assert dataclasses.replace(records[0], owner="me").owner == "me"
    assert records[0] == dataclasses.replace(records[0], owner="other")  # the owner is not part of equality
    assert records[0] != dataclasses.replace(records[0], reason="other") and records[0] != records[1]
    assert len({records[0], dataclasses.replace(records[0], owner="x"), records[1]}) == 2  # hashable by value
    assert repr(records[4]).startswith("EnvVar(target='NAME', reason='r', backends=")
    with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'target'"):
        records[0].target = "m:other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del records[0].reason


def test_records_refuse_what_they_cannot_apply():
    with pytest.raises(TypeError, match="use Replace, Wrap, Add, ModuleShim or EnvVar"):
        Patch("m:a", "r")
    with pytest.raises(ValueError, match="replace patch 'm:a' needs exactly one of replacement= or make="):
        Replace("m:a", "r")
    with pytest.raises(ValueError, match="add patch 'm:a' needs exactly one of replacement= or make="):
        Add("m:a", "r", replacement=1, make=lambda _: 1)
    with pytest.raises(TypeError, match="wrapper"):
        Wrap("m:a", "r")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="patch target 'a' must be 'module:attribute.path'"):
        Replace("a", "r", replacement=1)
    with pytest.raises(ValueError, match="package= goes with versions= or needed="):
        EnvVar("X", "r", make=lambda cur: cur, package="torch")
    with pytest.raises(TypeError, match="unexpected keyword argument 'hidden_from'"):
        Replace("m:a", "r", replacement=1, hidden_from=("x",))  # type: ignore[call-arg]


def test_replacing_marks_a_replacement_with_what_it_replaces():
    import inspect

    from ascend_patch.patch import replacing

    def original(x: int, *, scale: float = 1.0) -> float:
        """The original's docstring."""
        return x * scale

    @replacing(original)
    def quiet(*args, **kwargs):
        return original(*args, **kwargs)

    @replacing(original)
    def documented(*args, **kwargs):
        """Says what it does itself."""
        return original(*args, **kwargs)

    assert quiet.__wrapped__ is original and inspect.unwrap(quiet) is original
    assert inspect.signature(quiet) == inspect.signature(original)  # (x, *, scale=1.0)
    assert quiet.__doc__ == "The original's docstring." and documented.__doc__ == "Says what it does itself."
    assert quiet.__name__ == "quiet" and quiet.__module__ == __name__  # still says where it comes from
    assert quiet(2, scale=1.5) == 3.0

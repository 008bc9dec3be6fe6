"""The named registry: one object per name, both sides named on a clash, unknown names list the known ones."""

from __future__ import annotations

import pytest

from ascend_patch.errors import AscendPatchError
from ascend_patch.registry import DuplicateName, NamedRegistry, UnknownName, loose_key


class Thing:
    def __init__(self, name: str) -> None:
        self.name = name


def test_names_and_aliases_resolve_case_insensitively_to_one_object():
    registry: NamedRegistry[Thing] = NamedRegistry("widget")
    a, b = Thing("a"), Thing("b")
    registry.add(a, "alpha", ("A1", "first"), owner="one")
    registry.add(b, "beta", owner="two")
    assert registry.get("ALPHA") is a and registry.get("a1") is a and registry.get("Beta") is b
    assert registry.find("gamma") is None and registry.find("first") is a
    assert registry.owner_of("first") == "one" and registry.owner_of("beta") == "two" and registry.owner_of("x") == ""
    assert registry.names() == ["alpha", "beta"] and list(registry) == [a, b]
    assert registry.names_of(a) == ["alpha", "a1", "first"]
    registry.add(a, "alpha", ("first",), owner="one")  # the same claim again is no clash
    assert registry.names() == ["alpha", "beta"]


def test_a_name_claimed_twice_names_both_sides():
    registry: NamedRegistry[Thing] = NamedRegistry("widget")
    registry.add(Thing("a"), "alpha", ("shared",), owner="plugin_one", label="widget 'alpha'")
    with pytest.raises(DuplicateName) as info:
        registry.add(Thing("b"), "beta", ("SHARED",), owner="plugin_two")
    assert str(info.value) == ("widget name 'SHARED' is claimed by plugin plugin_one (widget 'alpha') "
                               "and by plugin plugin_two (beta)")
    assert isinstance(info.value, ValueError) and isinstance(info.value, AscendPatchError)
    assert registry.find("beta") is None  # a refused object leaves no name behind


def test_unknown_name_lists_the_known_ones_with_the_registrys_own_error():
    class UnknownWidget(UnknownName):
        pass

    registry: NamedRegistry[Thing] = NamedRegistry("widget", hint="Add one with a plugin", unknown=UnknownWidget)
    registry.add(Thing("b"), "beta")
    registry.add(Thing("a"), "alpha")
    with pytest.raises(UnknownWidget) as info:
        registry.get("gamma")
    assert str(info.value) == "unknown widget 'gamma'; known: alpha, beta. Add one with a plugin"
    assert isinstance(info.value, LookupError)
    with pytest.raises(UnknownName, match="unknown widget 'x'; known: none"):
        NamedRegistry("widget").get("x")


def test_an_alias_added_later_points_at_the_object_and_keeps_its_owner():
    registry: NamedRegistry[Thing] = NamedRegistry("format", listing=lambda r: "; ".join(
        f"{n} ({', '.join(r.names_of(r.get(n))[1:])})" for n in r.names()))
    hf = Thing("hf")
    registry.add(hf, "hf", ("huggingface",), owner="loaders")
    registry.alias("qwen3_hf", "hf", owner="models")
    assert registry.get("QWEN3_HF") is hf and registry.owner_of("qwen3_hf") == "loaders"
    registry.alias("qwen3_hf", "huggingface", owner="models")  # the same alias twice is accepted
    assert registry.listing() == "hf (huggingface, qwen3_hf)"
    registry.add(Thing("mg"), "mg", owner="loaders")
    with pytest.raises(DuplicateName, match=r"'mg' is claimed by plugin loaders \(mg\) and by plugin models "
                                            r"\(an alias of hf\)"):
        registry.alias("mg", "hf", owner="models")
    with pytest.raises(UnknownName, match="unknown format 'zarr'"):
        registry.alias("z", "zarr")


def test_a_loose_registry_ignores_punctuation():
    registry: NamedRegistry[Thing] = NamedRegistry("family", key=loose_key)
    q = Thing("qwen2")
    registry.add(q, "qwen2", ("qwen2.5",))
    assert registry.get("Qwen2_5") is q and registry.get("qwen25") is q and registry.get("QWEN-2") is q
    assert loose_key("Llama-3.1") == "llama31"

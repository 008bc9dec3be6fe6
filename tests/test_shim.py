"""The shim declaration (ShimSpec tables) and the one builder that serves them."""

from __future__ import annotations

import collections
import importlib
import sys

import pytest

from ascend_patch.shim import (
    SHIM_INIT,
    Renamed,
    ShimBuilder,
    ShimImportError,
    ShimMissing,
    ShimSpec,
    is_shim,
    resolve_path,
    shim_markdown,
    table_rows,
    update_shim_tables,
)

# a package "fakepkg" whose names map to objects of the standard library
TABLE = {
    "fakepkg": ShimSpec("a stand-in", {"join": "os.path:join"}, children=("sub",), version="1.2.3",
                        hints={"gone": "use join", "*": "only join and sub"}),
    "fakepkg.sub": ShimSpec("the submodule", {"OrderedDict": Renamed("collections:OrderedDict", "fakepkg.sub.dicts"),
                                              "join": "os.path:join"}),
    "fakepkg.empty": ShimSpec("nothing but a hint", hints={"*": "nothing here"}),
}


def test_a_module_is_its_declaration():
    build = ShimBuilder(TABLE)
    mod = build("fakepkg")
    assert is_shim(mod) and mod.__doc__ == "ascend_patch shim for fakepkg: a stand-in"
    assert mod.join is importlib.import_module("os.path").join
    assert mod.__all__ == ["join"] and mod.__version__ == "1.2.3"  # the version is not an exported name
    assert mod.sub is build.module("fakepkg.sub")  # the child, as an attribute, before any import
    with pytest.raises(ShimMissing, match=r"fakepkg\.gone is not provided by ascend_patch's fakepkg shim .*use join"):
        mod.gone
    with pytest.raises(ShimMissing, match="only join and sub"):
        mod.other
    with pytest.raises(KeyError, match="no shim module called 'fakepkg.nope'; known: fakepkg, fakepkg.sub"):
        build("fakepkg.nope")


def test_each_object_and_module_once_per_builder():
    build = ShimBuilder(TABLE)
    sub = build.module("fakepkg.sub")
    renamed = sub.OrderedDict
    assert issubclass(renamed, collections.OrderedDict) and renamed is not collections.OrderedDict
    assert (renamed.__name__, renamed.__qualname__, renamed.__module__) == ("OrderedDict", "OrderedDict",
                                                                            "fakepkg.sub.dicts")
    assert build("fakepkg.sub") is sub and build.resolve("OrderedDict", TABLE["fakepkg.sub"].provides[
        "OrderedDict"]) is renamed
    assert ShimBuilder(TABLE).module("fakepkg.sub").OrderedDict is not renamed  # another apply: another class


def test_importing_a_package_imports_its_children_as_its_init_would():
    from ascend_patch.patching.shim_finder import ShimFinder

    build = ShimBuilder(TABLE)
    assert SHIM_INIT not in build.module("fakepkg.empty").__dict__  # a plain module() hands out no init
    finder = ShimFinder()
    for name in TABLE:
        finder.add(name, build)
    finder.install()
    try:
        import fakepkg

        assert "fakepkg.sub" in sys.modules and sys.modules["fakepkg.sub"] is fakepkg.sub is build.module("fakepkg.sub")
        assert SHIM_INIT not in fakepkg.__dict__  # the finder ran it
        assert "fakepkg.empty" not in sys.modules  # not a child: imported on demand only
        with pytest.raises(ShimImportError, match="nothing here"):
            from fakepkg.empty import anything  # noqa: F401
    finally:
        removed = finder.uninstall()
    assert sorted(removed) == ["fakepkg", "fakepkg.empty", "fakepkg.sub"] and "fakepkg" not in sys.modules


def test_the_listing_and_the_docs_block():
    rows = table_rows(TABLE)
    assert rows == [
        ("fakepkg", "__version__", "'1.2.3' (the API level implemented, not an install)"),
        ("fakepkg", "join", "os.path:join"),
        ("fakepkg", "sub", "submodule fakepkg.sub, imported with it"),
        ("fakepkg.sub", "OrderedDict", "collections:OrderedDict as fakepkg.sub.dicts.OrderedDict"),
        ("fakepkg.sub", "join", "os.path:join"),
        ("fakepkg.empty", "", "nothing but a hint"),
    ]
    table = shim_markdown({"fakepkg": TABLE}, ["fakepkg"])
    version = "| `fakepkg` | `__version__` | `'1.2.3'` (the API level implemented, not an install) |"
    assert table.splitlines()[:3] == ["| shim module | name | maps to |", "|---|---|---|", version]
    doc = "intro\n<!-- shim-tables: fakepkg -->\nold rows\n<!-- /shim-tables -->\nafter\n"
    new = update_shim_tables(doc, lambda packages: shim_markdown({"fakepkg": TABLE}, packages))
    assert new == f"intro\n<!-- shim-tables: fakepkg -->\n{table}\n<!-- /shim-tables -->\nafter\n"
    assert update_shim_tables(new, lambda packages: shim_markdown({"fakepkg": TABLE}, packages)) == new
    with pytest.raises(KeyError, match="no shim table for 'other'; known: fakepkg"):
        shim_markdown({"fakepkg": TABLE}, ["other"])
    assert resolve_path("os.path:join") is importlib.import_module("os.path").join

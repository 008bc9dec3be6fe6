"""The docs say what the code does: generated tables are regenerated, not edited by hand."""

import os

from helpers import REPO


def test_coverage_table_matches_the_patch_table():
    import ascend_patch
    from ascend_patch.adaptors.device.coverage import coverage_markdown
    from ascend_patch.config import Settings

    with ascend_patch.patched(Settings(device="cpu")) as report:
        table = coverage_markdown(report)
    with open(os.path.join(REPO, "docs", "coverage.md")) as f:
        doc = f.read()
    missing = [line for line in table.splitlines() if line not in doc]
    assert not missing, ("docs/coverage.md is stale; regenerate the table with "
                         
                         "`ascend-patch report --device cpu --markdown --update docs/coverage.md`:\n" + "\n".join(missing[:5]))


def test_shim_tables_match_the_declarations():
    """docs/ops.md and docs/megatron.md list every shim module's names, generated from the shim tables."""
    import ascend_patch
    from ascend_patch.config import Settings
    from ascend_patch.shim import shim_markdown, update_shim_tables

    with ascend_patch.patched(Settings(device="cpu")) as report:
        tables = report.shim_tables()
    listed = []
    for page in ("ops.md", "megatron.md"):
        with open(os.path.join(REPO, "docs", page)) as f:
            doc = f.read()

        def render(packages, page=page):
            listed.extend(packages)
            return shim_markdown(tables, packages)

        assert update_shim_tables(doc, render) == doc, (
            f"docs/{page}'s shim tables are stale; regenerate them with "
            f"`ascend-patch report --device cpu --shims --markdown --update docs/{page}`")
    assert sorted(listed) == sorted(tables)  # every shimmed package is listed, once


def test_relative_links_in_readme_and_docs_resolve():
    import glob
    import re

    pages = [os.path.join(REPO, "README.md"), *glob.glob(os.path.join(REPO, "docs", "*.md")),
             *glob.glob(os.path.join(REPO, "examples", "**", "README.md"), recursive=True)]
    broken = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if "://" in target or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not os.path.exists(path):
                broken.append(f"{os.path.relpath(page, REPO)} -> {target}")
    assert len(pages) > 8 and not broken, broken

"""The docs say what the code does: generated tables are regenerated, not edited by hand."""

import os

from helpers import REPO


def test_coverage_table_matches_the_patch_table():
    import ascend_patch
    from ascend_patch.adaptors.coverage import coverage_markdown
    from ascend_patch.config import Settings

    with ascend_patch.patched(Settings(device="cpu")) as report:
        table = coverage_markdown(report)
    with open(os.path.join(REPO, "docs", "coverage.md")) as f:
        doc = f.read()
    missing = [line for line in table.splitlines() if line not in doc]
    assert not missing, ("docs/coverage.md is stale; regenerate the table with "
                         
                         "`ascend-patch report --device cpu --markdown --update docs/coverage.md`:\n" + "\n".join(missing[:5]))

"""``ascend-patch migrate SCRIPT.sh``: a MindSpeed-LLM launch as a stock Megatron-LM launch, flag by flag.

Prints a runnable bash script (the translated ``torchrun ... -m ascend_patch pretrain_gpt.py``
launch, the variables it exports, any step it needs first) whose trailing comments are the table
of what became of each flag; ``--format json`` prints the same as a document, ``--markdown`` the
rule table of docs/migrating.md. Exit status 1 when a flag is refused (the script says which).
"""

from __future__ import annotations

import argparse
import sys

from ..errors import AscendPatchError

__all__ = ["main", "register"]


def main(args: argparse.Namespace) -> int:
    from . import migrate_launch
    from .releases import rules
    from .report import format_json, format_script, markdown_table, replace_table
    from .script import from_command, read_script

    if args.markdown:
        table = markdown_table(rules())
        if args.update:
            changed = replace_table(args.update, table)
            print(f"{'updated' if changed else 'unchanged'}: the migration table in {args.update}")
        else:
            print(table)
        return 0
    try:
        words = [w for i, w in enumerate(args.words) if not (i == 0 and w == "--")]
        if len(words) == 1 and not words[0].endswith(".py"):
            with open(words[0], encoding="utf-8") as f:
                launch, source = read_script(f.read()), words[0]
        elif words:
            launch, source = from_command(words), "the command line"
        else:
            print("ascend-patch migrate: give SCRIPT.sh, or the command after --", file=sys.stderr)
            return 2
        migration = migrate_launch(launch, megatron=args.megatron_release, mindspeed_llm=args.mindspeed_llm_release)
    except (AscendPatchError, OSError) as exc:
        print(f"ascend-patch migrate: {exc}", file=sys.stderr)
        return 2
    print(format_json(launch, migration) if args.format == "json" else format_script(launch, migration, source))
    if migration.refused:
        print(migration.refusal(), file=sys.stderr)
        return 1
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("migrate", help="a MindSpeed-LLM launch script as a stock Megatron-LM launch, flag by flag",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("words", nargs="*", metavar="SCRIPT.sh | -- COMMAND",
                        help="the MindSpeed-LLM launch script, or its command after -- (torchrun ... pretrain_gpt.py ...)")
    parser.add_argument("--format", choices=("script", "json"), default="script",
                        help="script (default): a runnable bash script with the table as comments; json: a document")
    parser.add_argument("--megatron-release", metavar="X.Y.Z",
                        help="the megatron-core release to translate for (default: the one importable here)")
    parser.add_argument("--mindspeed-llm-release", metavar="X.Y.Z",
                        help="the MindSpeed-LLM release the script was written for (default: 26.1.0)")
    parser.add_argument("--markdown", action="store_true", help="print the rule table (docs/migrating.md)")
    parser.add_argument("--update", metavar="DOC", help="with --markdown: replace the table in DOC in place")
    parser.set_defaults(func=main)

"""``reprotune check-split MANIFEST DATA``: same data as the manifest's? which rows changed? leakage?

Exit codes: 0 the data is exactly the manifest's (and, with ``--fail-on-leak``, no leakage);
1 the data changed (including a change of formatting only) or, with ``--fail-on-leak``, text
leaks across splits; 2 bad input. Imports nothing heavy at module level.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from reprotune._cli._options import add_format_option, path_text

if TYPE_CHECKING:
    from reprotune._data.manifest import Manifest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the command's arguments."""
    parser.add_argument(
        "manifest", type=path_text, metavar="MANIFEST", help="a manifest written by `reprotune split`"
    )
    parser.add_argument(
        "data", type=path_text, metavar="DATA", help="JSONL, CSV or Parquet file, or builtin:chatterbot-en"
    )
    add_format_option(parser)
    parser.add_argument("--fail-on-leak", action="store_true", help="exit 1 when text leaks across splits")
    parser.add_argument(
        "--leak-columns",
        metavar="COL,COL",
        help="columns compared for leakage (default: the columns of text, except the stratify/group "
        "column; columns of ids, numbers, one-word labels and time stamps are left out)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--max-rows", type=int, default=20, help="changed rows listed (default 20)")


def run(args: argparse.Namespace) -> int:
    """Check the data against the manifest and print the report; return the exit code."""
    from reprotune._data.checksplit import check_split
    from reprotune._data.leakage import default_leak_columns
    from reprotune._data.loaders import load_table
    from reprotune._errors import InputError

    if args.max_rows < 0:
        raise InputError(
            f"--max-rows must be 0 or more (got {args.max_rows})",
            source="--max-rows",
            fix="give how many changed rows to list, e.g. --max-rows 20 (--json lists all)",
        )
    manifest = _manifest(args)
    table = load_table(args.data, args.format)
    columns = None
    if args.leak_columns is not None:
        columns = [c.strip() for c in args.leak_columns.split(",") if c.strip()]
        if not columns:
            raise InputError(
                f"--leak-columns {args.leak_columns!r} names no column",
                source="--leak-columns",
                fix="name the columns to compare, e.g. --leak-columns prompt,response, or leave the "
                "option out for every text column",
            )
    if columns is None:
        columns = default_leak_columns(manifest, table)
        if not columns and args.fail_on_leak:  # asked to fail on leakage that cannot be looked for
            raise InputError(
                "--fail-on-leak: the data has no column of free text to compare for leakage",
                source=args.data,
                fix="name the columns whose text is the example, e.g. --leak-columns prompt,response",
            )
    report = check_split(manifest, table, leak_columns=columns)
    if args.json:
        print(report.to_json(), end="")
    else:
        print(report.format(max_rows=args.max_rows))
    if not report.identical:
        return 1
    return 1 if args.fail_on_leak and report.leaked else 0


def _manifest(args: argparse.Namespace) -> Manifest:
    """The manifest given; when it is none and DATA is one, the arguments were swapped: say so."""
    from reprotune._data.manifest import load_manifest
    from reprotune._errors import InputError
    from reprotune._formats import SPLIT_MANIFEST
    from reprotune._run.outputs import json_document

    try:
        return load_manifest(args.manifest)
    except InputError:
        if json_document(SPLIT_MANIFEST).holds(Path(args.data)):
            raise InputError(
                f"{args.data} is the split manifest and {args.manifest} is not: the arguments are the "
                "other way round (check-split MANIFEST DATA)",
                fix=f"reprotune check-split {args.data} {args.manifest}",
            ) from None
        raise

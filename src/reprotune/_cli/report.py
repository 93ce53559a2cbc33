"""``reprotune report RUN_DIR [RUN_DIR ...] -o report.html``: one self-contained HTML report.

Imports nothing heavy here, and never torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from reprotune._cli._options import path_value
from reprotune._run.outputs import refuse_overwrite, reprotune_page


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add report's arguments to its subparser."""
    parser.add_argument(
        "run_dirs",
        type=path_value,
        nargs="+",
        metavar="RUN_DIR",
        help="run directories; the first is the reference the others are compared with",
    )
    parser.add_argument(
        "-o",
        "--out",
        type=path_value,
        default=Path("report.html"),
        help="the HTML file to write (default: report.html); an existing file there is replaced only if "
        "reprotune wrote it (an earlier report)",
    )


def run(args: argparse.Namespace) -> int:
    """Write the report and print its path; return 0."""
    from reprotune._proof.report import write_report

    refuse_overwrite(args.out, reads=args.run_dirs, option="--out", own=reprotune_page())
    path = write_report(args.run_dirs, args.out)
    print(f"report written to {path}")
    return 0

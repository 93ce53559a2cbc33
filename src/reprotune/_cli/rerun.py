"""``reprotune rerun RUN_DIR``: reproduce a recorded run from its record alone and compare."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="the recorded run to reproduce")
    parser.add_argument(
        "--run-dir",
        dest="new_run_dir",
        type=Path,
        default=None,
        help="where the new run goes (default: <RUN_DIR>-rerun)",
    )
    parser.add_argument(
        "--allow-code-drift",
        action="store_true",
        help="rerun even when HEAD or the uncommitted diff differ from the record",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from reprotune._proof.rerun import rerun

    new_dir, comparison = rerun(
        args.run_dir,
        new_run_dir=args.new_run_dir,
        allow_code_drift=args.allow_code_drift,
        code_dir=Path.cwd(),
        progress=not args.no_progress,
    )
    print(f"rerun of {args.run_dir} -> {new_dir}")
    print(comparison.format())
    return 0 if comparison.verdict in ("IDENTICAL", "WITHIN_TOLERANCE") else 1

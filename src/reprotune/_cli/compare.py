"""``reprotune compare RUN_A RUN_B``: are two runs the same; if not, where and why.

Imports nothing heavy here: the comparison is imported when the command runs, and never torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add compare's arguments to its subparser."""
    parser.add_argument("run_a", type=Path, metavar="RUN_A", help="the reference run directory")
    parser.add_argument("run_b", type=Path, metavar="RUN_B", help="the run directory compared with it")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        metavar="X",
        help="accept numbers (losses, lr, grad norms, adapter weights) that differ by at most X "
        "when the data order is identical: verdict WITHIN_TOLERANCE, exit 0",
    )
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")


def run(args: argparse.Namespace) -> int:
    """Compare the two runs, print the result; return 0 (identical or within tolerance) or 1."""
    from reprotune._jsonio import canonical_dumps
    from reprotune._proof.compare import compare_runs

    comparison = compare_runs(args.run_a, args.run_b, tolerance=args.tolerance)
    if args.json:
        print(canonical_dumps(comparison.to_json()), end="")
    else:
        print(comparison.format(), end="")
    return comparison.exit_code

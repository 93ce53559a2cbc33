"""``reprotune compare RUN_A RUN_B``: are two runs (or two evals, or two traces of one step) the
same; if not, where and why.

Imports nothing heavy here: the comparison is imported when the command runs, and never torch.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprotune._cli._options import path_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add compare's arguments to its subparser."""
    parser.add_argument(
        "run_a",
        type=path_value,
        metavar="RUN_A",
        help="the reference run directory (or eval directory, or trace)",
    )
    parser.add_argument("run_b", type=path_value, metavar="RUN_B", help="the one compared with it")
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
    """Compare the two runs, print the result; return 0 (identical or within tolerance) or 1.

    Two eval directories (``reprotune eval``) are compared as evals; two runs that both hold
    evals get their evals compared too (docs/eval.md); two trace files (``reprotune trace``) are
    compared op by op (docs/microscope.md).
    """
    from reprotune._errors import InputError
    from reprotune._eval.compare import compare_evals, latest_pairs
    from reprotune._eval.evalfile import is_eval_dir
    from reprotune._jsonio import canonical_dumps
    from reprotune._proof.compare import compare_runs
    from reprotune._proof.trace_compare import compare_traces
    from reprotune._run.tracefile import is_trace_file, read_trace

    for path in (args.run_a, args.run_b):  # a trace's name, not there: no "no such directory"
        if not path.exists() and path.name.endswith((".jsonl", ".jsonl.gz")):
            raise InputError(
                f"no such trace file: {path}",
                fix="give the file `reprotune trace RUN_DIR --step K` wrote (compare takes two traces, "
                "two runs or two evals)",
            )
    if any(is_trace_file(p) or _trace_named(p) for p in (args.run_a, args.run_b)):
        return _compare_pair(  # a file named like a trace is read as one: its own error says what is wrong
            args,
            what="a trace (written by `reprotune trace`)",
            is_kind=lambda path: is_trace_file(path) or _trace_named(path),
            fix="compare two traces of the same step, one from each machine",
            how="traces are compared op by op, bit for bit",
            compare=lambda a, b: compare_traces(read_trace(a), read_trace(b)),
        )
    if is_eval_dir(args.run_a) or is_eval_dir(args.run_b):
        return _compare_pair(
            args,
            what="an eval directory (no eval.json)",
            is_kind=is_eval_dir,
            fix="compare two eval directories (RUN/evals/<id>), or two run directories",
            how="evals are compared token by token",
            compare=compare_evals,
        )
    comparison = compare_runs(args.run_a, args.run_b, tolerance=args.tolerance)

    def left_out(path: Path, exc: InputError) -> None:  # the runs' comparison stands without it
        print(f"warning: eval {path} is damaged, left out of the comparison: {exc.message}", file=sys.stderr)

    evals = [compare_evals(a, b) for a, b in latest_pairs(args.run_a, args.run_b, damaged=left_out)]
    if args.json:
        body = comparison.to_json()
        if evals:
            body["evals"] = [e.to_json() for e in evals]
        print(canonical_dumps(body), end="")
    else:
        print(comparison.format(), end="")
        for e in evals:
            print(f"\nevals of the two runs: {e.format()}", end="")
    return max([comparison.exit_code, *(e.exit_code for e in evals)])


def _trace_named(path: Path) -> bool:
    return path.is_file() and path.name.endswith((".jsonl", ".jsonl.gz"))


def _compare_pair(
    args: argparse.Namespace,
    *,
    what: str,
    is_kind: Callable[[Path], bool],
    fix: str,
    how: str,
    compare: Callable[[Path, Path], Any],
) -> int:
    """Two evals or two traces: both of that kind, without ``--tolerance`` (they compare bit for bit)."""
    from reprotune._errors import InputError
    from reprotune._jsonio import canonical_dumps

    for path in (args.run_a, args.run_b):
        if not path.exists():
            raise InputError(f"{path} does not exist", source=str(path), fix=fix)
        if not is_kind(path):
            raise InputError(f"{path} is not {what}, but the other one is", source=str(path), fix=fix)
    if args.tolerance is not None:
        raise InputError(
            f"--tolerance applies to runs; {how}", source="--tolerance", fix="leave out --tolerance"
        )
    comparison = compare(args.run_a, args.run_b)
    print(canonical_dumps(comparison.to_json()) if args.json else comparison.format(), end="")
    return int(comparison.exit_code)

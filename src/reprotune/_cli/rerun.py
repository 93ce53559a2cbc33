"""``reprotune rerun RUN_DIR|BUNDLE``: reproduce a recorded run from its record alone and compare;
then, as ``reprotune run`` does, make the end-of-run eval its config asks for
(``eval.generate_at_end``, docs/eval.md), which ``reprotune compare RUN RERUN`` pairs with the run's."""

from __future__ import annotations

import argparse
from pathlib import Path

from reprotune._cli._options import path_value, pin_cpu_isa_of_bundle, pin_cpu_isa_of_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        type=path_value,
        help="the recorded run to reproduce: a run directory, or a bundle (.tar.gz)",
    )
    parser.add_argument(
        "--run-dir",
        dest="new_run_dir",
        type=path_value,
        default=None,
        help="for a run directory: where the new run goes (default: <RUN_DIR>-rerun, or -rerun-2, ... "
        "when that exists); a bundle reruns into <out>/rerun",
    )
    parser.add_argument(
        "--out",
        type=path_value,
        default=None,
        help="for a bundle: a new or empty directory to unpack it (recorded/) and rerun it (rerun/) in "
        "(default: runs/<name>, or runs/<name>-rerun when that exists)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="the data file (or builtin:NAME) to rerun on (checked row by row against the run's manifest)",
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="compare within this absolute tolerance (WITHIN TOLERANCE) instead of bit for bit",
    )
    parser.add_argument(
        "--allow-code-drift",
        action="store_true",
        help="rerun even when HEAD or the uncommitted diff differ from the record",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    if args.run_dir.is_dir():
        pin_cpu_isa_of_run(args.run_dir)  # before torch loads
    elif args.run_dir.is_file():
        pin_cpu_isa_of_bundle(args.run_dir)
    from reprotune._proof.rerun import rerun, rerun_bundle

    _refuse_the_other_forms_option(args)
    if args.run_dir.is_file():
        out = args.out or _new_out(args.run_dir)
        done = rerun_bundle(
            args.run_dir,
            out=out,
            data=args.data,
            allow_code_drift=args.allow_code_drift,
            code_dir=Path.cwd(),
            progress=not args.no_progress,
            tolerance=args.tolerance,
        )
    else:
        done = rerun(
            args.run_dir,
            new_run_dir=args.new_run_dir,
            allow_code_drift=args.allow_code_drift,
            code_dir=Path.cwd(),
            progress=not args.no_progress,
            data=args.data,
            tolerance=args.tolerance,
        )
    if done.comparison is None:  # a torchrun rank other than 0: rank 0 compares and says it
        return 0
    print(f"rerun of {args.run_dir} -> {done.run_dir}")
    print(done.comparison.format())
    _eval_at_end(done.run_dir, progress=not args.no_progress)
    return 0 if done.comparison.verdict in ("IDENTICAL", "WITHIN_TOLERANCE") else 1


def _eval_at_end(run_dir: Path, *, progress: bool) -> None:
    """The eval ``eval.generate_at_end`` asks for, of the completed rerun (rank 0 alone: the other
    ranks returned before), as ``reprotune run`` makes it (``_cli.eval.eval_at_end``). The rerun
    call returns its directory, not the run's result: its record, read back, says whether it
    completed and asks for one (and a new run directory holds no eval yet)."""
    from reprotune._cli.eval import make_eval_at_end
    from reprotune._eval.at_end import missing_eval_at_end

    record = missing_eval_at_end(run_dir)
    if record is not None:
        make_eval_at_end(run_dir, record, progress=progress)


def _refuse_the_other_forms_option(args: argparse.Namespace) -> None:
    """``--out`` goes with a bundle, ``--run-dir`` with a run directory: the other is refused, not
    ignored (the rerun would land somewhere else than asked)."""
    from reprotune._errors import InputError

    if args.run_dir.is_file() and args.new_run_dir is not None:
        raise InputError(
            f"--run-dir {str(args.new_run_dir)!r} is for rerunning a run directory; {args.run_dir} is a "
            "bundle, which reruns into --out (recorded/ and rerun/ in it)",
            source="--run-dir",
            fix=f"use --out {args.new_run_dir} instead",
        )
    if args.run_dir.is_dir() and args.out is not None:
        raise InputError(
            f"--out {str(args.out)!r} is for rerunning a bundle; {args.run_dir} is a run directory, "
            "whose rerun goes to --run-dir",
            source="--out",
            fix=f"use --run-dir {args.out} instead",
        )


def _new_out(bundle: Path) -> Path:
    """``runs/<bundle name>``, or ``runs/<name>-rerun``, ``-rerun-2``, ... when that exists (as the
    run it was packed from does, packed beside its directory): never an existing directory."""
    name = bundle.name.removesuffix(".tar.gz").removesuffix(".tgz")
    candidate, suffix = Path("runs") / name, 1
    while candidate.exists():
        candidate = Path("runs") / (f"{name}-rerun" if suffix == 1 else f"{name}-rerun-{suffix}")
        suffix += 1
    return candidate

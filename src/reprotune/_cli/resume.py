"""``reprotune resume RUN_DIR``: continue an interrupted run from its latest valid checkpoint."""

from __future__ import annotations

import argparse
import sys

from reprotune._cli._options import add_watch_options, path_value, pin_cpu_isa_of_run, watch_hooks


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir",
        type=path_value,
        help="the run directory of an unfinished run (or of a completed one whose "
        "eval.generate_at_end eval did not finish)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--no-tracking", action="store_true", help="do not mirror the run to MLflow")
    parser.add_argument(
        "--allow-world-size-change",
        action="store_true",
        help="under torchrun, resume at another world size than the run trained at (recorded; the "
        "result is then not bitwise what an uninterrupted run gives)",
    )
    # verify's negative control only: a resume that forgets the RNG states must diverge.
    parser.add_argument("--skip-rng-restore", action="store_true", help=argparse.SUPPRESS)
    add_watch_options(parser)


def run(args: argparse.Namespace) -> int:
    pin_cpu_isa_of_run(args.run_dir)  # before torch loads
    from reprotune._cli.eval import make_eval_at_end
    from reprotune._eval.at_end import missing_eval_at_end
    from reprotune._proof.processes import launched_by_torchrun

    finished = None if launched_by_torchrun() else missing_eval_at_end(args.run_dir)
    if finished is not None:  # the run completed; what came after it (eval.generate_at_end) did not
        print(
            f"reprotune resume: the run in {args.run_dir} completed; making its end-of-run eval "
            "(eval.generate_at_end), which it lacks",
            file=sys.stderr,
        )
        make_eval_at_end(args.run_dir, finished, progress=not args.no_progress)
        return 0
    from reprotune._cli.run import print_summary
    from reprotune._train.options import RunOptions
    from reprotune._train.run import resume_run

    options = RunOptions(
        run_dir=args.run_dir,
        progress=not args.no_progress,
        tracking=not args.no_tracking,
        restore_rng_on_resume=not args.skip_rng_restore,
        hooks=watch_hooks(args),
        train_lock=args.train_lock,
        allow_world_size_change=args.allow_world_size_change,
    )
    result = resume_run(args.run_dir, options)
    print_summary(result)
    from reprotune._cli.eval import eval_at_end

    eval_at_end(result, progress=not args.no_progress)  # eval.generate_at_end (docs/eval.md)
    return 0

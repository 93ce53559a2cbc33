"""``reprotune significance STUDY_A STUDY_B``: do two configs differ beyond seed noise?

Exit 0 for a verdict either way (beyond or within seed noise), 2 for bad input. Never imports torch.
"""

from __future__ import annotations

import argparse
import json

from reprotune._cli._options import path_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "study_a", type=path_value, help="study A (a directory written by `reprotune seeds`), the reference"
    )
    parser.add_argument("study_b", type=path_value, help="study B")
    parser.add_argument(
        "--metric", default="final_val_loss", help="the metric to test (default: final_val_loss)"
    )
    parser.add_argument("--alpha", type=float, default=0.05, help="significance level (default: 0.05)")
    parser.add_argument(
        "--allow", action="store_true", help="compare studies whose runs started from different base models"
    )
    parser.add_argument("--seed", type=int, default=0, help="the permutation test's seed, when it resamples")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "-o",
        "--report",
        type=path_value,
        default=None,
        help="also write an HTML report here (an existing file there is replaced only if reprotune wrote it)",
    )


def run(args: argparse.Namespace) -> int:
    from reprotune._errors import InputError
    from reprotune._run.outputs import refuse_overwrite, reprotune_page
    from reprotune._studies.report import write_significance_report
    from reprotune._studies.significance import significance
    from reprotune._studies.studyfile import load_study

    if args.report is not None and args.report.is_dir():
        raise InputError(
            f"the report path {args.report} is a directory", source="--report", fix="pass a file name"
        )
    result = significance(
        args.study_a,
        args.study_b,
        metric=args.metric,
        alpha=args.alpha,
        allow_different_models=args.allow,
        seed=args.seed,
    )
    if args.report is not None:  # first: a report that cannot be written is the only output
        refuse_overwrite(
            args.report, reads=[args.study_a, args.study_b], option="--report", own=reprotune_page()
        )
        write_significance_report(result, load_study(args.study_a), load_study(args.study_b), args.report)
    if args.json:
        print(json.dumps(result.to_json(), indent=1, sort_keys=True))
    else:
        print(result.format(), end="")
        if args.report is not None:
            print(f"report: {args.report}")
    return 0

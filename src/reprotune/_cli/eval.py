"""``reprotune eval RUN_DIR``: generate for each row of the run's test split, score, and write an
eval directory that another process reproduces byte for byte (docs/eval.md)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reprotune._cli._options import add_set_option, path_value, pin_cpu_isa_of_run
from reprotune._errors import InputError, Interrupted

if TYPE_CHECKING:
    from reprotune._run.record import RunRecord
    from reprotune._train.options import RunResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=path_value, metavar="RUN_DIR", help="a completed run directory")
    parser.add_argument(
        "--split", choices=("test", "validation"), default="test", help="the split of the run's own manifest"
    )
    parser.add_argument(
        "--max-rows",
        type=int,
        default=None,
        metavar="N",
        help="evaluate N rows of the split, drawn with the eval seed (seed.overrides.eval) and kept in "
        "manifest order: the same N and seed give the same rows (default eval.generate_max_rows: all)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="rows per generation batch (default eval.generate_batch_size); where the eval's "
        "batch-invariance check passed (batch_invariant in eval.json) the predictions do not depend on it",
    )
    add_set_option(parser, example="eval.decoding=sample (eval.*, seed.root and seed.overrides.eval only)")
    parser.add_argument(
        "--out",
        type=path_value,
        default=None,
        help="the eval directory to create (default RUN_DIR/evals/<eval-id>)",
    )
    parser.add_argument(
        "--base-only", action="store_true", help="evaluate the base model without the adapter"
    )
    parser.add_argument(
        "--allow-tokenizer-change",
        action="store_true",
        help="evaluate even when the tokenizer files differ from the run's (recorded in eval.json)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress lines on stderr")


def run(args: argparse.Namespace) -> int:
    pin_cpu_isa_of_run(args.run_dir)  # before torch loads
    from reprotune._eval.evaluate import run_eval

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    result = run_eval(
        args.run_dir,
        split=args.split,
        max_rows=args.max_rows,
        batch_size=args.batch_size,
        overrides=args.overrides,
        out=args.out,
        base_only=args.base_only,
        allow_tokenizer_change=args.allow_tokenizer_change,
        report=None if args.no_progress else progress,
    )
    print(summary(result.eval_dir, result.record), end="")
    return 0


def eval_at_end(result: RunResult, *, progress: bool) -> None:
    """After ``reprotune run`` / ``resume``: the eval ``eval.generate_at_end`` asks for, if the run
    completed (rank 0 alone in a distributed run), and its summary."""
    from reprotune._eval.settings import wants_eval_at_end

    record = result.typed  # None on a distributed run's ranks other than 0
    if record is None or result.status != "completed" or not wants_eval_at_end(record):
        return
    make_eval_at_end(result.run_dir, record, progress=progress)


def make_eval_at_end(run_dir: Path, record: RunRecord, *, progress: bool) -> None:
    """Evaluate a completed run as ``eval.generate_at_end`` asks, and print its summary. Stopped
    or failed, it says that the run completed and that ``reprotune resume`` makes the eval."""
    from reprotune._eval.at_end import evaluate_at_end

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    then = f"the run completed; its end-of-run eval did not: make it with `reprotune resume {run_dir}`"
    try:
        done = evaluate_at_end(run_dir, record, report=say, progress=say if progress else None)
    except KeyboardInterrupt as exc:
        raise Interrupted(getattr(exc, "signum", signal.SIGINT), then=then) from None
    except InputError:
        raise  # it says the run completed, and its fix ends with the resume
    except Exception:
        say(f"reprotune: {then}")
        raise
    print(summary(done.eval_dir, done.record), end="")


def summary(eval_dir: Path, record: dict[str, Any]) -> str:
    """The closing lines of an eval: where it is, what was evaluated, the scores."""
    split, generation = record["split"], record["generation"]
    adapter_sha256 = (record.get("adapter") or {}).get("sha256")
    what = (
        "base model alone"
        if record.get("base_only")
        else f"adapter {adapter_sha256[:12]}..."
        if isinstance(adapter_sha256, str)
        else "adapter of no recorded sha256"
    )
    lines = [
        f"eval {record['eval_id']}: {split['n_rows']} {split['name']} rows of run "
        f"{record['run']['run_id']} ({what})",
        f"  eval directory      {eval_dir}",
        f"  decoding            {generation['decoding']}, max {generation['max_new_tokens']} new tokens, "
        f"batch size {generation['batch_size']}"
        + (
            " (predictions do not depend on it)"
            if generation["batch_invariant"]
            else " (part of the identity)"
        ),
        f"  predictions sha256  {record['predictions']['sha256']}",
    ]
    if record["tokenizer"].get("allowed"):
        lines.append("  WARNING             the tokenizer differs from the run's (--allow-tokenizer-change)")
    cut = (generation.get("prompt_truncation") or {}).get("truncated_rows")
    if cut:  # said here too: with --no-progress the progress line's warning is not printed
        lines.append(
            f"  WARNING             {cut} of {split['n_rows']} prompts were cut from their start to fit "
            "model.max_length (generation.prompt_truncation)"
        )
    metrics = record["metrics"]
    lines.append("  metrics             " + ", ".join(f"{k} {metrics[k]:.4f}" for k in sorted(metrics)))
    rate = record.get("timings", {}).get("tokens_per_s")
    if rate:
        lines.append(f"  throughput          {rate:.1f} generated tokens/s")
    return "\n".join(lines) + "\n"

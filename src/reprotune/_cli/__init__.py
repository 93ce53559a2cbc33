"""The command line. ``main(argv)`` is the one place exceptions become messages and exit codes.

Each subcommand lives in its own module here with two functions, ``add_arguments(parser)`` and
``run(args) -> int``. Those modules import nothing heavy at import time: commands that need no
model (split, check-split, compare, report) must never import torch.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import sys
import traceback
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from reprotune._cli._options import locate_config_source
from reprotune._errors import Interrupted, ReprotuneError
from reprotune._version import __version__

# name -> (module, one-line help). Order is the order shown in --help.
COMMANDS: dict[str, tuple[str, str]] = {
    "split": ("reprotune._cli.split", "make a frozen, seeded train/validation/test split manifest"),
    "check-split": ("reprotune._cli.check_split", "check data against a split manifest; find leakage"),
    "run": ("reprotune._cli.run", "run a reproducible LoRA fine-tune from a config"),
    "resume": ("reprotune._cli.resume", "resume an interrupted run from its latest valid checkpoint"),
    "eval": (
        "reprotune._cli.eval",
        "generate and score a run's test split, reproducibly, batch-size-invariant",
    ),
    "verify": ("reprotune._cli.verify", "prove a config reproduces: rerun, resume and negative controls"),
    "compare": ("reprotune._cli.compare", "compare two runs step by step; say where and why they differ"),
    "trace": (
        "reprotune._cli.trace",
        "fingerprint every op of one replayed step, to find why another machine's run differs",
    ),
    "rerun": ("reprotune._cli.rerun", "reproduce a recorded run (a run directory or a bundle) and compare"),
    "pack": ("reprotune._cli.pack", "pack a run into a bundle that another machine reruns"),
    "doctor": ("reprotune._cli.doctor", "audit this setup for what can break reproducibility"),
    "report": ("reprotune._cli.report", "write an HTML report of runs: curves, divergence, differences"),
    "seeds": ("reprotune._cli.seeds", "run a seed study: N runs that differ only in their seeds"),
    "significance": ("reprotune._cli.significance", "do two seed studies differ beyond seed noise?"),
}


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="reprotune",
        description="Reproducible LLM fine-tuning, proven: seeds, splits, records, step-by-step comparison.",
    )
    parser.add_argument("--version", action="version", version=f"reprotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = importlib.import_module(module)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        command.add_arguments(sub_parser)
        sub_parser.set_defaults(_module=module)
    return parser


class _MaskedStream:
    """A text stream that masks credentials in everything written through it
    (``_config.secrets.mask_secrets``): the one gate every message of the CLI passes, whoever
    prints it (errors, warnings, a tracker's failure, a progress bar)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        from reprotune._config.secrets import mask_secrets

        self._stream.write(mask_secrets(text))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _masked_output() -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None:  # None where the stream is closed (pythonw, fd 1 closed)
        sys.stdout = _MaskedStream(sys.stdout)
    if sys.stderr is not None:
        sys.stderr = _MaskedStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def main(argv: Sequence[str] | None = None) -> int:
    """Run the reprotune CLI on ``argv``; return the exit code (0 ok, 1 finding, 2 bad input).
    Everything it prints passes :class:`_MaskedStream`."""
    with _masked_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code) if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    command = importlib.import_module(args._module)
    try:
        return int(command.run(args))
    except ReprotuneError as exc:
        locate_config_source(exc, args)
        print(f"reprotune {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        # Ctrl-C, or SIGTERM/SIGHUP during a run (reprotune._errors.Interrupted): 128 + the signal.
        signum = getattr(exc, "signum", 2)
        how = f" by {exc.signal_name}" if isinstance(exc, Interrupted) else ""
        then = getattr(exc, "then", None)
        resumable = f" (resumable: {_resume_hint(args)})" if args.command in ("run", "resume") else ""
        print(
            f"reprotune {args.command}: interrupted{how}{f': {then}' if then else resumable}", file=sys.stderr
        )
        return 128 + int(signum)
    except BrokenPipeError:
        # The reader of stdout went away (`| head`, `| true`): nothing is wrong with the work, and
        # nothing more can be said; exit as a shell does on SIGPIPE, with no traceback.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())  # type: ignore[union-attr]
        return 141  # 128 + SIGPIPE
    except OSError as exc:
        fix = _FILESYSTEM_REFUSALS.get(exc.errno or 0)
        if fix is None:
            return _internal_error(args.command, exc)
        where = f"{exc.filename}: " if exc.filename is not None else ""  # found only when used
        print(f"reprotune {args.command}: error: {where}{exc.strerror or exc}\nfix: {fix}", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug, not bad input: show everything
        return _internal_error(args.command, exc)


#: The errors of a path the filesystem refuses, found only when a file is read or written (the
#: commands check their paths first): bad input, exit 2, each with what to do; any other OSError
#: is an internal error.
_FILESYSTEM_REFUSALS: dict[int, str] = {
    errno.EACCES: "check the path's permissions, or give a path you can read and write",
    errno.EPERM: "check the path's permissions, or give a path you can read and write",
    errno.EROFS: "the file system is read-only: give a path on a writable one",
    errno.ENOSPC: "the disk is full: free space, or give a path on another file system",
    errno.EDQUOT: "the disk quota is used up: free space, or give a path on another file system",
    errno.ENOTDIR: "a part of the path is a file where a directory belongs: check the path",
    errno.EISDIR: "the path is a directory where a file belongs: check the path",
}


def _internal_error(command: str, exc: BaseException) -> int:
    traceback.print_exception(exc)
    print(f"reprotune {command}: internal error (please report it)", file=sys.stderr)
    return 1


def _resume_hint(args: argparse.Namespace) -> str:
    """How to resume the run this command was making, as its launch was (torchrun or not)."""
    from reprotune._run.ranks import resume_command

    launched = os.environ.get("TORCHELASTIC_RUN_ID") is not None
    world, nodes = (
        os.environ.get(name, "") if launched else "" for name in ("WORLD_SIZE", "GROUP_WORLD_SIZE")
    )
    return resume_command(
        str(getattr(args, "run_dir", None) or "RUN_DIR"),
        int(world) if world.isdigit() else None,
        int(nodes) if nodes.isdigit() else None,
    )


def entry_point() -> None:
    """Console-script entry: ``sys.exit(main())``."""
    sys.exit(main())

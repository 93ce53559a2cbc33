"""Options shared by the commands that take an experiment config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from reprotune._config.locate import is_key_path, value_source
from reprotune._errors import ReprotuneError

#: The data formats and rare-class policies the split commands take, spelled here so that parsing
#: the command line imports no NumPy (tests/cli check them against ``_data``'s own).
DATA_FORMATS = ("auto", "jsonl", "csv", "parquet")
RARE_CLASS_POLICIES = ("train", "drop", "error")


def path_value(text: str) -> Path:
    """An argparse ``type`` for a path: an empty one (``--out ""``, which ``Path`` would read as
    the current directory) is refused by name, exit 2."""
    return Path(path_text(text))


def path_text(text: str) -> str:
    """:func:`path_value` for an argument kept as text (a data path or ``builtin:NAME``)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path: give a file or directory")
    return text


def add_format_option(parser: argparse.ArgumentParser) -> None:
    """``--format``: how to read the data file (by its extension unless given)."""
    parser.add_argument(
        "--format",
        default="auto",
        choices=DATA_FORMATS,
        help="auto (from the extension; default), jsonl, csv or parquet",
    )


def add_set_option(parser: argparse.ArgumentParser, *, example: str = "train.max_steps=10") -> None:
    """``--set key.path=value`` (repeatable), collected in ``args.overrides``; ``example`` is one
    the command takes."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help=f"override a config value, e.g. --set {example} (repeatable)",
    )


def locate_config_source(exc: ReprotuneError, args: argparse.Namespace) -> None:
    """Point an error about a config key (``source`` = ``split.stratify_by``) at where its value
    came from: the ``--set`` that gave it, or the config file's line and column."""
    key = exc.source
    if not is_key_path(key):
        return
    assert key is not None
    config = getattr(args, "config", None)  # a Path, or doctor's text
    where = value_source(
        key, getattr(args, "overrides", None) or [], config if isinstance(config, str | Path) else None
    )
    if where is not None:
        exc.source = where


def add_watch_options(parser: argparse.ArgumentParser) -> None:
    """verify's negative controls: stream the run against a reference run and stop once it parts."""
    parser.add_argument("--watch-reference", type=path_value, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--watch-bound", type=int, default=None, help=argparse.SUPPRESS)
    # Controls started side by side train in turns (reprotune._train.turn).
    parser.add_argument("--train-lock", type=path_value, default=None, help=argparse.SUPPRESS)


def watch_hooks(args: argparse.Namespace) -> tuple[Any, ...]:
    """The ``DivergenceWatch`` step hook ``--watch-reference`` asks for, or none."""
    if args.watch_reference is None:
        return ()
    from reprotune._run.layout import RunLayout
    from reprotune._train.watch import DivergenceWatch

    bound = args.watch_bound if args.watch_bound is not None else 1
    return (DivergenceWatch(RunLayout(args.watch_reference).ledger, bound=bound),)


def pin_cpu_isa(cpu_isa: str) -> None:
    """Put ``determinism.cpu_isa``'s variables in the environment before torch loads (the
    libraries read them once, at start); the run then checks they are in force
    (``_determinism.isa``)."""
    from reprotune._determinism.isa import set_isa_environment

    set_isa_environment(cpu_isa)


def recorded_cpu_isa(run_dir: Path) -> str | None:
    """The ``determinism.cpu_isa`` mode a run directory's record says was in force
    (:func:`_mode_in_record`), read without torch; None for a directory that is not a run."""
    return _mode_in_record(_record_of(run_dir))


def _record_of(run_dir: Path) -> Any:
    """A run directory's record as JSON, or None."""
    import json

    from reprotune._run.layout import RunLayout

    try:
        return json.loads(RunLayout(run_dir).record.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def _mode_in_record(record: Any) -> str | None:
    """The mode a record says was in force: its kernel facts' ``portable.cpu_isa`` (read back when
    the run started; a Trainer script's run was put in a mode by its variables, with no config
    key), else its config's ``determinism.cpu_isa`` (``native`` where a record from before the mode
    lacks it); None for a Trainer-made run recorded before the kernel facts, or no record."""
    try:
        kernels = (record.get("environment") or {}).get("kernels") or {}
        in_force = (kernels.get("portable") or {}).get("cpu_isa")
        if not isinstance(in_force, str):  # a damaged record's: the config's mode is the run's too
            in_force = None
        cpu_isa = in_force or record["config"]["determinism"].get("cpu_isa", "native")
    except (KeyError, TypeError, AttributeError):
        return None
    return cpu_isa if isinstance(cpu_isa, str) else None


def pin_cpu_isa_of_run(run_dir: Path, *, trainer_runs: bool = True) -> None:
    """:func:`pin_cpu_isa` for the mode a run directory's record says was in force; one that is not a run
    is left for the command to refuse, and without ``trainer_runs`` a Trainer script's run too
    (a command that cannot replay one says so, rather than whether this CPU holds its mode)."""
    record = _record_of(run_dir)
    if not trainer_runs and isinstance(record, dict) and "trainer" in (record.get("config") or {}):
        return
    cpu_isa = _mode_in_record(record)
    if cpu_isa is not None:
        _pin_recorded(cpu_isa, f"the run in {run_dir}")


def pin_cpu_isa_of_bundle(bundle: Path) -> None:
    """:func:`pin_cpu_isa` for the mode a bundle's record says was in force (its ``run/record.json``, read
    from the archive with the checks ``rerun`` makes, stopping there; a record over 16 MB or any
    bundle that does not pass is left for ``rerun`` to refuse)."""
    import json

    from reprotune._errors import InputError
    from reprotune._proof.bundle import run_member
    from reprotune._proof.unpack import read_member
    from reprotune._run.layout import RECORD

    try:
        raw = read_member(bundle, run_member(RECORD))
        cpu_isa = _mode_in_record(json.loads(raw) if raw is not None else {})
    except (InputError, OSError, ValueError, RecursionError):
        return
    if isinstance(cpu_isa, str):
        _pin_recorded(cpu_isa, f"the run in {bundle}")


def _pin_recorded(cpu_isa: str, what: str) -> None:
    """:func:`pin_cpu_isa` for a recorded run: its mode is not the user's to change here, so a
    refusal says how to replay it in that mode (the config's fix, "use native", does not apply)."""
    from reprotune._errors import InputError

    try:
        pin_cpu_isa(cpu_isa)
    except InputError as exc:
        raise InputError(
            f"{what} was made in determinism.cpu_isa {cpu_isa!r} (its record says), which this command "
            f"replays it in: "
            f"{exc.message}",
            source=f"{what} (determinism.cpu_isa)",
            fix="unset the variables named (the mode sets them itself), or replay it on a CPU that can "
            "hold the mode (its instructions; avx2 and avx512 need an Intel CPU, avx2-amd an AMD one)",
        ) from None

"""``reprotune rerun RUN_DIR``: reproduce a recorded run from its record alone, then compare.

Before anything runs: the launch is the run's (under torchrun at its world size, or not), the
run's manifest is the one its record hashed and the data is checked against it, the code (HEAD
and the sha256 of the uncommitted diff) against the record, and the environment is diffed. The
new run uses the recorded resolved config, the recorded manifest (byte for byte) and so the same
seeds. Under torchrun every rank trains; rank 0 alone writes and compares.
"""

from __future__ import annotations

import functools
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._config.schema import ExperimentConfig
from reprotune._config.secrets import mask_data
from reprotune._data.checksplit import check_split
from reprotune._data.loaders import load_table
from reprotune._data.manifest import load_manifest
from reprotune._determinism.device import resolve_device
from reprotune._determinism.flags import apply_determinism
from reprotune._errors import InputError, RunFailedError
from reprotune._formats import BUNDLE_RERUN
from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._proof.bundle import builtin_data, check_split_file, run_member
from reprotune._proof.compare import check_tolerance, compare_runs
from reprotune._proof.differences import Comparison
from reprotune._proof.rerun_launch import refuse_another_launch
from reprotune._proof.unpack import Unpacked, named_in_the_bundle, unpack
from reprotune._run.claim import unused_path
from reprotune._run.drift import (
    RUN_THE_SCRIPT_AGAIN,
    code_drift,
    refuse_code_drift,
    refuse_trainer_run,
    section_drift,
)
from reprotune._run.fingerprint import code_fingerprint, environment_fingerprint
from reprotune._run.layout import RECORD, RunLayout
from reprotune._run.outputs import first_missing, refuse_nonempty_dir, refuse_overwrite
from reprotune._run.record import read_record, record_config, status_of
from reprotune._run.rundir import open_run_dir
from reprotune._train.distributed import launch_variables
from reprotune._train.options import RunOptions
from reprotune._train.run import run_experiment
from reprotune._train.strategy import under_torchrun


@dataclass(frozen=True)
class Rerun:
    """A rerun: the new run's directory, its comparison with the recorded run (None on a torchrun
    rank other than 0, which compares nothing), and the code differences ``--allow-code-drift``
    let through (``code.KEY: recorded X, now Y``; empty when the code was the run's)."""

    run_dir: Path
    comparison: Comparison | None
    code_drift: tuple[str, ...] = ()


@dataclass(frozen=True)
class Preflight:
    """What differs between the recorded run and this machine, found before running."""

    code_now: dict[str, Any]
    code_drift: list[str]
    environment_drift: list[str]


def preflight(run_dir: Path, record: dict[str, Any], cfg: ExperimentConfig, *, code_dir: Path) -> Preflight:
    """Check data, code and environment against the record of the run in ``run_dir``.

    Raises:
        InputError: the run's split manifest is missing or not the one its record hashed.
        RunFailedError: the data no longer matches the run's manifest.
    """
    data_path = cfg.resolve_paths().data.path
    manifest_path = RunLayout(run_dir).manifest
    recorded_split = (record.get("data") or {}).get("manifest_sha256")
    check_split_file(manifest_path, recorded_split, record=RunLayout(run_dir).record)
    table = load_table(data_path, cfg.data.format, format_fix=None)
    check = check_split(load_manifest(manifest_path), table)
    if not check.identical:
        raise RunFailedError(
            "the data is not the data the run was made from:\n"
            + check.format(all_rows="the command below lists all"),
            source=f"{data_path} vs {manifest_path}",
            fix="restore the original data file (its sha256 is in record.json under data.file_sha256); "
            f"`reprotune check-split {manifest_path} {data_path}` lists every changed row",
        )
    now = code_fingerprint(code_dir).to_record(patch_file=None)
    # What the run sets from its config (determinism flags, thread counts) is set first, as the
    # run will: the environment is then read as it will be in force, not as this process started.
    det = cfg.determinism
    apply_determinism(det.mode, det.threads, resolve_device(det.device).type, cpu_isa=det.cpu_isa)
    recorded = record.get("environment", {})
    # Read as a record writes it (masked), so that only real differences are listed.
    environment = section_drift(recorded, mask_data(environment_fingerprint()), prefix="environment")
    return Preflight(
        now,
        code_drift(record.get("code", {}), now),
        [line for line in environment if not line.startswith(_KNOWN_ONCE_LOADED)],
    )


#: The attention implementation is known once the model is loaded: the comparison after the run
#: compares it (as every environment fact), the list before it cannot.
_KNOWN_ONCE_LOADED = "environment.kernels.attention."


def checked_before_rerun(
    run_dir: Path,
    record: dict[str, Any],
    *,
    data: Path | str | None,
    code_dir: Path,
    allow_code_drift: bool,
    what: str,
    report: Callable[[str], None],
) -> tuple[ExperimentConfig, Preflight]:
    """The recorded config (on ``data`` when given), after :func:`preflight` (and what it found):
    code that differs is refused unless ``allow_code_drift`` (then said), environment differences
    are said.

    Raises:
        InputError: the code differs, without ``allow_code_drift``; the run's split manifest is
            missing or not the one its record hashed.
        RunFailedError: the data is not the run's.
    """
    cfg = record_config(record, run_dir=run_dir, source=str(RunLayout(run_dir).record))
    if data is not None:
        source = str(data) if str(data).startswith("builtin:") else str(Path(data).resolve())
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": source})})
    checks = preflight(run_dir, record, cfg, code_dir=code_dir)
    if not allow_code_drift:
        refuse_code_drift(
            record.get("code", {}), checks.code_now, run_dir, what=what, override="--allow-code-drift"
        )
    for line in checks.code_drift:
        report(f"warning: {line} (allowed by --allow-code-drift)")
    for line in checks.environment_drift:
        report(f"environment differs: {line}")
    return cfg, checks


#: The record's member in a bundle, as a refusal names it.
RECORD_MEMBER = run_member(RECORD)


def _is_rank_zero() -> bool:
    """Whether this process writes and compares: always outside torchrun, rank 0 under it."""
    return not under_torchrun() or launch_variables("rerun")[0] == 0


def rerun(
    run_dir: Path,
    *,
    new_run_dir: Path | None,
    allow_code_drift: bool,
    code_dir: Path,
    progress: bool = True,
    report: Callable[[str], None] = print,
    data: Path | str | None = None,
    tolerance: float | None = None,
    tracking: bool = True,
    bundle: Path | None = None,
) -> Rerun:
    """Reproduce the run in ``run_dir``; return the new run's directory, the comparison and the
    code differences allowed.

    Args:
        data: the data file (or ``builtin:...`` name) to use instead of the recorded one (checked
            row by row against the run's manifest first).
        tolerance: compare with this absolute tolerance (WITHIN TOLERANCE), else bit for bit.
        tracking: mirror the rerun to the trackers the run's config names (off for a bundle's:
            they name the machine that made it, never to be sent this machine's credentials).
        bundle: the bundle ``run_dir`` was unpacked from (beside ``new_run_dir``), which a
            refusal names.

    Raises:
        InputError: not a run directory, a launch other than the run's (torchrun or not, the
            world size), a split manifest that is not the run's, or code drift without
            ``allow_code_drift``.
        RunFailedError: the data changed.
    """
    paths = RunLayout(run_dir)
    # Everything the comparison will read is checked now, not after a whole training.
    check_tolerance(tolerance)
    record = dict(open_run_dir(run_dir).record)
    if status_of(record) != "completed":
        raise InputError(
            f"the run in {run_dir} did not complete (status {record.get('status')!r})",
            source=str(paths.record),
            fix=f"resume it with `reprotune resume {run_dir}` first",
        )
    refuse_trainer_run(
        record,
        run_dir,
        why="it has no reprotune config to rerun",
        fix=RUN_THE_SCRIPT_AGAIN,
    )
    args, source = str(run_dir), str(paths.record)
    if bundle is not None and new_run_dir is not None:
        args, source = f"{bundle} --out {new_run_dir.parent}", f"{bundle}: {RECORD_MEMBER}"
    refuse_another_launch(record, rerun_args=args, source=source, tolerance=tolerance)
    main = _is_rank_zero()  # under torchrun the other ranks train alongside, and say nothing
    cfg, checks = checked_before_rerun(
        run_dir,
        record,
        data=data,
        code_dir=code_dir,
        allow_code_drift=allow_code_drift,
        what="rerunning",
        report=report if main else _quiet,
    )
    target = new_run_dir or unused_path(run_dir.parent, f"{run_dir.name}-rerun")
    options = RunOptions(
        run_dir=target,
        progress=progress and main,
        tracking=tracking,
        manifest=paths.manifest,
        code_dir=code_dir,
    )
    result = run_experiment(cfg, options)
    if not result.main:
        return Rerun(result.run_dir, None)
    comparison = compare_runs(run_dir, result.run_dir, tolerance=tolerance)
    return Rerun(result.run_dir, comparison, tuple(checks.code_drift))


def _quiet(_: str) -> None:
    """A report that says nothing (a torchrun rank other than 0)."""


def rerun_bundle(
    bundle: Path,
    *,
    out: Path,
    data: Path | str | None,
    allow_code_drift: bool,
    code_dir: Path,
    progress: bool = True,
    report: Callable[[str], None] = print,
    tolerance: float | None = None,
) -> Rerun:
    """Check and unpack ``bundle`` into ``out/recorded``, rerun it into ``out/rerun``, compare.

    Every environment difference is reported before training; the result is written to
    ``out/rerun.json`` (verdict, tolerance, largest difference, causes, code drift allowed,
    machine, cost). Under torchrun rank 0 does all that; every other rank unpacks the bundle into
    a temporary directory of its own, trains alongside and writes nothing.

    ``out`` must be new or empty, and neither a run directory nor inside one; a refusal removes only
    what this call created (``out`` itself when it made it, else what it put in it).

    Raises:
        InputError: a damaged or hostile bundle (nothing written), a launch other than the run's,
            no data to rerun on (pass ``data``), or an ``out`` that is a run directory, in one, or
            not empty.
        RunFailedError: data that is not the run's (its rows named).
    """
    check_tolerance(tolerance)
    # tracking off: the bundle's trackers are the packing machine's, not this one's
    again = functools.partial(
        rerun,
        new_run_dir=out / "rerun",
        allow_code_drift=allow_code_drift,
        code_dir=code_dir,
        tolerance=tolerance,
        tracking=False,
        bundle=bundle,
    )
    if not _is_rank_zero():  # rank 0 writes out/; this rank reruns from a copy of its own
        with tempfile.TemporaryDirectory(prefix="reprotune-rerun-") as own:
            unpacked = unpack(bundle, Path(own) / "recorded")
            return again(
                unpacked.run_dir, data=_data_of(unpacked, data, bundle), progress=False, report=_quiet
            )
    files_read = [Path(data)] if data is not None and not str(data).startswith("builtin:") else []
    refuse_overwrite(out, reads=[bundle, *files_read], option="--out")
    refuse_nonempty_dir(out, option="--out")
    created = first_missing(out)
    bundle_sha256 = sha256_file(bundle)  # the bundle as unpacked, not as it may be after training
    try:
        unpacked = unpack(bundle, out / "recorded")
        use = _data_of(unpacked, data, bundle)
        started = time.perf_counter()
        done = again(unpacked.run_dir, data=use, progress=progress, report=report)
    except BaseException as exc:
        if not (out / "rerun").exists():  # stopped before training: remove what this call made, only
            shutil.rmtree(created if created is not None else out / "recorded", ignore_errors=True)
            if type(exc) is InputError:  # what it names was unpacked there, and is gone: name the member
                raise named_in_the_bundle(exc, out / "recorded" / "run", bundle) from None
        raise
    summary = _rerun_summary(bundle, bundle_sha256, done, allow_code_drift, time.perf_counter() - started)
    write_json_atomic(out / "rerun.json", summary)
    return done


def _data_of(unpacked: Unpacked, data: Path | str | None, bundle: Path) -> Path | str:
    """The data a bundle reruns on: ``data`` when given, else its own data file, else the builtin
    data its run was made from.

    Raises:
        InputError: none of them (the bundle was packed without its data file).
    """
    use = data if data is not None else unpacked.data
    if use is None:  # builtin data ships with reprotune: checked against the manifest like any
        use = builtin_data(read_record(unpacked.run_dir), unpacked.run_dir)
    if use is None:
        raise InputError(
            "the bundle was packed without its data, and no --data was given",
            source=str(bundle),
            fix=f"pass --data PATH: the file with sha256 {unpacked.manifest.get('data_sha256')} "
            "(checked row by row against the run's split manifest)",
        )
    return use


def _rerun_summary(
    bundle: Path, sha256: str, done: Rerun, allow_code_drift: bool, seconds: float
) -> dict[str, Any]:
    """What a bundle rerun proved, on which machine, at what cost (read by the HTML report); and,
    when the code here was not the run's, that ``--allow-code-drift`` let it rerun, and how it
    differed (``code_drift``: ``code.KEY: recorded X, now Y``)."""
    comparison = done.comparison
    assert comparison is not None  # rank 0's rerun, which compares
    largest = comparison.where.largest_loss_diff
    return BUNDLE_RERUN.stamp(
        {
            "bundle": str(bundle),
            "bundle_sha256": sha256,
            "verdict": str(comparison.verdict),
            "tolerance": comparison.tolerance,
            "largest_loss_difference": None if largest is None else largest.abs_diff,
            "causes": list(comparison.causes),
            "environment_differences": [d.key for d in comparison.differences if d.category == "environment"],
            "code_drift_allowed": allow_code_drift,
            "code_drift": list(done.code_drift),
            "machine": environment_fingerprint().get("platform") or platform.platform(),
            "host": platform.node(),
            "seconds": round(seconds, 3),
        }
    )

"""``reprotune rerun RUN_DIR``: reproduce a recorded run from its record alone, then compare.

Before anything runs: the data is checked against the run's own manifest, the code (HEAD and the
sha256 of the uncommitted diff) against the record, and the environment is diffed. The new run
uses the recorded resolved config, the recorded manifest (byte for byte) and so the same seeds.
"""

from __future__ import annotations

import platform
import shutil
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
from reprotune._proof.bundle import builtin_data
from reprotune._proof.compare import check_tolerance, compare_runs
from reprotune._proof.differences import Comparison
from reprotune._proof.unpack import unpack
from reprotune._run.claim import unused_path
from reprotune._run.drift import (
    RUN_THE_SCRIPT_AGAIN,
    code_drift,
    refuse_code_drift,
    refuse_trainer_run,
    section_drift,
)
from reprotune._run.fingerprint import code_fingerprint, environment_fingerprint
from reprotune._run.layout import RunLayout
from reprotune._run.outputs import first_missing, refuse_nonempty_dir, refuse_overwrite
from reprotune._run.record import read_record, record_config, status_of
from reprotune._run.rundir import open_run_dir
from reprotune._train.options import RunOptions
from reprotune._train.run import run_experiment


@dataclass(frozen=True)
class Preflight:
    """What differs between the recorded run and this machine, found before running."""

    code_now: dict[str, Any]
    code_drift: list[str]
    environment_drift: list[str]


def preflight(run_dir: Path, record: dict[str, Any], cfg: ExperimentConfig, *, code_dir: Path) -> Preflight:
    """Check data, code and environment against the record of the run in ``run_dir``.

    Raises:
        RunFailedError: the data no longer matches the run's manifest.
    """
    data_path = cfg.resolve_paths().data.path
    manifest_path = RunLayout(run_dir).manifest
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
) -> ExperimentConfig:
    """The recorded config (on ``data`` when given), after :func:`preflight`: code that differs
    is refused unless ``allow_code_drift`` (then said), environment differences are said.

    Raises:
        InputError: the code differs, without ``allow_code_drift``.
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
    return cfg


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
) -> tuple[Path, Comparison]:
    """Reproduce the run in ``run_dir``; return the new run's directory and the comparison.

    Args:
        data: the data file (or ``builtin:...`` name) to use instead of the recorded one (checked
            row by row against the run's manifest first).
        tolerance: compare with this absolute tolerance (WITHIN TOLERANCE), else bit for bit.
        tracking: mirror the rerun to the trackers the run's config names (off for a bundle's:
            they name the machine that made it, never to be sent this machine's credentials).

    Raises:
        InputError: not a run directory, or code drift without ``allow_code_drift``.
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
    cfg = checked_before_rerun(
        run_dir,
        record,
        data=data,
        code_dir=code_dir,
        allow_code_drift=allow_code_drift,
        what="rerunning",
        report=report,
    )
    target = new_run_dir or unused_path(run_dir.parent, f"{run_dir.name}-rerun")
    options = RunOptions(
        run_dir=target, progress=progress, tracking=tracking, manifest=paths.manifest, code_dir=code_dir
    )
    result = run_experiment(cfg, options)
    return result.run_dir, compare_runs(run_dir, result.run_dir, tolerance=tolerance)


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
) -> tuple[Path, Comparison]:
    """Check and unpack ``bundle`` into ``out/recorded``, rerun it into ``out/rerun``, compare.

    Every environment difference is reported before training; the result is written to
    ``out/rerun.json`` (verdict, tolerance, largest difference, causes, machine, cost).

    ``out`` must be new or empty, and neither a run directory nor inside one; a refusal removes only
    what this call created (``out`` itself when it made it, else what it put in it).

    Raises:
        InputError: a damaged or hostile bundle (nothing written), no data to rerun on (pass
            ``data``), or an ``out`` that is a run directory, in one, or not empty.
        RunFailedError: data that is not the run's (its rows named).
    """
    check_tolerance(tolerance)
    files_read = [Path(data)] if data is not None and not str(data).startswith("builtin:") else []
    refuse_overwrite(out, reads=[bundle, *files_read], option="--out")
    refuse_nonempty_dir(out, option="--out")
    created = first_missing(out)
    bundle_sha256 = sha256_file(bundle)  # the bundle as unpacked, not as it may be after training
    try:
        unpacked = unpack(bundle, out / "recorded")
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
        started = time.perf_counter()
        new_dir, comparison = rerun(
            unpacked.run_dir,
            new_run_dir=out / "rerun",
            allow_code_drift=allow_code_drift,
            code_dir=code_dir,
            progress=progress,
            report=report,
            data=use,
            tolerance=tolerance,
            tracking=False,  # the bundle's trackers are the packing machine's, not this one's
        )
    except BaseException:
        if not (out / "rerun").exists():  # stopped before training: remove what this call made, only
            shutil.rmtree(created if created is not None else out / "recorded", ignore_errors=True)
        raise
    summary = _rerun_summary(bundle, bundle_sha256, comparison, time.perf_counter() - started)
    write_json_atomic(out / "rerun.json", summary)
    return new_dir, comparison


def _rerun_summary(bundle: Path, sha256: str, comparison: Comparison, seconds: float) -> dict[str, Any]:
    """What a bundle rerun proved, on which machine, at what cost (read by the HTML report)."""
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
            "machine": environment_fingerprint().get("platform") or platform.platform(),
            "host": platform.node(),
            "seconds": round(seconds, 3),
        }
    )

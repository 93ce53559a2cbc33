"""``reprotune rerun RUN_DIR``: reproduce a recorded run from its record alone, then compare.

Before anything runs: the data is checked against the run's own manifest, the code (HEAD and the
sha256 of the uncommitted diff) against the record, and the environment is diffed. The new run
uses the recorded resolved config, the recorded manifest (byte for byte) and so the same seeds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reprotune._errors import InputError, RunFailedError


@dataclass(frozen=True)
class Preflight:
    """What differs between the recorded run and this machine, found before running."""

    code_drift: list[str]
    environment_drift: list[str]


def preflight(run_dir: Path, record: dict[str, Any], *, code_dir: Path) -> Preflight:
    """Check data, code and environment against the record of the run in ``run_dir``.

    Raises:
        RunFailedError: the data no longer matches the run's manifest.
    """
    from reprotune._checksplit import check_split
    from reprotune._data import load_table
    from reprotune._fingerprint import code_fingerprint, environment_fingerprint
    from reprotune._manifest import load_manifest

    cfg = record["config"]
    manifest_path = run_dir / "split.json"
    table = load_table(cfg["data"]["path"], cfg["data"]["format"])
    check = check_split(load_manifest(manifest_path), table)
    if not check.identical:
        raise RunFailedError(
            "the data is not the data the run was made from:\n" + check.format(),
            source=f"{cfg['data']['path']} vs {manifest_path}",
            fix="restore the original data file (its sha256 is in record.json under data.file_sha256)",
        )

    recorded = record.get("code", {})
    now = code_fingerprint(code_dir).to_record(patch_file=None)
    code_drift = []
    for key in ("commit", "dirty", "diff_sha256"):
        if recorded.get(key) != now.get(key):
            code_drift.append(f"code.{key}: recorded {recorded.get(key)!r}, now {now.get(key)!r}")

    env_drift = environment_drift(record.get("environment", {}), environment_fingerprint())
    return Preflight(code_drift, env_drift)


def environment_drift(old: dict[str, Any], new: dict[str, Any], prefix: str = "environment") -> list[str]:
    """Every leaf of two environment fingerprints that differs, as ``path: recorded X, now Y``."""
    drift: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            drift.extend(environment_drift(a, b, f"{prefix}.{key}"))
        elif a != b:
            drift.append(f"{prefix}.{key}: recorded {a!r}, now {b!r}")
    return drift


def rerun(
    run_dir: Path,
    *,
    new_run_dir: Path | None,
    allow_code_drift: bool,
    code_dir: Path,
    progress: bool = True,
    report: Callable[[str], None] = print,
) -> tuple[Path, Any]:
    """Reproduce the run in ``run_dir``; return the new run's directory and the comparison.

    Raises:
        InputError: not a run directory, or code drift without ``allow_code_drift``.
        RunFailedError: the data changed.
    """
    from reprotune._compare import compare_runs
    from reprotune._config import config_from_dict
    from reprotune._record import load_record
    from reprotune._train import RunOptions, run_experiment

    record_path = run_dir / "record.json"
    if not record_path.is_file():
        raise InputError(
            f"{run_dir} is not a run directory (no record.json)",
            fix="point at a directory written by `reprotune run`",
        )
    record = load_record(record_path)
    if record.get("status") != "completed":
        raise InputError(
            f"the run in {run_dir} did not complete (status {record.get('status')!r})",
            source=str(record_path),
            fix=f"resume it with `reprotune resume {run_dir}` first",
        )
    checks = preflight(run_dir, record, code_dir=code_dir)
    if checks.code_drift and not allow_code_drift:
        raise InputError(
            "the code differs from the recorded run:\n  " + "\n  ".join(checks.code_drift),
            source=str(record_path),
            fix=f"check out commit {record['code'].get('commit')} (and apply {run_dir / 'code.patch'} if the "
            "run was dirty), or pass --allow-code-drift to rerun anyway",
        )
    for line in checks.code_drift:
        report(f"warning: {line} (allowed by --allow-code-drift)")
    for line in checks.environment_drift:
        report(f"environment differs: {line}")
    cfg = config_from_dict(record["config"], source=str(record_path))
    target = new_run_dir or run_dir.parent / f"{run_dir.name}-rerun"
    options = RunOptions(
        run_dir=target, progress=progress, tracking=True, manifest=run_dir / "split.json", code_dir=code_dir
    )
    result = run_experiment(cfg, options)
    return result.run_dir, compare_runs(run_dir, result.run_dir)

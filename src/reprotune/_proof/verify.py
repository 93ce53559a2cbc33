"""``reprotune verify``: prove that a config reproduces, with controls that prove the check can fail.

Legs, each in a fresh process (``python -m reprotune ...``), into one verification directory:

1. ``reference``: the experiment as configured.
2. ``rerun``: the same again; must be IDENTICAL to the reference.
3. ``control-seed``: one derived seed perturbed; must be DIVERGED (else the check is blind).
4. ``resume``: stopped after a mid-run checkpoint and resumed; must be IDENTICAL to the reference.
5. ``control-resume``: stopped at the same point and resumed *without* restoring the RNG states;
   must be DIVERGED when anything in the run draws from them after the checkpoint (dropout).

The verdict is PASS only when every leg says what it must. A ``verification.json`` keeps the evidence.
"""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reprotune._config.loading import dump_config_yaml
from reprotune._config.schema import ExperimentConfig, config_sha256
from reprotune._determinism.seeds import CONSUMERS, derive_seeds
from reprotune._errors import InputError, RunFailedError
from reprotune._jsonio import write_json_atomic
from reprotune._proof.compare import compare_runs
from reprotune._run.layout import RunLayout, VerifyLayout
from reprotune._run.record import load_record
from reprotune._run.rundir import check_is_run_dir

SCHEMA = "reprotune/verification"
SCHEMA_VERSION = 1


@dataclass
class Leg:
    """One leg of the verification and what it had to show."""

    name: str
    run_dir: str
    expected: str  # IDENTICAL or DIVERGED
    verdict: str | None = None
    passed: bool | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    note: str | None = None


@dataclass
class Verification:
    """The outcome of ``reprotune verify``."""

    verdict: str  # PASS or FAIL
    directory: str
    config_sha256: str
    legs: list[Leg]

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **asdict(self)}

    def format(self) -> str:
        lines = [f"verify: {self.verdict}  ({self.directory})"]
        for leg in self.legs:
            mark = "ok  " if leg.passed else ("n/a " if leg.passed is None else "FAIL")
            detail = ", ".join(f"{k} {v}" for k, v in leg.evidence.items())
            lines.append(
                f"  [{mark}] {leg.name:<15} {leg.verdict or '-':<11} (must be {leg.expected}) {detail}"
            )
            if leg.note:
                lines.append(f"         {leg.note}")
        return "\n".join(lines)


def _reprotune(args: Sequence[str], log: Path) -> None:
    """Run ``python -m reprotune ARGS`` in a fresh process, its output into ``log``."""
    env = dict(os.environ)
    env.pop("REPROTUNE_KILL_AT", None)
    with open(log, "ab") as out:
        out.write(f"$ reprotune {' '.join(args)}\n".encode())
        out.flush()
        code = subprocess.call([sys.executable, "-m", "reprotune", *args], stdout=out, stderr=out, env=env)
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RunFailedError(
            f"`reprotune {' '.join(args)}` failed with exit code {code}:\n" + "\n".join(tail),
            source=str(log),
            fix="fix the run itself first (try `reprotune run` on the config)",
        )


def _evidence(cmp: Any) -> dict[str, Any]:
    data = cmp.to_json()
    where = data.get("where") or {}
    adapter = data.get("adapter") or {}
    return {
        k: v
        for k, v in {
            "steps": where.get("steps_compared"),
            "first_divergence": where.get("first_divergence_step"),
            "adapter_sha256": adapter.get("sha256_b"),  # this leg's own adapter
        }.items()
        if v is not None
    }


def verify_config(
    cfg: ExperimentConfig,
    out_dir: Path,
    *,
    control_seed: str = "data_order",
    resume: bool = True,
    reference: Path | None = None,
    progress: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Verification:
    """Run the legs described in the module docstring into ``out_dir`` and judge them.

    Args:
        cfg: the experiment.
        out_dir: the verification directory (new or empty).
        control_seed: the derived seed the negative control perturbs.
        resume: include the resume leg and its control.
        reference: an existing completed run of exactly this config to use as the reference leg
            (e.g. the run just made by ``reprotune run``), instead of running one.
        progress: where progress lines go.

    Raises:
        InputError: bad options, or a reference run of another config.
        RunFailedError: a leg failed to run.
    """
    if control_seed not in CONSUMERS:
        raise InputError(
            f"unknown seed consumer {control_seed!r}",
            source="--control-seed",
            fix=f"choose one of {', '.join(CONSUMERS)}",
        )
    if reference is not None:
        _check_reference(reference, cfg)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise InputError(f"verification directory {out_dir} is not empty", fix="choose a new --out directory")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = VerifyLayout(out_dir)
    config = paths.config
    dump_config_yaml(cfg, config)
    log = paths.log
    quiet = ["--no-progress", "--no-tracking"]
    seeds = derive_seeds(cfg.seed.root, dict(cfg.seed.overrides))
    legs: list[Leg] = []

    reference_dir = reference if reference is not None else paths.leg("reference")

    def judge(leg: Leg) -> None:
        cmp = compare_runs(reference_dir, Path(leg.run_dir))
        leg.verdict = cmp.verdict
        leg.evidence = _evidence(cmp)
        leg.passed = cmp.verdict == leg.expected
        progress(f"  {leg.name}: {cmp.verdict} (must be {leg.expected})")

    if reference is None:
        progress(f"verify: reference run -> {reference_dir}")
        _reprotune(["run", str(config), "--run-dir", str(reference_dir), *quiet], log)
    else:
        progress(f"verify: reference is the existing run {reference_dir}")

    progress("verify: rerun in a fresh process")
    rerun = Leg("rerun", str(paths.leg("rerun")), "IDENTICAL")
    _reprotune(["run", str(config), "--run-dir", rerun.run_dir, *quiet], log)
    judge(rerun)
    legs.append(rerun)

    perturbed = seeds[control_seed] + 1
    progress(f"verify: negative control, seed {control_seed} {seeds[control_seed]} -> {perturbed}")
    control = Leg(
        "control-seed",
        str(paths.leg("control-seed")),
        "DIVERGED",
        note=f"seed.overrides.{control_seed}={perturbed}",
    )
    _reprotune(
        [
            "run",
            str(config),
            "--run-dir",
            control.run_dir,
            "--set",
            f"seed.overrides.{control_seed}={perturbed}",
            *quiet,
        ],
        log,
    )
    judge(control)
    legs.append(control)

    total = _total_steps(reference_dir)
    stop = _resume_point(cfg, total)
    if resume and stop is None:
        legs.append(
            Leg(
                "resume",
                "",
                "IDENTICAL",
                note="skipped: train.save_every gives no checkpoint "
                "before the last step; set it to check exact resume",
            )
        )
    elif resume and stop is not None:
        for name, extra, expected in (
            ("resume", [], "IDENTICAL"),
            ("control-resume", ["--skip-rng-restore"], "DIVERGED"),
        ):
            progress(f"verify: {name}: stop after step {stop}, resume in a fresh process")
            leg = Leg(name, str(paths.leg(name)), expected)
            _reprotune(
                ["run", str(config), "--run-dir", leg.run_dir, "--stop-after-step", str(stop), *quiet], log
            )
            _reprotune(["resume", leg.run_dir, *quiet, *extra], log)
            judge(leg)
            if name == "control-resume" and not leg.passed and cfg.lora.dropout == 0:
                leg.passed = None
                leg.note = (
                    "inconclusive: with lora.dropout 0 nothing draws from the RNG after the "
                    "checkpoint, so skipping its restore cannot show"
                )
            legs.append(leg)

    ok = all(leg.passed is not False for leg in legs) and rerun.passed and control.passed
    result = Verification("PASS" if ok else "FAIL", str(out_dir), config_sha256(cfg), legs)
    write_json_atomic(
        paths.verification,
        {
            **result.to_json(),
            "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    return result


def _check_reference(run_dir: Path, cfg: ExperimentConfig) -> None:
    """Refuse a reference run that is unfinished or of another config."""
    check_is_run_dir(run_dir, option="--reference")
    record = load_record(RunLayout(run_dir).record)
    if record.get("status") != "completed":
        raise InputError(
            f"reference run {run_dir} is not complete (status {record.get('status')!r})",
            source="--reference",
            fix="resume it first, or leave --reference out",
        )
    if record.get("config_sha256") != config_sha256(cfg):
        raise InputError(
            f"reference run {run_dir} was made from another config",
            source="--reference",
            fix="pass the same config (and --set overrides) the reference was run with",
        )


def _total_steps(run_dir: Path) -> int:
    record = load_record(RunLayout(run_dir).record)
    return int(record["data"]["order"]["total_steps"])


def _resume_point(cfg: ExperimentConfig, total_steps: int) -> int | None:
    """The checkpoint step nearest the middle of the run, or None when there is none before the end."""
    every = cfg.train.save_every
    if not every:
        return None
    candidates = [s for s in range(every, total_steps, every)]
    if not candidates:
        return None
    return min(candidates, key=lambda s: abs(s - total_steps / 2))

"""The replays of ``reprotune verify RUN_DIR --spot``, all in one fresh process.

``python -m reprotune._proof.replay SPOT_DIR`` reads ``SPOT_DIR/plan.json`` (written by
``_proof.spot``) and, one after another in this process (the imports paid once), replays each
chosen interval of the reference run into its own run directory under ``SPOT_DIR``:

- from the initial state (interval ``0 -> b``): a fresh run of the recorded config on the recorded
  split manifest, stopped after step ``b`` (its checkpoint written there, as the reference's was);
- from checkpoint ``a``: a run directory holding a copy of the reference's record, config, split
  manifest, ledger and checkpoint ``a`` only, resumed (``resume_run``: the same restore a user's
  resume makes) and stopped after step ``b``, or run to the end for the last interval.

Then the negative controls, each stopped as soon as it has parted from the reference: the first
interval with the data-order seed perturbed, and (when a checkpoint was replayed) a resume from it
without restoring the RNG states. Judging is the parent's (``_proof.spot``); this writes nothing
but the run directories.
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import replace
from pathlib import Path

from reprotune._errors import ReprotuneError
from reprotune._proof.spot_plan import SeedControl, SpotPlan
from reprotune._run.checkpoint_files import checkpoint_dir
from reprotune._run.layout import RunLayout
from reprotune._run.record import read_record, record_config, write_stopped_copy
from reprotune._train.options import RunOptions
from reprotune._train.run import resume_run, run_experiment
from reprotune._train.watch import DivergenceWatch


def prepare_from_checkpoint(reference: Path, start: int, target: Path, *, data: str | None = None) -> None:
    """A run directory at ``target`` that resumes the reference from its checkpoint ``start``:
    the record (status ``stopped``; its data path ``data`` when given: a bundle's data here),
    config, split manifest, ledger and that one checkpoint."""
    ref, out = RunLayout(reference), RunLayout(target)
    out.checkpoints.mkdir(parents=True)
    write_stopped_copy(ref.record, out.record, data_path=data)
    for name in ("config", "manifest", "ledger"):
        source = getattr(ref, name)
        if source.exists():
            shutil.copyfile(source, getattr(out, name))
    checkpoint = checkpoint_dir(ref.checkpoints, start)
    shutil.copytree(checkpoint, out.checkpoints / checkpoint.name)


def replay(plan: SpotPlan) -> None:
    """Every interval of ``plan``, then the controls, each into its run directory."""
    reference = Path(plan.reference)
    paths = RunLayout(reference)
    cfg = record_config(read_record(paths.record), run_dir=reference, source=str(paths.record))
    data = plan.data  # a bundle's data, or a builtin name, in place of the recorded path
    if data:
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"path": data})})
    total = plan.total_steps
    quiet = RunOptions(
        progress=False,
        tracking=False,
        manifest=paths.manifest,
        code_dir=Path(plan.code_dir),
        allow_code_drift=plan.allow_code_drift,
    )
    for interval in plan.intervals:
        start, end, target = interval.start, interval.end, Path(interval.run_dir)
        stop = end if end < total else None
        print(f"replay: steps {start + 1}-{end} -> {target}", flush=True)
        if start == 0:
            run_experiment(cfg, replace(quiet, run_dir=target, stop_after_step=stop))
        else:
            prepare_from_checkpoint(reference, start, target, data=data)
            resume_run(target, replace(quiet, stop_after_step=stop))
    for control in plan.controls:
        target, watch = Path(control.run_dir), DivergenceWatch(paths.ledger, bound=control.bound)
        print(f"replay: negative control {control.name} -> {target}", flush=True)
        if isinstance(control, SeedControl):
            perturbed = cfg.model_copy(
                update={"seed": cfg.seed.model_copy(update={"overrides": control.overrides})}
            )
            run_experiment(perturbed, replace(quiet, run_dir=target, hooks=[watch]))
        else:
            prepare_from_checkpoint(reference, control.start, target, data=data)
            resume_run(target, replace(quiet, hooks=[watch], restore_rng_on_resume=False))


def main(argv: list[str]) -> int:
    """``python -m reprotune._proof.replay SPOT_DIR``; its exit code. A reprotune error (a base
    model not found, data refused) is said as the CLI says it, ``error:`` and ``fix:`` lines and no
    traceback, with its exit code (2: bad input), which ``verify --spot`` turns back into the same
    refusal (``run_logged(bad_input=True)``)."""
    try:
        replay(SpotPlan.read(Path(argv[0])))
    except ReprotuneError as exc:
        print(f"reprotune verify --spot: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

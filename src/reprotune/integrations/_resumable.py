"""Whether a Trainer-made run may start or resume where it is asked to: a new run directory, a
resume of the run that saved the checkpoint, or a branch (a resume into a new run directory from
another run's checkpoint, its history copied). Each refusal names the directory and the fix."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from reprotune._data.manifest import copy_manifest
from reprotune._errors import InputError
from reprotune._jsonio import canonical_sha256, write_json_atomic
from reprotune._run import layout
from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER as CHECKPOINT_MARKER
from reprotune._run.drift import (
    MODEL_PLACE_KEYS,
    inert_trainer_arg,
    leaf_changes,
    refuse_code_drift,
    refuse_completed,
    refuse_model_drift,
    section_drift,
)
from reprotune._run.layout import RunLayout
from reprotune._run.outputs import refuse_inside_run, refuse_nonempty_dir
from reprotune._run.record import load_record, make_run_id, status_of
from reprotune._train.writer import report
from reprotune.integrations._ranks import checkpoint_marker
from reprotune.integrations._sections import is_eval_loss
from reprotune.integrations.controls import BRANCH_FROM

#: How the callback's run directory is named in messages (it is no command-line option).
OPTION = "ReprotuneCallback run_dir"


def refuse_unclaimable(run_dir: Path, trainer_output: str | None = None) -> None:
    """Refuse a run directory that is a file or holds files: a new run, or a branch, needs an
    empty one. ``trainer_output``: the Trainer's output directory; where it lies in ``run_dir`` (as
    in verify's legs), what the Trainer's own callbacks wrote there before this one began
    (TensorBoard's event files, in transformers 5) is no other run's."""
    if run_dir.is_dir() and not _besides_trainer_output(run_dir, trainer_output):
        return
    refuse_nonempty_dir(
        run_dir,
        option=OPTION,
        fix="pass another run_dir to ReprotuneCallback (or leave it out for a fresh runs/<id>); "
        "to continue a stopped run, resume the Trainer from its checkpoint",
    )


def _besides_trainer_output(run_dir: Path, trainer_output: str | None) -> list[Path]:
    """The entries of the directory ``run_dir`` but the Trainer's output directory, where that is
    one of them (itself, not a link to it)."""
    kept = Path(trainer_output).resolve() if isinstance(trainer_output, str) else None
    return [p for p in run_dir.iterdir() if kept is None or run_dir.resolve() / p.name != kept]


#: What a branch takes from the run it starts from besides its record and split manifest (the
#: ledger is then cut back to the checkpoint's step); never that run's adapter or checkpoints.
_BRANCHED_FILES = (layout.CONFIG, layout.LEDGER, layout.PATCH)


def branch_source(
    paths: RunLayout,
    marker: Mapping[str, Any],
    from_step: int,
    config: Mapping[str, Any],
    code: Mapping[str, Any],
    branch_from: Path | None = None,
    trainer_output: str | None = None,
) -> Path | None:
    """The run a resume into ``paths`` branches from: None when ``paths`` holds the run (a plain
    resume), else the completed run that saved the checkpoint, checked before anything is copied:
    in ``branch_from`` when given (the run where it lies now), else where the checkpoint's marker
    says it was saved. ``trainer_output``: the Trainer's output directory (:func:`refuse_unclaimable`).

    Raises:
        InputError: ``paths`` holds no run, and the run that saved the checkpoint is not found,
            is not complete (then it resumes in its own directory), or the branch is refused (a
            directory that is not new, other settings or code).
    """
    if paths.is_run_dir():
        return None
    saved_in = str(branch_from.resolve()) if branch_from is not None else marker.get("run_dir")
    named = f" (named by {BRANCH_FROM})" if branch_from is not None else ""
    if not isinstance(saved_in, str):
        raise InputError(
            f"the Trainer resumes from step {from_step} but {paths.root} holds no run record, and the "
            f"checkpoint has no {CHECKPOINT_MARKER} naming the run that saved it",
            source=str(paths.root),
            fix="resume with the run_dir (or REPROTUNE_RUN_DIR) of the run that saved the checkpoint",
        )
    source, fix = Path(saved_in), f"resume with the run_dir (or REPROTUNE_RUN_DIR) of {saved_in}"
    if not RunLayout(source).is_run_dir():
        raise InputError(
            f"the Trainer resumes from step {from_step} but {paths.root} holds no run record, and "
            f"the run that saved the checkpoint is not found at {saved_in}{named}",
            source=str(paths.root),
            fix=f"set {BRANCH_FROM} to where that run lies now"
            if named
            else f"{fix}, or put that run directory back where it was, or set {BRANCH_FROM} to where it "
            "lies now",
        )
    theirs = load_record(source)
    if marker.get("run_id") not in (None, theirs.get("run_id")):
        raise InputError(
            f"the checkpoint was saved by run {marker['run_id']}, but {source}{named} now holds run "
            f"{theirs.get('run_id')}: there is no history of the checkpoint's run to branch from",
            source=str(source),
            fix=f"set {BRANCH_FROM} to the run directory of the run that saved the checkpoint"
            if named
            else "resume into the run directory of the run that saved the checkpoint",
        )
    if status_of(theirs) != "completed":  # it can resume in its own directory: no fork of it
        raise InputError(
            f"the Trainer resumes from step {from_step} of run {theirs.get('run_id')} "
            f"({theirs.get('status')}) but {paths.root} holds no run record",
            source=str(paths.root),
            fix=fix,
        )
    refuse_inside_run(paths.root, option=OPTION)
    refuse_unclaimable(paths.root, trainer_output)
    check_resumable(RunLayout(source), theirs, config, code, branching=True, say=lambda _: None)
    return source


def branch(source: Path, paths: RunLayout) -> dict[str, Any]:
    """Start ``paths`` as a branch of the completed run in ``source``: a resume from one of that
    run's checkpoints into a new run directory (its own directory cannot resume a completed run).
    Its history (config, ledger, patch, split manifest with its row-hash file, then the record
    under a new run id, as a run stopped there, last) is copied; returns what the attempt records
    of the run it branched from. The caller removes the directory's files when the resume fails."""
    theirs = load_record(RunLayout(source).record)
    config_sha256 = str(theirs.get("config_sha256"))  # the record's config: the run id's too
    for name in _BRANCHED_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, paths.root / name)
    if RunLayout(source).manifest.is_file():
        copy_manifest(RunLayout(source).manifest, paths.manifest)
    run_id = make_run_id(config_sha256)
    while run_id == theirs["run_id"]:  # made within the second the run it branches from was
        time.sleep(0.05)  # (a run id is the second and the config's hash): the next second's
        run_id = make_run_id(config_sha256)
    record = {**theirs, "run_id": run_id, "status": "stopped"}
    record.pop("outputs", None)
    write_json_atomic(paths.record, record)
    report(f"reprotune: run {record['run_id']} branches from run {theirs['run_id']} ({source})")
    return {"run_id": theirs["run_id"], "run_dir": str(source), "status": theirs.get("status")}


def remove_branch(paths: RunLayout, trainer_output: str | None = None) -> None:
    """Remove what a branch wrote into its run directory (new and empty before it, but for the
    Trainer's output directory, ``trainer_output``, which is left: :func:`refuse_unclaimable`),
    once a resume into it failed: a retry then starts from a new directory again."""
    if paths.root.is_dir():
        for entry in _besides_trainer_output(paths.root, trainer_output):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def validated_at(log_history: Sequence[Mapping[str, Any]], step: int) -> bool:
    """Whether the Trainer evaluated at ``step`` (an eval loss in the checkpoint's
    ``log_history``): the run's ledger then holds a ``val`` line there, written before the
    checkpoint was saved and synced with it (the Trainer evaluates, then saves)."""
    return any(e.get("step") == step and any(map(is_eval_loss, e)) for e in log_history)


#: What a resume's data section may lack that the start's holds: the manifest's hash is written
#: when the run directory is made, never recomputed.
_NOT_SEEN_AGAIN = frozenset({"manifest_sha256"})


def setup_drift(
    paths: RunLayout,
    record: Mapping[str, Any],
    now: Mapping[str, Mapping[str, Any]],
    say: Callable[[str], None],
) -> list[str]:
    """How the setup's sections (``data``, ``model``) differ now from the run's start, each said
    as a warning, for the attempt's ``drift`` (compare names them from the resume's step).

    Raises:
        InputError: the base model's files are others (``refuse_model_drift``), or the rows the
            Trainer trains on are (as ``reprotune resume`` refuses a changed data file): the steps
            after the checkpoint would train another model, or on other data.
    """
    before, after = (
        (section or {}).get("train_rows_sha256") for section in (record.get("data"), now.get("data"))
    )
    if isinstance(before, str) and isinstance(after, str) and before != after:
        raise InputError(
            f"the Trainer's train_dataset is not the run's: its rows hash to {after[:12]}, the "
            f"run's to {before[:12]} (data.train_rows_sha256)",
            source=str(paths.record),
            fix="resume with the train_dataset the run started with (the same rows in the same "
            "order), or run the script into a new run directory",
        )
    if isinstance(record.get("model"), Mapping) and "model" in now:
        refuse_model_drift(
            record["model"],
            now["model"],
            paths.record,
            fix="load the base model the run started with in the script (the same files, or the same "
            "revision), or run the script into a new run directory",
        )
    drift: list[str] = []
    for name, section in now.items():
        before = record.get(name)
        if isinstance(before, Mapping) and before != section:
            kept = [{k: v for k, v in part.items() if k not in _NOT_SEEN_AGAIN} for part in (before, section)]
            drift.extend(section_drift(kept[0], kept[1], prefix=name))
    for line in drift:
        say(f"warning: differs from the run's start: {line}")
    return drift


def refuse_another_world_size(run_dir: Path, checkpoint: str | None, world_size: int) -> None:
    """Refuse a Trainer resume by another number of processes (``world_size``) than the run's.

    Each process trains its own ``per_device_train_batch_size`` rows of every micro-batch, so at
    another number the step's batch and the rows each step draws are others, and the steps after
    the checkpoint another run's; the Trainer goes on without a word. The run's number is its
    record's ``trainer.ranks`` (one entry per process); for a branch, whose directory holds no
    record yet, the one the marker of ``checkpoint`` names (the ranks that saved it). Checked
    before the run directory is touched (its lock, the ledger's cut, a branch's copy).

    Raises:
        InputError: naming both numbers and the fix.
    """
    paths = RunLayout(run_dir)
    if paths.is_run_dir():
        ranks = (load_record(paths.record).get("trainer") or {}).get("ranks")
        source = f"{paths.record} (key trainer.ranks)"
    else:
        ranks = checkpoint_marker(checkpoint).get("ranks")
        source = f"{checkpoint}/{CHECKPOINT_MARKER} (key ranks)"
    if not isinstance(ranks, list) or not ranks or len(ranks) == world_size:
        return
    run = len(ranks)
    how = (
        f"`torchrun --nproc_per_node {run} SCRIPT ...`"
        if run > 1
        else "`python SCRIPT ...`, without torchrun"
    )
    raise InputError(
        f"the run in {run_dir} trained in {run} process(es) (world size {run}); this resume runs in "
        f"{world_size} (world size {world_size}): each process trains its own rows of every step, so "
        "the step's batch would be another and the steps after the checkpoint another run's",
        source=source,
        fix=f"launch the same number of processes as the run: {run} in all (e.g. {how})",
    )


def check_resumable(
    paths: RunLayout,
    record: Mapping[str, Any],
    config: Mapping[str, Any],
    code: Mapping[str, Any],
    *,
    branching: bool = False,
    say: Callable[[str], None] = report,
) -> list[str]:
    """Refuse to resume the run in ``paths`` when it completed (unless ``branching`` from it), or
    with other settings (``config``: the run config now) or code than the run's. A Trainer
    argument that says only when it logs, saves or pushes may differ (``inert_trainer_arg``), and
    where the base model lies (its files are checked by their hashes): returned as drift lines,
    for the attempt, each said on ``say`` as a warning."""
    if not branching:
        refuse_completed(
            status_of(record),
            paths.root,
            fix="resume from its checkpoint into a new run_dir (a branch of this run, its history "
            "copied), or run the script again into a new run directory",
        )
    recorded, now = record.get("config") or {}, canonical_sha256(dict(config))
    changes = leaf_changes(recorded, config, prefix="config") if record.get("config_sha256") != now else []
    best = any(_args(c).get("load_best_model_at_end") for c in (recorded, config))
    computing = [change for change in changes if not _may_move(change[0], best)]
    if computing or (record.get("config_sha256") != now and not changes):
        named = "; ".join(_named(key, a, b, recorded) for key, a, b in computing[:3])
        more = f" (and {len(computing) - 3} more)" if len(computing) > 3 else ""
        hashes = f"config_sha256 {str(record.get('config_sha256'))[:12]} recorded, {now[:12]} now"
        saves = "" if best else "save_*, "
        raise InputError(
            f"the Trainer's settings, model or LoRA config differ from the run's: {named or hashes}{more}",
            source=str(paths.record),
            fix="resume with the same script and arguments as the run that wrote the checkpoint "
            f"(only when it logs, saves or pushes may change: logging_*, {saves}hub_*, push_to_hub)",
        )
    refuse_code_drift(record.get("code") or {}, code, paths.root, what="resuming", override=None)
    drift = [f"{key}: recorded {a!r}, now {b!r}" for key, a, b in changes]
    for line in drift:
        say(f"warning: differs from the run's start (it cannot change what is computed): {line}")
    return drift


def _may_move(key: str, load_best: bool) -> bool:
    """Whether a resume may find the config key ``key`` changed: when the Trainer logs, saves or
    pushes, or where the base model lies and how it is named (its files' hashes say what it is)."""
    return inert_trainer_arg(key, load_best=load_best) or key in MODEL_PLACE_KEYS


def _named(key: str, a: Any, b: Any, recorded: Mapping[str, Any]) -> str:
    """A refused change as the message names it: ``eval_steps``, which the Trainer fills in from
    ``logging_steps`` when it is not given, says so where it holds the recorded logging_steps."""
    said = f"{key}: recorded {a!r}, now {b!r}"
    if key == "config.trainer.args.eval_steps" and a == _args(recorded).get("logging_steps"):
        said += " (the Trainer sets eval_steps to logging_steps when it is not given: give it)"
    return said


def _args(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A run config's Trainer arguments (``trainer.args``), empty where it has none."""
    trainer = config.get("trainer")
    args = trainer.get("args") if isinstance(trainer, Mapping) else None
    return args if isinstance(args, Mapping) else {}


def check_own_checkpoint(
    paths: RunLayout, run_id: str, checkpoint: str | None, marker: Mapping[str, Any]
) -> None:
    """Refuse a checkpoint whose marker names another run: its weights, optimizer and RNG are that
    run's, so the resumed run would silently be a splice of two runs."""
    # By run id, not directory: a copy of the run (moved, or verify --spot's replays) is the run.
    if marker.get("run_id") not in (None, run_id):
        raise InputError(
            f"the checkpoint {checkpoint} was saved by run {marker['run_id']} ({marker.get('run_dir')}), "
            f"not by run {run_id} ({paths.root}), which resumes from it",
            source=f"{checkpoint}/{CHECKPOINT_MARKER}",
            fix=f"resume from a checkpoint of run {run_id}, or resume run {marker['run_id']} with "
            f"run_dir={marker.get('run_dir')}",
        )

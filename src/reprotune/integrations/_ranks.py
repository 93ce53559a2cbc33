"""Every rank of a Trainer run: who it is (host, device), the RNG file it saved at each checkpoint
(its sha256), and on a resume what of the Trainer's checkpoint it will restore.

The callback runs on every rank and global rank 0 alone writes the run directory, so each rank's
facts are gathered to it (``torch.distributed.all_gather_object``; in one process, itself). Each
rank looks at the checkpoint as it sees it: a rank on another host with its own copy is checked
there. What the Trainer restores is read off the files its loaders read (transformers'
``Trainer._load_rng_state``, ``_load_optimizer_and_scheduler``, ``_load_scaler``): it restores
the optimizer and the learning-rate schedule only when both files are there, and says nothing
above INFO level when any is missing.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from reprotune._documents import read_json_file
from reprotune._jsonio import sha256_file
from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER as CHECKPOINT_MARKER
from reprotune._run.checkpoint_files import TRAINER_DATA_POSITION as DATA_POSITION
from reprotune._run.checkpoint_files import TRAINER_PIECES as CONSEQUENCES
from reprotune._run.layout import RunLayout
from reprotune.integrations._probes import steps_per_epoch

_T = TypeVar("_T")

OPTIMIZER_FILES = ("optimizer.pt", "optimizer.bin")
SCHEDULER_FILE = "scheduler.pt"
SCALER_FILE = "scaler.pt"


def gather(build: Callable[[], _T]) -> list[_T]:
    """``build()`` of every rank, in rank order (all ranks must call it at the same point). A rank
    whose ``build`` raises still joins the gather, and then every rank raises, naming it: one rank
    failing alone would leave the others waiting in the collective."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [build()]
    try:
        mine: tuple[Any, str | None] = (build(), None)
    except Exception as exc:
        mine = (None, f"rank {dist.get_rank()}: {type(exc).__name__}: {exc}")
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    errors = [error for _, error in gathered if error]
    if errors:
        raise RuntimeError(f"reprotune could not read every rank's facts: {'; '.join(errors)}")
    return [fact for fact, _ in gathered]


def on_rank_zero(is_zero: bool, begin: Callable[..., None], *args: Any) -> None:
    """``begin(*args)`` on global rank 0, and its outcome told to every rank (all ranks must call this
    at the same point): when it raises there, rank 0 raises its own error and every other rank an
    error naming it. Raised on rank 0 alone, a refusal left the other ranks waiting at their
    first collective until its timeout under a launcher that does not end them (``srun``, or
    processes started one by one); torchrun ends them."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        if is_zero:
            begin(*args)
        return
    failure: BaseException | None = None
    told: list[str | None] = [None]
    if is_zero:
        try:
            begin(*args)
        except BaseException as exc:  # a Ctrl-C too: the others must not wait for a broadcast
            failure, told[0] = exc, f"{type(exc).__name__}: {exc}"
    dist.broadcast_object_list(told, src=0)
    if failure is not None:
        raise failure
    if told[0] is not None:
        raise RuntimeError(f"reprotune stopped the run at train begin on rank 0: {told[0]}")


def identity(args: Any) -> dict[str, Any]:
    """This rank: its global and local rank, host and device."""
    return {
        "rank": int(getattr(args, "process_index", 0) or 0),
        "local_rank": int(getattr(args, "local_process_index", 0) or 0),
        "host": socket.gethostname(),
        "device": str(getattr(args, "device", "cpu")),
    }


def rng_file_name(rank: int, world_size: int) -> str:
    """The RNG file the Trainer saves and reads for ``rank`` (one process: ``rng_state.pth``)."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def rank_facts(args: Any, state: Any, loader: Any, *, trainer: Any, checkpoint: str | None) -> dict[str, Any]:
    """This rank's :func:`identity` and, resuming from ``checkpoint``, its :func:`restore_plan`."""
    step = int(state.global_step)
    per_epoch = steps_per_epoch(loader, args.gradient_accumulation_steps) if loader is not None else None
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    restore = None
    if step:
        mid_epoch = not per_epoch or step % per_epoch != 0
        restore = restore_plan(checkpoint, args, mid_epoch=mid_epoch, scaling=scaler is not None)
    return {"identity": identity(args), "restore": restore}


def saved_state(checkpoint: Path, args: Any) -> dict[str, Any]:
    """This rank's facts at a checkpoint the Trainer just saved: who, and its RNG file's sha256."""
    me = identity(args)
    name = rng_file_name(me["rank"], int(getattr(args, "world_size", 1) or 1))
    path = checkpoint / name
    return {**me, "rng_file": name, "rng_sha256": sha256_file(path) if path.is_file() else None}


def restore_plan(
    checkpoint: str | None, args: Any, *, mid_epoch: bool, scaling: bool
) -> dict[str, Any] | None:
    """What this rank will restore resuming from ``checkpoint`` (None: not a resume): its facts,
    its RNG file's sha256 and the pieces the Trainer will not find (``missing``)."""
    if checkpoint is None:
        return None
    directory = Path(checkpoint)
    plan = saved_state(directory, args)
    missing: list[str] = [] if plan["rng_sha256"] else [plan["rng_file"]]
    if not getattr(args, "deepspeed", None):  # DeepSpeed restores its optimizer and schedule itself
        if not _has_optimizer(directory):
            missing.append(OPTIMIZER_FILES[0])
        if not (directory / SCHEDULER_FILE).is_file():
            missing.append(SCHEDULER_FILE)
    if scaling and not (directory / SCALER_FILE).is_file():
        missing.append(SCALER_FILE)
    if mid_epoch and bool(getattr(args, "ignore_data_skip", False)):
        missing.append(DATA_POSITION)
    return {**plan, "missing": missing}


def _has_optimizer(directory: Path) -> bool:
    """Whether the Trainer finds an optimizer state there, as its loader looks: ``optimizer.pt``
    or ``optimizer.bin``, or a folder named for it (sharded FSDP's ``optimizer_0/``)."""
    if any((directory / name).is_file() for name in OPTIMIZER_FILES):
        return True
    return directory.is_dir() and any(p.is_dir() and "optimizer" in p.name for p in directory.iterdir())


def checkpoint_marker(checkpoint: str | None) -> Mapping[str, Any]:
    """What the callback wrote into ``checkpoint`` when it was saved (:data:`CHECKPOINT_MARKER`:
    the run's directory and id, the step, every rank's facts); empty for an unmarked checkpoint."""
    marker = Path(checkpoint) / CHECKPOINT_MARKER if checkpoint else None
    if marker is None or not marker.is_file():
        return {}
    data = read_json_file(marker, what="checkpoint marker", fix="pass run_dir= to ReprotuneCallback")
    return data if isinstance(data, Mapping) else {}


def foreign_checkpoints(
    output_dir: str | None, resuming: str | None, run_dir: Path | None = None
) -> tuple[str, ...]:
    """The Trainer checkpoints in ``output_dir`` another run saved, as ``checkpoint-N (run ID)``:
    those whose marker names another run than the checkpoint resumed from (``resuming``; "True":
    the last one there, as the Trainer takes it), or any, for a new run or a branch (``run_dir``
    given and holding no run yet). This run's saves at those steps overwrite them."""
    root = Path(output_dir) if output_dir else None
    if root is None or not root.is_dir():
        return ()
    marked = {
        p: checkpoint_marker(str(p)) for p in root.glob("checkpoint-*") if (p / CHECKPOINT_MARKER).is_file()
    }
    if resuming == "True":
        steps = {
            int(p.name.split("-")[-1]): p
            for p in root.glob("checkpoint-*")
            if p.name.split("-")[-1].isdigit()
        }
        resuming = str(steps[max(steps)]) if steps else None
    branching = run_dir is not None and not RunLayout(run_dir).is_run_dir()
    own = checkpoint_marker(resuming).get("run_id") if resuming and not branching else None
    return tuple(
        f"{p.name} (run {m.get('run_id')})"
        for p, m in sorted(marked.items())
        if m.get("run_id") not in (None, own)
    )


def saved_ranks(checkpoint: str | None) -> dict[int, Mapping[str, Any]]:
    """The ranks' facts the callback wrote into ``checkpoint``'s marker when it was saved, by rank
    (empty for a checkpoint saved before they were recorded, or not marked)."""
    ranks = checkpoint_marker(checkpoint).get("ranks")
    if not isinstance(ranks, list):
        return {}
    return {int(r["rank"]): r for r in ranks if isinstance(r, Mapping) and isinstance(r.get("rank"), int)}


def rng_changed(plans: Sequence[Mapping[str, Any]], checkpoint: str | None) -> list[str]:
    """The RNG files in ``checkpoint`` other than the ones their ranks saved there (by the
    sha256 its marker holds; none for a checkpoint marked before ranks were recorded)."""
    saved = saved_ranks(checkpoint)
    changed = []
    for plan in plans:
        before = saved.get(int(plan["rank"]), {}).get("rng_sha256")
        if before and plan["rng_sha256"] and before != plan["rng_sha256"]:
            changed.append(str(plan["rng_file"]))
    return changed


def resume_problems(
    plans: Sequence[Mapping[str, Any]], checkpoint: str | None, changed: Sequence[str]
) -> list[str]:
    """One sentence per piece a rank will not restore, naming the rank and the file, in rank
    order; an RNG file other than the one the rank saved there (``changed``, from
    :func:`rng_changed`) counts as not restored."""
    problems: list[str] = []
    for plan in plans:
        who = f"rank {plan['rank']}" if len(plans) > 1 else "the run"
        for piece in plan["missing"]:
            if piece == plan["rng_file"]:
                problems.append(
                    f"{who} resumes without its RNG state: {checkpoint} has no {piece}; {CONSEQUENCES['rng']}"
                )
            elif piece == DATA_POSITION:
                problems.append(f"{who} resumes without {piece}: {CONSEQUENCES[piece]}")
            else:
                problems.append(
                    f"{who} resumes without {piece}: {checkpoint} has none; {CONSEQUENCES[piece]}"
                )
        if plan["rng_file"] in changed:
            problems.append(
                f"{who} resumes with another RNG state than it saved: {plan['rng_file']} in {checkpoint} "
                f"is not the file written at that step; {CONSEQUENCES['rng']}"
            )
    return problems


def restored(
    ranks: Sequence[Mapping[str, Any]], checkpoint: str | None, report: Callable[[str], None]
) -> dict[str, Any]:
    """The attempt's record of what its ranks restore, each missing piece warned about: the RNG
    files not found (``rng_missing``) or not the ones saved there (``rng_changed``), and the
    other pieces (``state_missing``: optimizer, schedule, scaler, data position)."""
    changed = rng_changed(ranks, checkpoint)
    for line in resume_problems(ranks, checkpoint, changed):
        report(f"warning: {line}")
    rng_missing = [r["rng_file"] for r in ranks if r["rng_file"] in r["missing"]]
    state_missing = sorted({p for r in ranks for p in r["missing"] if p != r["rng_file"]})
    restored: dict[str, Any] = {
        "rng_restored": not (rng_missing or changed),
        "ranks": [dict(r) for r in ranks],
    }
    for key, value in (
        ("rng_missing", rng_missing),
        ("rng_changed", changed),
        ("state_missing", state_missing),
    ):
        if value:
            restored[key] = value
    return restored

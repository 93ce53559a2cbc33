"""Checkpoints: everything an exact resume needs, written atomically and verified on load.

``checkpoints/step-00000010/`` holds the trainable weights (safetensors), the optimizer, scheduler
and grad-scaler states (``torch.save``, loaded with ``weights_only=True``: nothing is unpickled),
every RNG state (safetensors + JSON) and ``state.json``: the step, the position in the data order,
the sha256 of every other file and its own sha256 (``state_sha256``, over the rest of state.json as
canonical JSON), so that no flipped byte anywhere in a checkpoint goes unnoticed. A checkpoint is
built in a temporary directory and put in place whole (``_jsonio.publishing_dir``: each file
fsynced, then renamed), so a crash leaves either a whole checkpoint or none; one whose hashes do not
match is refused with a warning and the previous one is used. A distributed run's checkpoint holds
the same files: the whole trainable and optimizer state, gathered on rank 0, and every rank's RNG
state (:class:`RankStates`); :func:`read_rank_checkpoint` reads it back.
"""

from __future__ import annotations

import copy
import json
import pickle
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from reprotune._determinism.rng import (
    capture_rng_state,
    ranks_rng_from_tensors,
    ranks_rng_to_tensors,
    restore_rng_state,
    rng_state_from_tensors,
    rng_state_to_tensors,
)
from reprotune._errors import InputError
from reprotune._formats import CHECKPOINT
from reprotune._jsonio import (
    free_bytes,
    is_no_space,
    no_space_error,
    publishing_dir,
    sha256_file,
    unpublished,
    write_json_atomic,
)
from reprotune._model.lora import trainable_tensors
from reprotune._run.checkpoint_files import (
    _PREFIX,
    OPTIMIZER_FILE,
    RNG_META,
    RNG_TENSORS,
    STATE_FILE,
    WEIGHTS_FILE,
    StateFile,
    _state_sha256,
    checkpoint_dir,
    drop_newer_checkpoints,
    list_checkpoints,
    newer_checkpoints,
    read_state_file,
    verify_checkpoint,
)
from reprotune._run.checkpoint_shapes import check_state_shapes, optimizer_state_by_name, trainable_shapes


@dataclass(frozen=True)
class CheckpointState:
    """Where the run stood when the checkpoint was taken.

    Args:
        step: optimizer steps done.
        epoch: the epoch of the last step done.
        position: (epoch, index within it) of the next row to be seen.
    """

    step: int
    epoch: int
    position: tuple[int, int]


@dataclass(frozen=True)
class RankStates:
    """What rank 0 of a distributed run writes in place of its own objects' states.

    Args:
        distributed: world size, backend and strategy (``state.json``'s ``distributed``).
        weights: the whole trainable weights, by parameter name (gathered under FSDP).
        optimizer: the whole optimizer state, keyed by parameter name
            (``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``).
        rng: every rank's :func:`capture_rng_state`, in rank order.
    """

    distributed: dict[str, Any]
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: list[dict[str, Any]]


def save_checkpoint(
    directory: Path,
    state: CheckpointState,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any | None,
    keep: int,
    ranks: RankStates | None = None,
) -> Path:
    """Write a checkpoint for ``state.step`` into ``directory``, keep the newest ``keep``; return its path.

    ``ranks`` (rank 0 of a distributed run): the whole trainable and optimizer state and every
    rank's RNG state, written instead of ``model``'s, ``optimizer``'s and this process's own.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(directory, state.step)
    # Half-written checkpoints of attempts that were killed are garbage: a run directory is written
    # by one process at a time. A checkpoint left at this step by a crashed attempt is replaced.
    for leftover in unpublished(directory, f"{_PREFIX}*"):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        with publishing_dir(final, replace=True) as tmp:
            _write_files(
                tmp, state, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, ranks=ranks
            )
    except BaseException as exc:  # publishing_dir left nothing half-written behind
        nearly_full = isinstance(exc, RuntimeError) and (free_bytes(directory) or 0) < 1 << 20
        if is_no_space(exc) or nearly_full:
            raise no_space_error(
                final,
                needed=_checkpoint_size(directory, model),
                what="a checkpoint takes",  # and the older ones stay until it is whole
                fix=f"free space on that device, then `reprotune resume {directory.parent}` "
                "continues the run",
            ) from None
        raise
    for stale in newer_checkpoints(directory, state.step):  # of an abandoned attempt, never newest
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(directory)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _checkpoint_size(directory: Path, model: torch.nn.Module) -> int:
    """What a checkpoint takes: the newest one's size, else the weights and two Adam moments."""
    existing = list_checkpoints(directory)
    if existing:
        return sum(p.stat().st_size for p in existing[-1].iterdir() if p.is_file())
    weights = sum(t.numel() * t.element_size() for t in trainable_tensors(model).values())
    return 3 * weights + (64 << 10)


def _write_files(
    tmp: Path,
    state: CheckpointState,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any | None,
    ranks: RankStates | None = None,
) -> None:
    """Every file of a checkpoint into the temporary directory ``tmp``, state.json last."""
    tensors = ranks.weights if ranks is not None else trainable_tensors(model)
    weights = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    save_file(weights, str(tmp / WEIGHTS_FILE))
    torch.save(
        {
            "optimizer": ranks.optimizer if ranks is not None else optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
        },
        tmp / OPTIMIZER_FILE,
    )
    if ranks is not None:
        rng_tensors, rng_meta = ranks_rng_to_tensors(ranks.rng)
    else:
        rng_tensors, rng_meta = rng_state_to_tensors(capture_rng_state())
    save_file(rng_tensors, str(tmp / RNG_TENSORS))
    write_json_atomic(tmp / RNG_META, rng_meta)
    files = {}
    for path in sorted(tmp.iterdir()):
        files[path.name] = sha256_file(path)
    manifest = CHECKPOINT.stamp(
        {"step": state.step, "epoch": state.epoch, "position": list(state.position), "files": files}
    )
    if ranks is not None:  # absent from a single process's checkpoint, which stays as it was
        manifest["distributed"] = ranks.distributed
    manifest["state_sha256"] = _state_sha256(manifest)
    write_json_atomic(tmp / STATE_FILE, manifest)


def valid_checkpoints(directory: Path, *, report: Callable[[str], None]) -> Iterator[Path]:
    """The checkpoints whose files match their hashes, newest first; each refused one is reported."""
    for path in reversed(list_checkpoints(directory)):
        problem = verify_checkpoint(path)
        if problem is None:
            yield path
        else:
            report(refused_warning(path, problem))


def unrestorable_warning(path: Path, exc: Exception) -> str:
    """The warning for a checkpoint that verifies but cannot be restored, ``exc`` saying why."""
    reason = exc.message if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
    first = (reason.splitlines() or [type(exc).__name__])[0][:300]
    return refused_warning(path, f"it verifies but cannot be restored ({first})")


def refused_warning(path: Path, problem: str) -> str:
    """The warning for a refused checkpoint, saying what the resume falls back to."""
    older = [p for p in list_checkpoints(path.parent) if p.name < path.name]
    then = "falling back to the previous one" if older else "no checkpoint is left: starting from step 0"
    return f"warning: checkpoint {path} is refused: {problem}; {then}"


def restore_latest_checkpoint(
    directory: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any | None,
    restore_rng: bool = True,
    report: Callable[[str], None],
    fits: Callable[[CheckpointState], str | None] = lambda state: None,
) -> tuple[Path, CheckpointState] | None:
    """Restore the newest checkpoint that verifies, restores and ``fits`` (None, or why not: the
    ledger does not reach it); return it and its state. One that does not (a forged file, wrong
    shapes) is reported, the objects put back, and the previous one tried. None: none restores,
    the objects are as they were. Checkpoints newer than the one taken (of 0: all) are removed."""
    before = _snapshot(model, optimizer, scheduler, scaler)
    for path in valid_checkpoints(directory, report=report):
        try:
            state = restore_checkpoint(
                path,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                scaler=scaler,
                restore_rng=restore_rng,
            )
        except Exception as exc:  # whatever a damaged file raises, an older checkpoint may do
            _put_back(before, model, optimizer, scheduler, scaler)
            report(unrestorable_warning(path, exc))
            continue
        why = fits(state)
        if why is None:
            drop_newer_checkpoints(directory, state.step, report)
            return path, state
        _put_back(before, model, optimizer, scheduler, scaler)
        report(refused_warning(path, why))
    drop_newer_checkpoints(directory, 0, report)
    return None


def _snapshot(model: torch.nn.Module, optimizer: Any, scheduler: Any, scaler: Any | None) -> dict[str, Any]:
    """Copies of what a restore changes, to put back after a restore that failed half-way."""
    return {
        "weights": {k: v.detach().clone() for k, v in trainable_tensors(model).items()},
        "optimizer": copy.deepcopy(optimizer.state_dict()),
        "scheduler": copy.deepcopy(scheduler.state_dict()),
        "scaler": copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
        "rng": capture_rng_state(),
    }


def _put_back(
    saved: dict[str, Any], model: torch.nn.Module, optimizer: Any, scheduler: Any, scaler: Any | None
) -> None:
    states = {key: copy.deepcopy(saved[key]) for key in ("optimizer", "scheduler", "scaler")}
    _load_into(model, optimizer, scheduler, scaler, saved["weights"], states)
    restore_rng_state(saved["rng"])


def _load_into(
    model: torch.nn.Module,
    optimizer: Any,
    scheduler: Any,
    scaler: Any | None,
    weights: dict[str, torch.Tensor],
    states: dict[str, Any],
) -> None:
    """Trainable ``weights`` into ``model``, and ``states`` (as :func:`load_states` reads them) into
    the optimizer, scheduler and grad scaler."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    if scaler is not None and states["scaler"] is not None:
        scaler.load_state_dict(states["scaler"])


def load_states(path: Path) -> dict[str, Any]:
    """The optimizer, scheduler and grad-scaler states of the checkpoint at ``path``, unpickled
    only as tensors and plain data.

    Raises:
        InputError: ``optimizer.pt`` holds any other object (refused unread).
    """
    try:
        states: dict[str, Any] = torch.load(path / OPTIMIZER_FILE, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as exc:
        # torch's own message advises weights_only=False, i.e. running whatever the file holds:
        # keep only its line naming the refused global.
        what = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), "not plain data")
        raise InputError(
            f"{path / OPTIMIZER_FILE} holds objects other than tensors and plain data; "
            f"refused unread ({what})",
            source=str(path / OPTIMIZER_FILE),
            fix="do not load this checkpoint; delete it to resume from the previous one, or rerun",
        ) from None
    return states


def restore_checkpoint(
    path: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: Any | None,
    restore_rng: bool = True,
) -> CheckpointState:
    """Load the checkpoint at ``path`` into the given objects and return where the run stood.

    ``restore_rng=False`` exists only for verify's negative control (a resume that forgets the RNG).
    """
    manifest, state = _read_state(path)
    if manifest.distributed is not None:
        raise InputError(
            f"{path} was written by a distributed run ({manifest.distributed}); it restores only "
            "under torchrun",
            source=str(path / STATE_FILE),
            fix="resume the run under torchrun, as docs/distributed.md shows",
        )
    # Read everything before changing anything, so a refused file leaves the objects untouched.
    weights = load_file(str(path / WEIGHTS_FILE))
    states = load_states(path)
    named = optimizer_state_by_name(states["optimizer"], optimizer, model)
    check_state_shapes(weights, named, trainable_shapes(model))
    _load_into(model, optimizer, scheduler, scaler, weights, states)
    if restore_rng:
        restore_rng_state(rng_state_from_tensors(*_read_rng(path)))
    return state


@dataclass(frozen=True)
class RankCheckpoint:
    """A distributed run's checkpoint, read: where the run stood, what it held (the whole trainable
    and optimizer state, gathered on rank 0, and every rank's RNG state), the scheduler's state.
    Rank 0 reads it and hands each rank its part."""

    state: CheckpointState
    ranks: RankStates
    scheduler: dict[str, Any]
    scaler: dict[str, Any] | None


def read_rank_checkpoint(path: Path) -> RankCheckpoint:
    """Read the checkpoint at ``path`` (verified by ``verify_checkpoint``) written by a distributed run.

    Raises:
        InputError: it was written by a single process, or ``optimizer.pt`` holds other objects
            than tensors and plain data.
    """
    manifest, state = _read_state(path)
    distributed = manifest.distributed
    if distributed is None:
        raise InputError(
            f"{path} was written by a single process; it restores only without torchrun",
            source=str(path / STATE_FILE),
            fix="resume the run without torchrun: `reprotune resume RUN_DIR`",
        )
    weights: dict[str, torch.Tensor] = load_file(str(path / WEIGHTS_FILE))
    states = load_states(path)
    rng = ranks_rng_from_tensors(*_read_rng(path))
    return RankCheckpoint(
        state=state,
        ranks=RankStates(distributed=distributed, weights=weights, optimizer=states["optimizer"], rng=rng),
        scheduler=states["scheduler"],
        scaler=states["scaler"],
    )


def _read_state(path: Path) -> tuple[StateFile, CheckpointState]:
    """A checkpoint's ``state.json`` (verified by ``verify_checkpoint``), and where the run stood."""
    manifest = read_state_file(path)
    return manifest, CheckpointState(step=manifest.step, epoch=manifest.epoch, position=manifest.position)


def _read_rng(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A checkpoint's RNG tensors and their description (``rng.safetensors``, ``rng.json``)."""
    meta: dict[str, Any] = json.loads((path / RNG_META).read_text(encoding="utf-8"))
    return load_file(str(path / RNG_TENSORS)), meta

"""What a resume keeps of a run's ledger: the lines up to its checkpoint's step, read past a damaged
line the checkpoint's sync never covered (a crash can leave a block of zeros there), and whether a
checkpoint is where the ledger stood (a step missing up to it, or other weights at it, refuse it).
The ledger's format is ``_run.ledger``'s. No torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, publishing_file
from reprotune._run.ledger import Ledger, ledger_from_bytes, parse_entry


def read_ledger_through(path: Path, step: int, *, val_at_step: bool | None) -> tuple[Ledger, int]:
    """The ledger up to the end of optimizer step ``step``, for a resume from a checkpoint of it, and
    how many damaged lines after that it left out.

    A checkpoint is saved after the ledger is synced, so the lines through its step are durable;
    the lines after it were not synced, a crash may have left one damaged (a block of zeros), and the
    resume recomputes them anyway. A damaged line among those does not block the resume. A damaged
    line right after the step's train line, where its ``val`` line would be, does unless
    ``val_at_step`` is False (the run did not validate after that step; None: not known). A ledger
    that does not reach the step is read whole, every line checked (:func:`read_ledger`).

    Raises:
        InputError: a damaged line the resume keeps or cannot place (see :func:`read_ledger`).
    """
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines[-1]:  # a partial last line: an append cut short, dropped as ``repair`` does
        lines[-1] = b""
    end = _end_of_step(lines[:-1], step, val_at_step)
    if end is None:
        return ledger_from_bytes(path, data, repair=True), 0
    kept = b"".join(raw + b"\n" for raw in lines[:end])
    return ledger_from_bytes(path, kept, repair=False), sum(map(_damaged, lines[end:-1]))


def _end_of_step(lines: list[bytes], step: int, val_at_step: bool | None) -> int | None:
    """How many of ``lines`` hold the ledger through ``step`` (its train line, or the init line of
    step 0, then its val lines); None: the ledger does not reach it, or a line before its end, or
    where its val line may be, is damaged."""
    kind, found = ("train" if step else "init"), None
    for index, raw in enumerate(lines):
        obj = _json_object(raw)
        if obj is None:
            return None  # damaged before the step's end: the whole read names the line
        if obj.get("kind") == kind and obj.get("step") == step:
            found = index
            break
    if found is None:
        return None
    end = found + 1
    while end < len(lines) and (obj := _json_object(lines[end])) and obj.get("kind") == "val":
        if obj.get("step") != step:
            break
        end += 1
    if end == found + 1 and val_at_step is not False and end < len(lines) and _damaged(lines[end]):
        return None  # it may be the step's own val line, damaged
    return end


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """The JSON object on one ledger line, or None when the line is not one."""
    try:
        obj = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return obj if isinstance(obj, dict) else None


def _damaged(raw: bytes) -> bool:
    """Whether one ledger line fails the schema's checks."""
    try:
        parse_entry(Path("ledger.jsonl"), 0, raw)
    except InputError:
        return True
    return False


def ledger_misfit(path: Path, step: int, weights_sha256: str, *, val_at_step: bool | None) -> str | None:
    """Why a checkpoint of ``step`` whose weights hash to ``weights_sha256`` is not where this run's
    ledger stood (None: it is): the ledger lacks a step up to it (a gap a resume would leave), or
    its weights at that step are others (a checkpoint this run did not save). ``val_at_step``: see
    :func:`read_ledger_through`."""
    if step == 0:
        return None
    if not path.is_file():
        return "the run has no ledger.jsonl to go on from"
    train = read_ledger_through(path, step, val_at_step=val_at_step)[0].train
    if len(train) < step or train[step - 1].step != step:
        return f"the ledger holds {len(train)} training step(s), not every step up to the checkpoint's {step}"
    if train[step - 1].fields.get("weights_sha256") != weights_sha256:
        return f"its weights are not the ledger's at step {step}: it is not a checkpoint this run saved"
    return None


def truncate_ledger(
    path: Path,
    *,
    keep_through_step: int,
    val_at_step: bool | None = None,
    report: Callable[[str], None] | None = None,
) -> int:
    """Rewrite the ledger keeping only lines with ``step <= keep_through_step``; return how many.

    Used on resume: what the lost steps wrote is dropped and recomputed. A partial last line (a
    crash mid-append) is dropped too, and so is a damaged line past the step (see
    :func:`read_ledger_through`, for ``val_at_step``), each told to ``report``. The rewrite is
    atomic.

    Raises:
        InputError: a complete line that does not follow the schema where the resume keeps it.
    """
    ledger, damaged = read_ledger_through(path, keep_through_step, val_at_step=val_at_step)
    if damaged and report is not None:
        report(
            f"{path}: left out {damaged} damaged line(s) after step {keep_through_step}, written "
            "after the checkpoint; the resume recomputes those steps"
        )
    entries = [e for e in ledger.entries() if e.step <= keep_through_step]
    with publishing_file(path) as handle:
        for entry in entries:
            handle.write(canonical_dumps(dict(entry.fields), indent=None).encode("utf-8"))
    return len(entries)

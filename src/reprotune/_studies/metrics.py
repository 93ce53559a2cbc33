"""What one run of a study measured: its final validation loss and the metrics of its evaluations.

- ``final_val_loss``: the record's ``outputs.final_val_loss`` (exact ``float.hex`` bits).
- Evaluations (``reprotune eval``): every ``RUN_DIR/evals/<id>/eval.json`` whose ``metrics`` maps
  names to numbers, named ``<split>/<name>`` (``test/bleu``; nested numbers as ``test/bleu.score``).
  They are read defensively: an eval that is unfinished, unreadable or without numbers is left
  out and said why; when two evals of one run give one name different values, the later (by
  directory name) is kept apart as ``<split>/<name>@<eval id>``.

Never imports torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from reprotune._eval.layout import EVAL_FILE, EVALS_DIR, EvalLayout, evals_dir

FINAL_VAL_LOSS: Final = "final_val_loss"


def run_metrics(run_dir: Path, record: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
    """The metrics of the completed run in ``run_dir`` (its record already read).

    Returns:
        ``(metrics, notes)``: name -> value, and one line for each thing left out and why.
    """
    metrics: dict[str, float] = {}
    notes: list[str] = []
    outputs = record.get("outputs")
    raw = outputs.get(FINAL_VAL_LOSS) if isinstance(outputs, Mapping) else None
    if isinstance(raw, str):
        try:
            metrics[FINAL_VAL_LOSS] = float.fromhex(raw)
        except ValueError:
            notes.append(f"{run_dir.name}: outputs.final_val_loss {raw!r} is not a float.hex value")
    else:
        notes.append(f"{run_dir.name}: no final validation loss in its record")
    evals = evals_dir(run_dir)
    if evals.is_dir():
        for eval_dir in sorted(p for p in evals.iterdir() if p.is_dir()):
            _read_eval(eval_dir, metrics, notes)
    return metrics, notes


def _read_eval(eval_dir: Path, metrics: dict[str, float], notes: list[str]) -> None:
    where = f"{eval_dir.parent.parent.name}/{EVALS_DIR}/{eval_dir.name}/{EVAL_FILE}"
    try:
        data = json.loads(EvalLayout(eval_dir).eval_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        notes.append(f"{where}: left out, unreadable ({type(exc).__name__})")
        return
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), Mapping):
        notes.append(f"{where}: left out, no metrics mapping")
        return
    status = data.get("status", "completed")
    if status != "completed":
        notes.append(f"{where}: left out, status {status!r}")
        return
    found: dict[str, float] = {}
    _numbers(data["metrics"], _split_name(data.get("split")) + "/", found)
    if not found:
        notes.append(f"{where}: left out, no numeric metrics")
    for name, value in sorted(found.items()):
        if name in metrics and metrics[name] != value:
            name = f"{name}@{eval_dir.name}"
        metrics.setdefault(name, value)


def _split_name(split: Any) -> str:
    if isinstance(split, str) and split:
        return split
    if isinstance(split, Mapping) and isinstance(split.get("name"), str) and split["name"]:
        return str(split["name"])
    return "eval"


def _numbers(value: Any, prefix: str, out: dict[str, float]) -> None:
    """Every finite number in ``value`` (nested mappings joined with dots) into ``out``."""
    if isinstance(value, Mapping):
        for key in sorted(value, key=str):
            joiner = "" if prefix.endswith("/") else "."
            _numbers(value[key], f"{prefix}{joiner}{key}", out)
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        out[prefix] = float(value)

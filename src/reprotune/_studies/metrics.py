"""What one run of a study measured: its final validation loss and the metrics of its evaluations.

- ``final_val_loss``: the record's ``outputs.final_val_loss`` (exact ``float.hex`` bits).
- Evaluations (``reprotune eval``): every ``RUN_DIR/evals/<id>/eval.json`` whose ``metrics`` maps
  names to numbers, named ``<split>/<name>`` (``test/bleu``; nested numbers as ``test/bleu.score``).
  They are read defensively: an eval that is unfinished, unreadable or without numbers is left
  out and said why, and so is one of the base model alone (``--base-only``: it does not measure
  the run). Each metric carries its eval's setup (rows, decoding, prompt): a study summarises a
  metric only when every run's setup is the same. When two evals of one run give one name, one
  over the whole split comes first; the other is kept apart as ``<split>/<name>@<eval id>`` when
  its value or setup differs.

Never imports torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from reprotune._eval.layout import EVAL_FILE, EVALS_DIR, EvalLayout, evals_dir
from reprotune._jsonio import sha256_bytes

FINAL_VAL_LOSS: Final = "final_val_loss"


def run_metrics(
    run_dir: Path, final_val_loss: str | None
) -> tuple[dict[str, float], list[str], dict[str, str]]:
    """The metrics of the completed run in ``run_dir``: its record's ``outputs.final_val_loss``
    (``float.hex``, or None where none was measured) and its evaluations.

    Returns:
        ``(metrics, notes, setups)``: name -> value, one line for each thing left out and why, and
        each eval metric's setup (:func:`eval_setup`).
    """
    metrics: dict[str, float] = {}
    notes: list[str] = []
    setups: dict[str, str] = {}
    if final_val_loss is not None:
        try:
            value = float.fromhex(final_val_loss)
        except ValueError:
            notes.append(
                f"{run_dir.name}: outputs.final_val_loss {final_val_loss!r} is not a float.hex value"
            )
        else:
            if math.isfinite(value):
                metrics[FINAL_VAL_LOSS] = value
            else:  # a run that diverged: no number a mean or a test can take
                notes.append(f"{run_dir.name}: final validation loss {value}, the run diverged: left out")
    else:
        notes.append(f"{run_dir.name}: no final validation loss in its record")
    evals = evals_dir(run_dir)
    if evals.is_dir():
        read = [(d, _read_eval(d, notes)) for d in sorted(p for p in evals.iterdir() if p.is_dir())]
        usable = [(d, data) for d, data in read if data is not None]
        # the whole split's first, then by setup: the same choice in every run, whatever order
        # the evals were made in (their directory names start with the time)
        for eval_dir, data in sorted(
            usable, key=lambda e: (not _whole_split(e[1]), eval_setup(e[1]), e[0].name)
        ):
            _add_metrics(eval_dir, data, metrics, setups, notes)
    return metrics, notes, setups


def _read_eval(eval_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    """The eval's ``eval.json`` when it holds finished metrics of the run, else None and a note."""
    where = _where(eval_dir)
    try:
        data = json.loads(EvalLayout(eval_dir).eval_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        notes.append(f"{where}: left out, unreadable ({type(exc).__name__})")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("metrics"), Mapping):
        notes.append(f"{where}: left out, no metrics mapping")
        return None
    status = data.get("status", "completed")
    if status != "completed":
        notes.append(f"{where}: left out, status {status!r}")
        return None
    if data.get("base_only") is True:
        notes.append(f"{where}: left out, an eval of the base model alone (--base-only), not of this run")
        return None
    return data


def _add_metrics(
    eval_dir: Path,
    data: Mapping[str, Any],
    metrics: dict[str, float],
    setups: dict[str, str],
    notes: list[str],
) -> None:
    found: dict[str, float] = {}
    _numbers(data["metrics"], _split_name(data.get("split")) + "/", found)
    if not found:
        notes.append(f"{_where(eval_dir)}: left out, no numeric metrics")
    setup = eval_setup(data)
    for name, value in sorted(found.items()):
        if name in metrics and (metrics[name] != value or setups.get(name) != setup):
            # another setup: named by it, so every run's eval of that setup is one metric; the
            # same setup giving another value is this eval's own (named by its directory)
            apart = f"{name}@{sha256_bytes(setup.encode())[:8]}"
            taken = setups[name] == setup or (apart in metrics and metrics[apart] != value)
            name = f"{name}@{eval_dir.name}" if taken else apart
        if name not in metrics:
            metrics[name], setups[name] = value, setup


def _where(eval_dir: Path) -> str:
    return f"{eval_dir.parent.parent.name}/{EVALS_DIR}/{eval_dir.name}/{EVAL_FILE}"


def _whole_split(data: Mapping[str, Any]) -> bool:
    split = data.get("split")
    if not isinstance(split, Mapping):
        return True
    return split.get("n_rows") == split.get("split_rows") or split.get("split_rows") is None


def eval_setup(data: Mapping[str, Any]) -> str:
    """What an eval's numbers depend on besides the run: the split and its rows (all, or the
    first N), and the generation settings (decoding, sampling parameters, new tokens, prompt).
    Not the rows' identity (a study that varies the split evaluates other rows by design), nor the
    eval seed (derived from each run's seeds)."""
    split, gen = _mapping(data.get("split")), _mapping(data.get("generation"))
    prompt = _mapping(gen.get("prompt"))
    rows = "all rows" if _whole_split(data) else f"first {split.get('n_rows')} rows"
    parts = [f"{_split_name(data.get('split'))} {rows}", str(gen.get("decoding"))]
    parts += [f"{k} {gen[k]}" for k in ("temperature", "top_k", "top_p") if gen.get(k) is not None]
    parts.append(f"{gen.get('max_new_tokens')} new tokens")
    parts += [f"{k} {prompt[k]!r}" for k in sorted(prompt) if k != "truncation"]
    return ", ".join(parts)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


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

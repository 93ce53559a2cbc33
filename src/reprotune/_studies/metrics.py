"""What the runs of a study measured: the final validation loss and the metrics of evaluations.

- ``final_val_loss``: the record's ``outputs.final_val_loss`` (exact ``float.hex`` bits).
- Evaluations (``reprotune eval``): every ``RUN_DIR/evals/<id>/eval.json`` whose ``metrics`` maps
  names to numbers, named ``<split>/<name>`` (``test/bleu``; nested numbers as ``test/bleu.score``).
  They are read defensively: an eval that is unfinished, unreadable or without numbers is left
  out and said why, and so is one of the base model alone (``--base-only``: it does not measure
  the run). Each metric carries its eval's setup (rows, decoding, prompt): a study summarises a
  metric only when every run's setup is the same.

Names are chosen for the study, not run by run (:func:`name_metrics`): of the setups one name was
measured with, the one every run has takes the plain name, so one run's extra eval of another
setup cannot take it from the metric all runs share. The others are kept apart as
``<split>/<name>@<setup id>`` (8 hex of the setup's sha256: each run's eval of one setup is one
metric), or ``<split>/<name>@<eval id>`` for a second eval of one setup that gives another value.

Never imports torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from reprotune._eval.layout import EVAL_FILE, EVALS_DIR, EvalLayout, evals_dir
from reprotune._jsonio import sha256_bytes

FINAL_VAL_LOSS: Final = "final_val_loss"


@dataclass(frozen=True)
class Measured:
    """One number of one evaluation of a run, before the study names it."""

    name: str
    """``<split>/<name>``: the plain name."""
    value: float
    setup: str
    """:func:`eval_setup` of its eval."""
    eval_id: str
    whole: bool
    """Measured over the whole split (not its first rows)."""

    @property
    def order(self) -> tuple[bool, str, str]:
        """Whole split first, then by setup, then by eval id: the same order in every run, whatever
        order its evals were made in (their directory names start with the time)."""
        return (not self.whole, self.setup, self.eval_id)


@dataclass(frozen=True)
class RunMeasures:
    """What one run measured (:func:`read_run`), and one line for each thing left out and why."""

    final_val_loss: float | None
    evals: tuple[Measured, ...]
    notes: tuple[str, ...]


def run_metrics(
    run_dir: Path, final_val_loss: str | None
) -> tuple[dict[str, float], list[str], dict[str, str]]:
    """The metrics of the completed run in ``run_dir`` named as a study of this one run would
    name them (:func:`read_run`, :func:`name_metrics`).

    Returns:
        ``(metrics, notes, setups)``: name -> value, one line for each thing left out and why, and
        each eval metric's setup (:func:`eval_setup`).
    """
    measures = read_run(run_dir, final_val_loss)
    ((metrics, setups),) = name_metrics([measures])
    return metrics, list(measures.notes), setups


def read_run(run_dir: Path, final_val_loss: str | None) -> RunMeasures:
    """What the completed run in ``run_dir`` measured: its record's ``outputs.final_val_loss``
    (``float.hex``, or None where none was measured) and every number of its evaluations."""
    loss: float | None = None
    notes: list[str] = []
    if final_val_loss is not None:
        try:
            value = float.fromhex(final_val_loss)
        except ValueError:
            notes.append(
                f"{run_dir.name}: outputs.final_val_loss {final_val_loss!r} is not a float.hex value"
            )
        else:
            if math.isfinite(value):
                loss = value
            else:  # a run that diverged: no number a mean or a test can take
                notes.append(f"{run_dir.name}: final validation loss {value}, the run diverged: left out")
    else:
        notes.append(f"{run_dir.name}: no final validation loss in its record")
    evals: list[Measured] = []
    directory = evals_dir(run_dir)
    if directory.is_dir():
        for eval_dir in sorted(p for p in directory.iterdir() if p.is_dir()):
            data = _read_eval(eval_dir, notes)
            if data is not None:
                evals += _measured(eval_dir, data, notes)
    return RunMeasures(loss, tuple(evals), tuple(notes))


def name_metrics(runs: Sequence[RunMeasures]) -> list[tuple[dict[str, float], dict[str, str]]]:
    """Each run's metrics by the names the study gives them, and each eval metric's setup.

    Per plain name: the setup every run measured it with takes the plain name (the first such by
    :attr:`Measured.order` when several are); where no setup is in every run, each run's first
    takes it, so that a summary says the runs' evaluations differ. Every other setup is named
    ``<name>@<setup id>``; a second eval of one setup giving another value ``<name>@<eval id>``.

    Returns:
        ``(metrics, setups)`` per run, in the order of ``runs``.
    """
    named: list[tuple[dict[str, float], dict[str, str]]] = [
        ({FINAL_VAL_LOSS: r.final_val_loss} if r.final_val_loss is not None else {}, {}) for r in runs
    ]
    for name in sorted({m.name for r in runs for m in r.evals}):
        each = [sorted((m for m in r.evals if m.name == name), key=lambda m: m.order) for r in runs]
        shared = set.intersection(*({m.setup for m in measured} for measured in each))
        for (metrics, setups), measured in zip(named, each, strict=True):
            _name_one(name, measured, shared, metrics, setups)
    return named


def _name_one(
    name: str, measured: list[Measured], shared: set[str], metrics: dict[str, float], setups: dict[str, str]
) -> None:
    """Name one run's evals of ``name`` (in :attr:`Measured.order`) into ``metrics`` and ``setups``."""
    if not measured:
        return
    plain = next((m.setup for m in measured if m.setup in shared), measured[0].setup)
    for m in sorted(measured, key=lambda m: m.setup != plain):  # stable: the order within stays
        key = name if m.setup == plain else f"{name}@{sha256_bytes(m.setup.encode())[:8]}"
        if key in metrics and metrics[key] != m.value:
            key = f"{name}@{m.eval_id}"  # the same setup giving another value: this eval's own
        if key not in metrics:  # else the same number twice: one metric
            metrics[key], setups[key] = m.value, m.setup


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


def _measured(eval_dir: Path, data: Mapping[str, Any], notes: list[str]) -> list[Measured]:
    found: dict[str, float] = {}
    _numbers(data["metrics"], _split_name(data.get("split")) + "/", found)
    if not found:
        notes.append(f"{_where(eval_dir)}: left out, no numeric metrics")
    setup, whole = eval_setup(data), _whole_split(data)
    return [Measured(name, value, setup, eval_dir.name, whole) for name, value in sorted(found.items())]


def _where(eval_dir: Path) -> str:
    return f"{eval_dir.parent.parent.name}/{EVALS_DIR}/{eval_dir.name}/{EVAL_FILE}"


def _whole_split(data: Mapping[str, Any]) -> bool:
    split = data.get("split")
    if not isinstance(split, Mapping):
        return True
    return split.get("n_rows") == split.get("split_rows") or split.get("split_rows") is None


def eval_setup(data: Mapping[str, Any]) -> str:
    """What an eval's numbers depend on besides the run: the split and its rows (all, N drawn with
    the eval seed, or, in an eval made before that rule, the first N), and the generation settings
    (decoding, sampling parameters, new tokens, prompt). Not the rows' identity (a study that
    varies the split or the eval seed evaluates other rows by design), nor the eval seed (derived
    from each run's seeds)."""
    split, gen = _mapping(data.get("split")), _mapping(data.get("generation"))
    prompt = _mapping(gen.get("prompt"))
    n = split.get("n_rows")
    drawn = (
        f"{n} rows drawn with the eval seed"
        if isinstance(split.get("sample"), Mapping)
        else f"first {n} rows"
    )
    rows = "all rows" if _whole_split(data) else drawn
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

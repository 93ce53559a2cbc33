"""The eval directory's two files, written and read here only: ``eval.json`` and ``predictions.jsonl``.

``eval.json`` (schema ``reprotune/eval``, version 1) is canonical JSON (docs/eval.md lists every
key). Its ``metrics`` is a flat mapping of corpus metric name to number, which seed studies read.
``predictions.jsonl`` holds one canonical compact JSON object per row, in evaluation order:
``index``, ``row_sha256``, ``prompt_ids_sha256``, ``prompt_tokens``, ``output_ids``,
``output_ids_sha256``, ``stopped_at_eos``, ``text``, ``scores``. It holds nothing that depends on
time, place or batch size, so two evals of the same thing give the same bytes.

Readers refuse another schema or version, malformed lines, and a ``predictions.jsonl`` that is not
the file ``eval.json`` lists (its ``predictions`` section is required) or does not hold the rows its
``split`` names (``InputError`` naming the file, line and fix). Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from reprotune._documents import jsonl_lines, read_json_file, validated_line
from reprotune._errors import InputError
from reprotune._eval.layout import PREDICTIONS, EvalLayout
from reprotune._formats import EVAL
from reprotune._jsonio import canonical_dumps, canonical_sha256, sha256_bytes


def ids_sha256(ids: Sequence[int]) -> str:
    """sha256 of a token-id list as canonical compact JSON (``[1,2,3]``)."""
    return canonical_sha256([int(i) for i in ids])


def predictions_bytes(lines: Sequence[Mapping[str, Any]]) -> bytes:
    """``predictions.jsonl``'s bytes: one canonical compact JSON object per line."""
    return "".join(canonical_dumps(dict(line), indent=None) for line in lines).encode("utf-8")


class Prediction(BaseModel):
    """One line of ``predictions.jsonl`` (extra keys are kept, as a later version may add some)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    index: int
    row_sha256: str
    prompt_ids_sha256: str
    prompt_tokens: int
    output_ids: tuple[int, ...]
    output_ids_sha256: str
    stopped_at_eos: bool
    text: str
    scores: dict[str, float]


@dataclass(frozen=True)
class EvalDir:
    """An opened eval directory: its record and its predictions, checked."""

    path: Path
    record: Mapping[str, Any]
    predictions: tuple[Prediction, ...]

    @property
    def eval_id(self) -> str:
        value = self.record.get("eval_id")
        return value if isinstance(value, str) and value else self.path.name

    def section(self, key: str) -> Mapping[str, Any]:
        """A top-level section of ``eval.json`` (empty when absent)."""
        value = self.record.get(key)
        return value if isinstance(value, Mapping) else {}

    @property
    def metrics(self) -> Mapping[str, float]:
        return self.section("metrics")


def is_eval_dir(path: Path) -> bool:
    """Whether ``path`` is an eval directory (it holds ``eval.json``)."""
    return EvalLayout(Path(path)).is_eval_dir()


def open_eval_dir(path: str | Path) -> EvalDir:
    """Read and check the eval directory at ``path``.

    Raises:
        InputError: not an eval directory, a file missing or malformed (naming file and line), a
            ``predictions.jsonl`` that is not the one ``eval.json`` lists (its ``predictions``:
            sha256 and row count, required) or does not hold the rows its ``split`` names.
        SchemaVersionError: ``eval.json`` is not a ``reprotune/eval`` of a known version.
    """
    paths = EvalLayout(Path(path))
    fix = "pass a directory written by `reprotune eval` (it holds eval.json and predictions.jsonl)"
    if not paths.root.is_dir():
        raise InputError(f"no such eval directory: {paths.root}", source=str(paths.root), fix=fix)
    record = read_json_file(paths.eval_file, what="eval record", fix=fix)
    EVAL.check(
        record,
        source=str(paths.eval_file),
        fix=fix,
        version_fix="read it with the reprotune version that wrote it (reprotune_version in the file)",
    )
    _check_sections(record, paths.eval_file, fix)
    raw = _predictions_file(paths.predictions)
    predictions = _parsed(raw, paths.predictions)
    _check_predictions(record, paths, predictions, sha256_bytes(raw))
    return EvalDir(paths.root, record, predictions)


def _check_sections(record: Mapping[str, Any], path: Path, fix: str) -> None:
    """The sections a comparison reads have their shapes: a damaged ``predictions`` skipped the
    check of the file it lists, a metric that is not a number dropped its difference, and a
    ``generation`` that is not a mapping named differences it does not hold (each compared as
    IDENTICAL)."""
    shapes: list[tuple[str, Any, tuple[type, ...]]] = [
        (key, record[key], (Mapping,)) for key in ("predictions", "generation", "metrics") if key in record
    ]
    listed = record.get("predictions")
    if isinstance(listed, Mapping):
        shapes += [
            (f"predictions.{k}", listed[k], t)
            for k, t in (("sha256", (str,)), ("n_rows", (int,)))
            if k in listed
        ]
    metrics = record.get("metrics")
    if isinstance(metrics, Mapping):
        shapes += [(f"metrics.{name}", value, (int, float, type(None))) for name, value in metrics.items()]
    for key, value, types in shapes:
        if not isinstance(value, types) or isinstance(value, bool):
            raise InputError(
                f"eval.json's {key} is {value!r:.60}, not {' or '.join(t.__name__ for t in types)}",
                source=f"{path} (key {key})",
                fix=fix,
            )


def _check_predictions(
    record: Mapping[str, Any], paths: EvalLayout, predictions: tuple[Prediction, ...], sha256: str
) -> None:
    """The predictions are the ones ``eval.json`` lists (its ``predictions``: sha256 and row count,
    required), each row once, and the rows its ``split`` names (count, indices in order, row
    hashes): an emptied or cut file, or one whose listing was deleted with it, compared as it was
    read ("IDENTICAL, 0 rows")."""
    path, fix = paths.predictions, _remake_fix(record)
    listed = _listing(record, paths.eval_file, len(predictions), fix)
    if sha256 != listed["sha256"]:
        raise InputError(
            f"{PREDICTIONS} is not the file eval.json lists (sha256 {listed['sha256'][:12]}..., "
            f"{listed['n_rows']} rows; it holds {len(predictions)}): it was changed or cut",
            source=str(path),
            fix=fix,
        )
    if listed["n_rows"] != len(predictions):
        raise InputError(
            f"{PREDICTIONS} holds {len(predictions)} rows, eval.json lists {listed['n_rows']}",
            source=str(path),
            fix=fix,
        )
    seen: set[int] = set()
    for number, prediction in enumerate(predictions, start=1):
        if prediction.index in seen:
            raise InputError(
                f"row {prediction.index} is in {PREDICTIONS} twice", source=f"{path}:{number}", fix=fix
            )
        seen.add(prediction.index)
    _check_split_rows(record, paths, predictions, fix)


def _remake_fix(record: Mapping[str, Any]) -> str:
    run = record.get("run")
    run_dir = run.get("run_dir") if isinstance(run, Mapping) else None
    again = f"reprotune eval {run_dir}" if isinstance(run_dir, str) and run_dir else "reprotune eval RUN_DIR"
    return (
        f"make the eval again (`{again}`, with the settings eval.json records), or restore the eval "
        "directory from a copy"
    )


def _listing(record: Mapping[str, Any], eval_file: Path, held: int, fix: str) -> Mapping[str, Any]:
    """``eval.json``'s ``predictions`` with its ``sha256`` and ``n_rows`` (their types are checked
    by :func:`_check_sections`); refused when absent, as the file could not be checked."""
    listed = record.get("predictions")
    if isinstance(listed, Mapping) and "sha256" in listed and "n_rows" in listed:
        return listed
    missing = "predictions"
    if isinstance(listed, Mapping):
        missing += ".sha256" if "sha256" not in listed else ".n_rows"
    split = record.get("split")
    said = split.get("n_rows") if isinstance(split, Mapping) else None
    raise InputError(
        f"eval.json has no {missing}, so {PREDICTIONS} (it holds {held} rows) cannot be checked "
        f"against it; the record's split lists {said if isinstance(said, int) else 'no'} rows",
        source=f"{eval_file} (key {missing})",
        fix=fix,
    )


def _check_split_rows(
    record: Mapping[str, Any], paths: EvalLayout, predictions: tuple[Prediction, ...], fix: str
) -> None:
    """The predictions' rows are the rows ``eval.json``'s ``split`` names, in its order."""
    split = record.get("split")
    rows = split.get("rows") if isinstance(split, Mapping) else None
    if not isinstance(rows, list) or not all(
        isinstance(r, Mapping) and type(r.get("index")) is int and isinstance(r.get("sha256"), str)
        for r in rows
    ):
        raise InputError(
            f"eval.json's split.rows is {rows!r:.60}, not the list of the rows evaluated "
            "(each its index and sha256)",
            source=f"{paths.eval_file} (key split.rows)",
            fix=fix,
        )
    said = split.get("n_rows") if isinstance(split, Mapping) else None
    held = [(p.index, p.row_sha256) for p in predictions]
    named = [(int(r["index"]), str(r["sha256"])) for r in rows]
    if said == len(named) == len(held) and held == named:
        return
    if said != len(named):
        what = f"split.n_rows is {said!r}, split.rows lists {len(named)} rows"
    elif len(held) != len(named):
        what = f"it holds {len(held)} rows, the split lists {len(named)}"
    else:
        line, (got, want) = next(
            (n, pair) for n, pair in enumerate(zip(held, named, strict=True), 1) if pair[0] != pair[1]
        )
        what = (
            f"its line {line} is row {got[0]} (row sha256 {got[1][:12]}...), the split lists row "
            f"{want[0]} (row sha256 {want[1][:12]}...) there"
        )
    raise InputError(
        f"{PREDICTIONS} does not hold the rows eval.json's split lists: {what}",
        source=str(paths.predictions),
        fix=fix,
    )


def read_predictions(path: Path) -> tuple[Prediction, ...]:
    """Every line of a ``predictions.jsonl``, checked.

    Raises:
        InputError: the file is missing, or a line is not a complete prediction (naming the line).
    """
    return _parsed(_predictions_file(path), path)


_READ_FIX = "restore the eval directory from a copy, or run the eval again"


def _predictions_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputError(
            f"the eval directory has no {PREDICTIONS}", source=str(path), fix=_READ_FIX
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read {PREDICTIONS}: {exc}", source=str(path), fix=_READ_FIX) from None


def _parsed(raw: bytes, path: Path) -> tuple[Prediction, ...]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {PREDICTIONS}: {exc}", source=str(path), fix=_READ_FIX) from None
    return tuple(
        validated_line(Prediction, line, what="prediction", source=f"{path}:{number}", fix=_READ_FIX)
        for number, line in enumerate(jsonl_lines(text), start=1)
    )

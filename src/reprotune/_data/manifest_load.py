"""The strict loader of a split manifest: :func:`load_manifest` checks every key, the index lists
and the row hashes (inline or in the sidecar the manifest names), and names every problem at once.

Loading never re-runs the split. What it accepts is what ``_data.manifest.write_manifest`` writes;
the format is documented in docs/manifest.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprotune._data.manifest_format import (
    ALGORITHM_VERSION,
    LISTS,
    SPLITS,
    ClassSummary,
    Decision,
    Manifest,
    Strategy,
)
from reprotune._data.manifest_lists import index_arrays
from reprotune._data.row_hashes import RowHashes
from reprotune._documents import read_json_file, validation_problems
from reprotune._errors import InputError
from reprotune._formats import SPLIT_MANIFEST
from reprotune._jsonio import sha256_bytes

_FIX = "make it again with `reprotune split` (manifests are not meant to be edited by hand)"


def read_manifest_json(path: Path) -> Any:
    """The JSON of the manifest file at ``path``, unchecked.

    Raises:
        InputError: the file is missing, unreadable or not JSON.
    """
    return read_json_file(
        path, what="manifest", fix="pass a manifest written by `reprotune split DATA --out MANIFEST`"
    )


class _Shape(BaseModel):
    """What every key of a manifest must be (strict JSON types: ``true`` is no integer)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")


class _Dataset(_Shape):
    source: str
    format: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    n_rows: int = Field(ge=0)
    columns: list[str]


class _Ratios(_Shape):
    train: float
    validation: float
    test: float


class _Class(_Shape):
    value: Any
    n_rows: int
    train: int
    validation: int
    test: int
    decision: Decision


class _Algorithm(_Shape):
    version: int = ALGORITHM_VERSION


class _ManifestFile(_Shape):
    """A manifest's keys; the index lists (``train`` ..., large) are checked with NumPy instead."""

    dataset: _Dataset
    seed: int = Field(ge=0)
    ratios: _Ratios
    strategy: Strategy
    stratify_by: str | None
    group_by: str | None
    rare_class_policy: str
    classes: list[_Class]
    groups: dict[str, int] | None
    warnings: list[str]
    algorithm: _Algorithm
    row_hashes: dict[str, Any]


class _Checker:
    """Collects the problems of a manifest's contents, so the user sees them all at once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []

    def error(self) -> InputError:
        body = "; ".join(self.problems)
        return InputError(
            f"invalid manifest ({len(self.problems)} problem(s)): {body}", source=self.source, fix=_FIX
        )

    def raise_if_any(self) -> None:
        if self.problems:
            raise self.error()


def load_manifest(path: str | Path) -> Manifest:
    """Load and validate a manifest written by ``_data.manifest.write_manifest``; never re-runs the split.

    Checks the schema and version, every field's type, that the index lists are ascending,
    in range, disjoint and cover every row once, that the keys agree with each other, and the
    sidecar's sha256 when there is one. Every problem of the keys and of the index lists is named
    in one error: the lists are checked against ``dataset.n_rows`` whenever that can be read. The
    row hashes are checked once the rest is sound (a missing or altered sidecar is an error of its
    own).

    Raises:
        InputError: missing file, not JSON (with line and column), or any invalid field.
        SchemaVersionError: a schema version this version of reprotune cannot read.
    """
    path = Path(path)
    obj = _manifest_object(path)
    check = _Checker(str(path))
    shape = _shape(obj, check)
    n_rows = shape.dataset.n_rows if shape is not None else _stated_rows(obj)
    arrays = index_arrays(obj, LISTS, n_rows, check.problems)
    if arrays is not None:
        _check_consistent(obj, arrays, check)
    if shape is None or arrays is None:
        raise check.error()
    dataset = shape.dataset
    row_hashes = _load_row_hashes(shape.row_hashes, path, dataset.n_rows, check)
    check.raise_if_any()
    return Manifest(
        dataset_source=dataset.source,
        dataset_format=dataset.format,
        dataset_sha256=dataset.sha256,
        n_rows=dataset.n_rows,
        columns=tuple(dataset.columns),
        seed=shape.seed,
        ratios=(shape.ratios.train, shape.ratios.validation, shape.ratios.test),
        strategy=shape.strategy,
        stratify_by=shape.stratify_by,
        group_by=shape.group_by,
        rare_class_policy=shape.rare_class_policy,
        index_arrays=arrays,
        row_hashes=row_hashes,
        classes=tuple(
            ClassSummary(c.value, c.n_rows, c.train, c.validation, c.test, c.decision) for c in shape.classes
        ),
        groups=shape.groups,
        warnings=tuple(shape.warnings),
        algorithm_version=shape.algorithm.version,
    )


def _shape(obj: dict[str, Any], check: _Checker) -> _ManifestFile | None:
    """The manifest's keys as their model, or None with every problem in ``check``."""
    try:
        return _ManifestFile.model_validate(obj)
    except ValidationError as exc:
        check.problems.extend(validation_problems(exc))
        return None


def _stated_rows(obj: Mapping[str, Any]) -> int | None:
    """``dataset.n_rows`` where it is a count though other keys are invalid, else None."""
    dataset = obj.get("dataset")
    n_rows = dataset.get("n_rows") if isinstance(dataset, dict) else None
    return n_rows if isinstance(n_rows, int) and not isinstance(n_rows, bool) and n_rows >= 0 else None


_STRATEGY_COLUMNS = {"stratified": "stratify_by", "grouped": "group_by"}


def _check_consistent(obj: Mapping[str, Any], arrays: Mapping[str, Any], check: _Checker) -> None:
    """What the keys say of each other: ``sizes`` the lengths of the lists, the strategy its
    column, the ratios a sum of 1 (a hand-edited manifest contradicts itself here). Read from the
    JSON, so these are named with the keys' other problems; a key of the wrong type is left to the
    schema to name."""
    given = obj.get("sizes")
    sizes: Mapping[str, Any] = given if isinstance(given, dict) else {}
    for name in LISTS:
        listed = len(arrays[name])
        if name in sizes and sizes[name] != listed:
            check.problems.append(f"sizes.{name} is {sizes[name]!r}, but {name!r} lists {listed} rows")
    strategy = obj.get("strategy")
    needs = _STRATEGY_COLUMNS.get(strategy) if isinstance(strategy, str) else None
    if needs is not None and needs in obj and obj[needs] is None:
        check.problems.append(f"strategy {strategy!r} without its column ({needs} is null)")
    given = obj.get("ratios")
    shares = [given.get(name) for name in SPLITS] if isinstance(given, dict) else []
    ratios = [float(r) for r in shares if isinstance(r, int | float) and not isinstance(r, bool)]
    if len(ratios) == 3 and (any(not 0 <= r <= 1 for r in ratios) or abs(sum(ratios) - 1) > 1e-9):
        check.problems.append(f"ratios {ratios} are not fractions that sum to 1")


def _manifest_object(path: Path) -> dict[str, Any]:
    """The manifest's JSON object, of this schema and version (refused otherwise)."""
    return SPLIT_MANIFEST.check(
        read_manifest_json(path),
        source=str(path),
        fix="pass a manifest written by `reprotune split DATA --out MANIFEST`",
        version_fix="use the reprotune version that wrote it, or make it again with `reprotune split`",
    )


def _load_row_hashes(info: Mapping[str, Any], path: Path, n_rows: int, check: _Checker) -> RowHashes:
    empty = RowHashes(np.zeros((0, 32), dtype=np.uint8), np.zeros(0, dtype=np.uint8))
    if "inline" in info:
        hexes = info["inline"]
        if not isinstance(hexes, list) or len(hexes) != n_rows:
            check.problems.append(f"row_hashes.inline is not a list of {n_rows} hex digests")
            return empty
        bad = next((h for h in hexes if not (isinstance(h, str) and len(h) == 64)), None)
        if bad is not None:
            check.problems.append(f"row_hashes.inline holds {bad!r}, not a 64-digit hex sha256")
            return empty
        try:
            return RowHashes.from_hex(hexes)
        except ValueError:
            check.problems.append("row_hashes.inline holds a value that is not hex")
            return empty
    name = info.get("file")
    if not isinstance(name, str) or Path(name).name != name:
        check.problems.append(f"row_hashes names neither 'inline' hashes nor a sidecar file: {info!r}")
        return empty
    side = path.parent / name
    if not side.is_file():
        raise InputError(
            f"the row-hash sidecar {name!r} named by the manifest does not exist",
            source=str(side),
            fix=f"keep {name} next to the manifest (copy both together), or make the manifest again",
        )
    data = side.read_bytes()
    if sha256_bytes(data) != info.get("file_sha256"):
        raise InputError(
            f"the row-hash sidecar {name!r} has sha256 {sha256_bytes(data)[:12]}..., the manifest "
            f"says {str(info.get('file_sha256'))[:12]}...",
            source=str(side),
            fix="restore the sidecar that was written with this manifest, or make the manifest again",
        )
    hashes = RowHashes.from_bytes(data, source=str(side))
    if len(hashes) != n_rows:
        check.problems.append(f"the sidecar holds {len(hashes)} row hashes for {n_rows} rows")
    return hashes

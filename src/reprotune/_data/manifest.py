"""The split manifest: a frozen, schema-versioned record of a split, written as canonical JSON.

The manifest is the truth about a split: loading one never re-runs the algorithm. Its bytes are
exactly ``_jsonio.canonical_dumps(manifest.to_json_obj())``, so loading a manifest and writing it
again gives the same bytes. The split index lists of a large dataset are rendered by a vectorised
writer that produces those same bytes (a test holds it to that). Per-row hashes live in the JSON
for up to :data:`INLINE_ROW_HASH_LIMIT` rows, and above that in a sidecar file next to the
manifest, named in it with its sha256. The format is documented in docs/manifest.md.

This module is over 400 lines on purpose: it is the format's one owner (the typed manifest, its
bytes, writing with the sidecar, and the strict loader), so what is written and what is accepted
cannot drift apart.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reprotune._data.index_render import render_into, rendered_size
from reprotune._data.manifest_lists import index_arrays
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import canonical_value
from reprotune._documents import read_json_file, validation_problems
from reprotune._errors import InputError
from reprotune._formats import SPLIT_MANIFEST
from reprotune._jsonio import canonical_dumps, sha256_bytes, sha256_file, write_bytes_atomic

ALGORITHM = "reprotune-split"
ALGORITHM_VERSION = 1
SPLITS: tuple[str, str, str] = ("train", "validation", "test")
LISTS: tuple[str, ...] = (*SPLITS, "dropped")
# Above this many rows, per-row hashes go to a sidecar file (a JSON list of 10M hex strings
# would be 670 MB; the binary sidecar of a 10M-row, 50-class table is 10 MB).
INLINE_ROW_HASH_LIMIT = 100_000
SIDECAR_SUFFIX = ".rowhashes"
_FIX = "make it again with `reprotune split` (manifests are not meant to be edited by hand)"
# Up to this many rows, manifests are dumped by canonical_dumps alone.
_SMALL = 20_000

Strategy = Literal["random", "stratified", "grouped"]
Decision = Literal["split", "train", "drop"]


@dataclass(frozen=True)
class ClassSummary:
    """One class of a stratified split: its value, size, rows per split and what was decided.

    ``decision`` is ``split`` (spread over the splits), or for a class too small to reach every
    split, the rare-class policy applied: ``train`` (all rows in train) or ``drop`` (no split).
    ``value`` is written as its canonical JSON form (``_data.table.canonical_value``: a date as its
    ISO text, bytes as ``{"$bytes": ...}``), as the row hashes see it.
    """

    value: Any
    n_rows: int
    train: int
    validation: int
    test: int
    decision: Decision

    def to_json_obj(self) -> dict[str, Any]:
        """The JSON object of this class in the manifest."""
        return {
            "value": canonical_value(self.value),
            "n_rows": self.n_rows,
            "train": self.train,
            "validation": self.validation,
            "test": self.test,
            "decision": self.decision,
        }


@dataclass(frozen=True, eq=False)
class Manifest:
    """A split: which rows of which data are in train, validation and test, and how it was made.

    ``index_arrays`` holds each list (``train``, ``validation``, ``test``, ``dropped``) as a sorted
    int64 array; ``indices`` gives the three splits as Python lists.
    """

    dataset_source: str
    dataset_format: str
    dataset_sha256: str
    n_rows: int
    columns: tuple[str, ...]
    seed: int
    ratios: tuple[float, float, float]
    strategy: Strategy
    stratify_by: str | None
    group_by: str | None
    rare_class_policy: str
    index_arrays: Mapping[str, np.ndarray]
    row_hashes: RowHashes
    classes: tuple[ClassSummary, ...] = ()
    groups: Mapping[str, int] | None = None
    warnings: tuple[str, ...] = ()
    algorithm_version: int = ALGORITHM_VERSION

    @cached_property
    def indices(self) -> dict[str, list[int]]:
        """Row indices of ``train``, ``validation`` and ``test``, each ascending."""
        return {name: self.index_arrays[name].tolist() for name in SPLITS}

    @property
    def dropped(self) -> list[int]:
        """Row indices in no split (rare classes under the ``drop`` policy)."""
        dropped: list[int] = self.index_arrays["dropped"].tolist()
        return dropped

    @property
    def sizes(self) -> dict[str, int]:
        """Number of rows per list (splits and ``dropped``)."""
        return {name: int(self.index_arrays[name].shape[0]) for name in LISTS}

    @property
    def rare_classes(self) -> list[ClassSummary]:
        """The classes too small to reach every split, with the decision taken for each."""
        return [c for c in self.classes if c.decision != "split"]

    def summary(self) -> str:
        """A few lines for humans: strategy, sizes, per-class counts and rare-class decisions."""
        sizes = self.sizes
        ratios = "/".join(f"{r:g}" for r in self.ratios)
        column = self.stratify_by or self.group_by
        by = f" by {column!r}" if column else ""
        lines = [
            f"{self.strategy} split{by} of {self.dataset_source} ({self.n_rows} rows), seed {self.seed}, "
            f"ratios {ratios}",
            "  " + ", ".join(f"{name} {sizes[name]}" for name in LISTS if name != "dropped" or sizes[name]),
        ]
        if self.groups is not None:
            lines.append("  groups: " + ", ".join(f"{name} {self.groups[name]}" for name in SPLITS))
        if self.classes:
            shown = _class_names([c.value for c in self.classes])
            width = max(len(name) for name in shown)
            lines.append(f"  {'class':<{width}}  {'rows':>7} {'train':>7} {'val':>7} {'test':>7}  decision")
            for name, c in zip(shown, self.classes, strict=True):
                lines.append(
                    f"  {name:<{width}}  {c.n_rows:>7} {c.train:>7} {c.validation:>7} "
                    f"{c.test:>7}  {c.decision}"
                )
        return "\n".join(lines)

    def assignment(self) -> np.ndarray:
        """Per row, the position of its list in :data:`LISTS` (0 train ... 3 dropped)."""
        out = np.full(self.n_rows, 3, dtype=np.int8)
        for position, name in enumerate(SPLITS):
            out[self.index_arrays[name]] = position
        return out

    def to_json_obj(self, *, row_hashes: Any = None) -> dict[str, Any]:
        """The manifest as a JSON object.

        Args:
            row_hashes: the value of the ``row_hashes`` key; by default the hashes inline.
        """
        obj = self._header_obj(row_hashes)
        obj.update({name: self.index_arrays[name].tolist() for name in LISTS})
        return obj

    def _header_obj(self, row_hashes: Any) -> dict[str, Any]:
        """Everything but the index lists."""
        if row_hashes is None:
            row_hashes = {"algorithm": "sha256", "inline": self.row_hashes.hex_list()}
        return SPLIT_MANIFEST.stamp(
            {
                "algorithm": {"name": ALGORITHM, "version": self.algorithm_version},
                "dataset": {
                    "source": self.dataset_source,
                    "format": self.dataset_format,
                    "sha256": self.dataset_sha256,
                    "n_rows": self.n_rows,
                    "columns": list(self.columns),
                },
                "seed": self.seed,
                "ratios": dict(zip(SPLITS, self.ratios, strict=True)),
                "strategy": self.strategy,
                "stratify_by": self.stratify_by,
                "group_by": self.group_by,
                "rare_class_policy": self.rare_class_policy,
                "sizes": self.sizes,
                "classes": [c.to_json_obj() for c in self.classes],
                "rare_classes": [
                    {"value": canonical_value(c.value), "n_rows": c.n_rows, "decision": c.decision}
                    for c in self.rare_classes
                ],
                "groups": dict(self.groups) if self.groups is not None else None,
                "warnings": list(self.warnings),
                "row_hashes": row_hashes,
            }
        )


def manifest_bytes(manifest: Manifest, *, row_hashes: Any = None) -> bytes:
    """The manifest's file content: ``canonical_dumps(manifest.to_json_obj(...))`` as UTF-8."""
    if manifest.n_rows <= _SMALL:
        return canonical_dumps(manifest.to_json_obj(row_hashes=row_hashes)).encode("utf-8")
    # Large: dump everything but the index lists with canonical_dumps (whose indented encoder is
    # pure Python, ~1 s per million numbers), then render the lists, vectorised, into one buffer
    # in place of placeholder strings.
    obj: dict[str, Any] = manifest._header_obj(row_hashes)
    tokens = {name: f"\x00reprotune-index-list:{name}\x00" for name in LISTS}
    obj.update(tokens)
    text = canonical_dumps(obj)
    quoted = {name: json.dumps(token) for name, token in tokens.items()}
    if any(text.count(q) != 1 for q in quoted.values()):  # a data value holds a token: be plain
        return canonical_dumps(manifest.to_json_obj(row_hashes=row_hashes)).encode("utf-8")
    pieces: list[bytes | np.ndarray] = []
    rest = text
    for name in sorted(LISTS, key=lambda n: text.index(quoted[n])):
        before, _, rest = rest.partition(quoted[name])
        pieces += [before.encode("utf-8"), np.asarray(manifest.index_arrays[name])]
    pieces.append(rest.encode("utf-8"))
    size = sum(len(p) if isinstance(p, bytes) else rendered_size(p, 1) for p in pieces)
    buffer = np.empty(size, dtype=np.uint8)
    at = 0
    for piece in pieces:
        if isinstance(piece, bytes):
            buffer[at : at + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            at += len(piece)
        else:
            at = render_into(buffer, at, piece, level=1)
    return buffer.tobytes()


def sidecar_path(manifest_path: str | Path, sha256: str) -> Path:
    """Where the row-hash sidecar with content ``sha256`` of the manifest at ``manifest_path`` goes:
    ``<manifest name>.<first 16 hex of its sha256>.rowhashes``, so a new sidecar never replaces the
    one an existing manifest names."""
    path = Path(manifest_path)
    return path.with_name(f"{path.name}.{sha256[:16]}{SIDECAR_SUFFIX}")


def _sidecars_of(path: Path) -> list[Path]:
    """Every sidecar a manifest at ``path`` may name (this scheme's and the older ``<name>.rowhashes``)."""
    if not path.parent.is_dir():
        return []
    # exactly these names: a neighbour such as split.json.v1 has sidecars of its own
    own = re.compile(rf"{re.escape(path.name)}(\.[0-9a-f]{{16}})?{re.escape(SIDECAR_SUFFIX)}")
    return [p for p in path.parent.iterdir() if own.fullmatch(p.name) and p.is_file()]


def write_manifest(manifest: Manifest, path: str | Path) -> str:
    """Write ``manifest`` to ``path`` atomically; return the sha256 of the bytes written.

    For more than :data:`INLINE_ROW_HASH_LIMIT` rows the per-row hashes go to a sidecar named by
    its content (:func:`sidecar_path`), which the manifest names with its sha256. A manifest and
    its sidecar are replaced together or not at all: the new sidecar is written first under its
    own name, then the manifest; only then are the sidecars of the manifest it replaced removed.
    If the manifest cannot be written, a sidecar this call created is removed and the old
    manifest, with its sidecar, is as it was.
    """
    path = Path(path)
    side: Path | None = None
    created = False
    row_hashes: Any = None
    if manifest.n_rows > INLINE_ROW_HASH_LIMIT:
        data = manifest.row_hashes.to_bytes()
        digest = sha256_bytes(data)
        side = sidecar_path(path, digest)
        created = not side.exists()
        if created or sha256_file(side) != digest:
            write_bytes_atomic(side, data)
        row_hashes = {
            "algorithm": "sha256",
            "file": side.name,
            "file_sha256": digest,
            "n_rows": manifest.n_rows,
        }
    try:
        content = manifest_bytes(manifest, row_hashes=row_hashes)
        write_bytes_atomic(path, content)
    except BaseException:
        if side is not None and created:
            side.unlink(missing_ok=True)
        raise
    for old in _sidecars_of(path):
        if old != side:
            old.unlink(missing_ok=True)  # the replaced manifest's: nothing names it any more
    return sha256_bytes(content)


def copy_manifest(source: str | Path, target: str | Path) -> str:
    """Copy a manifest (and its row-hash sidecar, if it names one) byte for byte; return its sha256.

    Raises:
        InputError: the manifest cannot be loaded (it is validated first).
    """
    source, target = Path(source), Path(target)
    loaded = _read_json(source)
    info = loaded.get("row_hashes") if isinstance(loaded, dict) else None
    load_manifest(source)  # validate before copying anything
    if isinstance(info, dict) and isinstance(info.get("file"), str):
        data = (source.parent / info["file"]).read_bytes()
        write_bytes_atomic(target.parent / info["file"], data)
    content = source.read_bytes()
    write_bytes_atomic(target, content)
    return sha256_bytes(content)


# -- loading -------------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
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
    """Load and validate a manifest written by :func:`write_manifest`; never re-runs the split.

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
        _read_json(path),
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


def _class_names(values: list[Any]) -> list[str]:
    """How each class is printed: as itself, unless two print alike (``1`` and ``"1"``, ``True``
    and ``"True"``): then every class as JSON, so that ``1`` and ``"1"`` are told apart."""
    plain = [str(value) for value in values]
    if len(set(plain)) == len(plain):
        return plain
    return [json.dumps(value, ensure_ascii=False) for value in values]

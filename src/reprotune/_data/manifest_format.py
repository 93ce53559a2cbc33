"""The split manifest's typed form and its bytes: :class:`Manifest`, :class:`ClassSummary` and
:func:`manifest_bytes`.

A manifest's bytes are exactly ``_jsonio.canonical_dumps(manifest.to_json_obj())``. The split index
lists of a large dataset are rendered by a vectorised writer that produces those same bytes (a test
holds it to that). Writing a manifest with its row-hash sidecar is ``_data.manifest``'s concern;
loading one strictly is ``_data.manifest_load``'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

import numpy as np

from reprotune._data.index_render import render_into, rendered_size
from reprotune._data.row_hashes import RowHashes
from reprotune._data.table import canonical_value
from reprotune._formats import SPLIT_MANIFEST
from reprotune._jsonio import canonical_dumps

ALGORITHM = "reprotune-split"
ALGORITHM_VERSION = 1
SPLITS: tuple[str, str, str] = ("train", "validation", "test")
LISTS: tuple[str, ...] = (*SPLITS, "dropped")
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


def _class_names(values: list[Any]) -> list[str]:
    """How each class is printed: as itself, unless two print alike (``1`` and ``"1"``, ``True``
    and ``"True"``): then every class as JSON, so that ``1`` and ``"1"`` are told apart."""
    plain = [str(value) for value in values]
    if len(set(plain)) == len(plain):
        return plain
    return [json.dumps(value, ensure_ascii=False) for value in values]

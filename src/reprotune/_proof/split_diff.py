"""How the split manifests of two runs differ: rows whose content changed, rows in another split,
splits with the same rows in another order."""

from __future__ import annotations

from reprotune._data.manifest import LISTS, Manifest
from reprotune._proof.differences import RowMove, SplitDiff
from reprotune._run.rundir import RunDir


def compare_manifests(run_a: RunDir, run_b: RunDir) -> SplitDiff | None:
    """Which rows and splits differ between the two runs' split manifests."""
    ma, mb = run_a.manifest, run_b.manifest
    sha_a, sha_b = run_a.manifest_sha256, run_b.manifest_sha256
    if ma is None or mb is None or sha_a is None or sha_b is None:
        return None
    if sha_a == sha_b:
        return SplitDiff(sha_a, sha_b, (), (), ())
    ha, hb = ma.row_hashes.hex_list(), mb.row_hashes.hex_list()
    splits_a, splits_b = _splits(ma), _splits(mb)
    # Rows past the end of the shorter dataset count as changed: they exist in one run only.
    changed = tuple(i for i in range(max(len(ha), len(hb))) if i >= len(ha) or i >= len(hb) or ha[i] != hb[i])
    where_a = {row: name for name, rows in splits_a.items() for row in rows}
    where_b = {row: name for name, rows in splits_b.items() for row in rows}
    moved = tuple(
        RowMove(row, where_a.get(row), where_b.get(row))
        for row in sorted(set(where_a) | set(where_b))
        if where_a.get(row) != where_b.get(row)
    )
    reordered = tuple(
        name
        for name, rows in splits_a.items()
        if rows != splits_b.get(name) and sorted(rows) == sorted(splits_b.get(name, ()))
    )
    return SplitDiff(sha_a, sha_b, changed, moved, reordered)


def _splits(manifest: Manifest) -> dict[str, tuple[int, ...]]:
    """Split name (``dropped`` included) -> its row indices, in manifest order."""
    return {name: tuple(manifest.index_arrays[name].tolist()) for name in LISTS}

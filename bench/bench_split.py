"""Benchmark: a stratified ``reprotune`` split against NumPy and scikit-learn, same data, same run.

    .venv/bin/python bench/bench_split.py            # 10M rows, the issue's targets
    .venv/bin/python bench/bench_split.py --rows 1000000

Data: one in-memory integer column of ``--rows`` rows and 50 classes: 41 common classes drawn
at random and 9 rare ones of 1 to 9 rows. Three ways to split it 80/10/10 by class:

- reprotune, end to end: ``table_from_columns`` -> ``split_table`` (per-row keys, per-class
  allocation, per-row content hashes) -> ``write_manifest`` (the manifest JSON with the three
  index lists, the row-hash sidecar, both fsynced, both hashed).
- NumPy, bare: per class, ``flatnonzero`` of the class, a ``Generator.permutation``, cut at the
  ratios. Nothing hashed, nothing written.
- scikit-learn: two chained ``train_test_split(..., stratify=...)`` calls (80/20, then 50/50 of
  the 20). scikit-learn refuses classes of one row, so the 9 rare classes are first folded into
  one class of 45 rows; the time to fold is not counted.

Each is timed best of ``--repeat`` runs; the ratios are computed from the times measured here.
Targets: reprotune within 3x of NumPy, and at least 4x faster than scikit-learn. Exits 1 when a
target is missed. scikit-learn is a test tool (the dev install, ``./scripts/install.sh dev``): where
it is missing the script stops before timing anything (exit 2) and says so; ``--no-sklearn`` skips
its baseline and the 4x target.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from _machine import require
from reprotune._data.loaders import table_from_columns
from reprotune._data.manifest import load_manifest, write_manifest
from reprotune._data.split import split_table

N_COMMON = 41
RARE_SIZES = tuple(range(1, 10))  # 9 rare classes of 1..9 rows: 50 classes in all
SEED = 20240611


def make_labels(n_rows: int, seed: int = 0) -> np.ndarray:
    """The benchmark column: ``n_rows`` int64 labels, 41 common classes and 9 rare ones, shuffled."""
    rng = np.random.default_rng(seed)
    rare = np.repeat(np.arange(N_COMMON, N_COMMON + len(RARE_SIZES)), RARE_SIZES)
    common = rng.integers(0, N_COMMON, size=n_rows - rare.size)
    labels = np.concatenate([common, rare]).astype(np.int64)
    rng.shuffle(labels)
    return labels


def run_reprotune(labels: np.ndarray, out_dir: Path) -> dict[str, int]:
    """Split, hash and write the manifest, from the in-memory column to fsynced files."""
    table = table_from_columns({"label": labels})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 1-row classes go to train with a warning
        manifest = split_table(table, seed=SEED, stratify_by="label")
    write_manifest(manifest, out_dir / "split.json")
    return manifest.sizes


def run_numpy(labels: np.ndarray) -> dict[str, int]:
    """A bare per-class permutation, cut at 80/10/10."""
    rng = np.random.default_rng(SEED)
    parts: list[list[np.ndarray]] = [[], [], []]
    for value in np.unique(labels):
        rows = np.flatnonzero(labels == value)
        rows = rows[rng.permutation(rows.size)]
        n_train, n_val = int(rows.size * 0.8), int(rows.size * 0.1)
        parts[0].append(rows[:n_train])
        parts[1].append(rows[n_train : n_train + n_val])
        parts[2].append(rows[n_train + n_val :])
    sizes = [int(sum(p.size for p in part)) for part in parts]
    return dict(zip(("train", "validation", "test"), sizes, strict=True))


def fold_rare(labels: np.ndarray) -> np.ndarray:
    """Labels with the rare classes merged into one, so scikit-learn accepts them."""
    folded = labels.copy()
    folded[folded >= N_COMMON] = N_COMMON
    return folded


def run_sklearn(folded: np.ndarray) -> dict[str, int]:
    """Two chained stratified ``train_test_split`` calls: 80/20, then the 20 in halves."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(folded.size)
    train, rest, _, rest_labels = train_test_split(
        rows, folded, test_size=0.2, stratify=folded, random_state=SEED % 2**32
    )
    validation, test = train_test_split(rest, test_size=0.5, stratify=rest_labels, random_state=SEED % 2**32)
    return {"train": len(train), "validation": len(validation), "test": len(test)}


def best_of(repeat: int, func: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """The shortest wall time of ``repeat`` calls, and the last result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = func(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 when both targets are met, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-sklearn", action="store_true", help="skip scikit-learn (no 4x check)")
    args = parser.parse_args(argv)
    if not args.no_sklearn and importlib.util.find_spec("sklearn") is None:
        print(
            "bench_split.py: scikit-learn is not installed; its baseline (the >= 4x target) needs it,\n"
            "a test tool of the dev install: ./scripts/install.sh dev (the lock's version), then run\n"
            "this again; or pass --no-sklearn to time reprotune against NumPy only.",
            file=sys.stderr,
        )
        return 2

    labels = make_labels(args.rows)
    print(f"rows {args.rows:,}, classes {np.unique(labels).size} (rare sizes {list(RARE_SIZES)})")
    with tempfile.TemporaryDirectory(prefix="bench-split-") as tmp:
        out = Path(tmp)
        t_ours, sizes = best_of(args.repeat, run_reprotune, labels, out)
        manifest_mb = (out / "split.json").stat().st_size / 1e6
        sidecar_mb = sum(p.stat().st_size for p in out.glob("split.json.*.rowhashes")) / 1e6
        loaded = load_manifest(out / "split.json")  # not timed: checks what was written reads back
        require(loaded.sizes == sizes and loaded.n_rows == args.rows, "the manifest did not read back")
    t_numpy, np_sizes = best_of(args.repeat, run_numpy, labels)
    print(f"reprotune split + hashes + manifest written: {t_ours:7.3f} s  sizes {sizes}")
    print(f"  manifest {manifest_mb:.1f} MB, row-hash sidecar {sidecar_mb:.1f} MB")
    print(f"numpy per-class permutation (bare):          {t_numpy:7.3f} s  sizes {np_sizes}")
    ok = True
    ratio_numpy = t_ours / t_numpy
    ok &= ratio_numpy <= 3.0
    print(
        f"reprotune / numpy  = {ratio_numpy:5.2f}x  (target <= 3x)  {'ok' if ratio_numpy <= 3 else 'MISSED'}"
    )
    if not args.no_sklearn:
        folded = fold_rare(labels)
        t_sklearn, sk_sizes = best_of(max(1, args.repeat - 1), run_sklearn, folded)
        print(f"scikit-learn 2x train_test_split(stratify): {t_sklearn:7.3f} s  sizes {sk_sizes}")
        speedup = t_sklearn / t_ours
        ok &= speedup >= 4.0
        print(f"sklearn / reprotune = {speedup:5.2f}x  (target >= 4x)  {'ok' if speedup >= 4 else 'MISSED'}")
    print("all targets met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A split manifest's index lists as read from its JSON, checked with NumPy: they are the large
part of a manifest (10M numbers are not validated one by one as its other keys are).

Each list must hold integers (JSON's ``true`` and ``false`` are none, though NumPy reads them as
1 and 0), in range, strictly ascending; together they cover every row exactly once. Problems are
collected, not raised: the loader (``_data.manifest``) names them with the manifest's others.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def index_arrays(
    obj: Mapping[str, Any], names: Sequence[str], n_rows: int | None, problems: list[str]
) -> dict[str, np.ndarray] | None:
    """The lists ``names`` of ``obj`` as sorted int64 arrays, each checked (in range where the
    row count ``n_rows`` is known), and together covering every row exactly once.

    Returns:
        The arrays; None when a list is unsound (not integers, out of range, out of order), so
        that what they cover cannot be said. Every problem found is appended to ``problems``.
    """
    before = len(problems)
    arrays = {name: _index_array(obj.get(name), name, n_rows, problems) for name in names}
    if len(problems) > before:
        return None
    if not n_rows:  # unknown (the other keys' problems say why) or no rows: nothing to cover
        return arrays
    counts = np.bincount(np.concatenate(list(arrays.values())), minlength=n_rows)
    if int(counts.max()) > 1:
        problems.append(f"row {int(np.argmax(counts > 1))} is in more than one list")
    if int(counts.min()) == 0:
        problems.append(f"row {int(np.argmin(counts))} is in no list ({', '.join(names)})")
    return arrays


def _index_array(values: Any, name: str, n_rows: int | None, problems: list[str]) -> np.ndarray:
    if not isinstance(values, list):
        problems.append(f"key {name!r} is not a list of row indices")
        return np.zeros(0, dtype=np.int64)
    # Let NumPy infer the type, so 1.5 or true are caught rather than cast to an integer.
    array = np.array(values) if values else np.zeros(0, dtype=np.int64)
    if array.ndim == 1 and array.dtype.kind in "biu":
        # NumPy makes [false, 2] the integers [0, 2]: a true or false is among the 0s and 1s.
        at = next((int(i) for i in np.flatnonzero(array <= 1) if isinstance(values[i], bool)), None)
        if at is not None:
            problems.append(f"{name}[{at}] is {json.dumps(values[at])}, not a row index (an integer)")
            return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu":
        problems.append(f"key {name!r} holds something other than integers")
        return np.zeros(0, dtype=np.int64)
    array = array.astype(np.int64, copy=False)
    if n_rows is not None and array.size and (array.min() < 0 or array.max() >= n_rows):
        bad = int(array[(array < 0) | (array >= n_rows)][0])
        problems.append(f"{name!r} holds row index {bad}, outside 0..{n_rows - 1}")
    if array.size > 1 and not bool(np.all(np.diff(array) > 0)):
        problems.append(f"{name!r} is not strictly ascending")
    return array

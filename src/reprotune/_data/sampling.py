"""A capped set of a split's rows, drawn with a seed and kept in manifest order: the rule the
validation cap (``eval.max_rows``) and an eval's cap (``eval.generate_max_rows``) share. Never
imports torch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: How :func:`sample_rows` draws a capped eval's rows; records depend on it, so it never changes meaning.
SAMPLE_RULE = (
    "numpy.random.Generator(PCG64(eval seed)).choice(split rows, max_rows, replace=False), "
    "kept in manifest order (as eval.max_rows draws the validation rows)"
)


def sample_rows(indices: Sequence[int], cap: int | None, seed: int) -> list[int]:
    """The rows of a split to use: all of ``indices`` when ``cap`` is None or reaches their
    number, else ``cap`` of them drawn without replacement by a generator of its own seeded with
    ``seed`` (the ``eval`` derived seed), kept in manifest order.

    ``eval.max_rows`` draws the validation rows during training with it
    (``_train.data.RunData.eval_rows``), and ``eval.generate_max_rows`` an eval's rows
    (``_eval.inputs``): a split whose rows are grouped by class gives a sample of every part of
    it, where its first N rows cover its first classes only.

    Example:
        >>> sample_rows(range(10), 3, seed=7) == sample_rows(range(10), 3, seed=7)
        True
        >>> sample_rows([4, 8, 9], None, seed=7)
        [4, 8, 9]
    """
    rows = [int(i) for i in indices]
    if cap is None or cap >= len(rows):
        return rows
    chosen = np.random.Generator(np.random.PCG64(seed)).choice(len(rows), size=cap, replace=False)
    return [rows[i] for i in sorted(int(c) for c in chosen)]

"""The order in which training rows are seen: a pure function of (seed, epoch, position).

The training rows form an endless stream: epoch ``e`` is a permutation of the training split drawn
from ``numpy.random.Generator(PCG64([seed, e]))``, and optimizer step ``s`` (counting from 1) takes
the ``rows_per_step`` positions ``(s - 1) * rows_per_step ...`` of that stream. Nothing depends on
what ran before, so a resumed run sees exactly the rows an uninterrupted one would, and sharding
the stream across ranks later is a slice of the same order, not a new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

ORDER_VERSION = 1


@dataclass
class DataOrder:
    """The data order of one run.

    Args:
        seed: the ``data_order`` seed.
        row_ids: dataset row indices of the training split (the manifest's ``train`` list).
        rows_per_step: rows per optimizer step (batch size x gradient accumulation).
    """

    seed: int
    row_ids: Sequence[int]
    rows_per_step: int
    _cache: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.row_ids:
            raise ValueError("the training split is empty")
        if self.rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {self.rows_per_step}")

    @property
    def n_rows(self) -> int:
        return len(self.row_ids)

    def permutation(self, epoch: int) -> np.ndarray:
        """Positions into ``row_ids`` for ``epoch``, in the order they are seen."""
        perm = self._cache.get(epoch)
        if perm is None:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            perm = rng.permutation(self.n_rows)
            self._cache = {epoch: perm}  # one epoch at a time is all a loop needs
        return perm

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, index within that epoch) of the first row of optimizer step ``step`` (from 1)."""
        start = (step - 1) * self.rows_per_step
        return divmod(start, self.n_rows)

    def step_rows(self, step: int) -> list[int]:
        """The dataset row indices of optimizer step ``step`` (from 1), in order."""
        if step < 1:
            raise ValueError(f"steps count from 1, got {step}")
        start = (step - 1) * self.rows_per_step
        rows: list[int] = []
        for stream_pos in range(start, start + self.rows_per_step):
            epoch, index = divmod(stream_pos, self.n_rows)
            rows.append(int(self.row_ids[int(self.permutation(epoch)[index])]))
        return rows

    def steps_for_epochs(self, epochs: float) -> int:
        """Optimizer steps needed to see ``epochs`` passes over the training rows (rounded up)."""
        total = int(np.ceil(epochs * self.n_rows))
        return max(1, -(-total // self.rows_per_step))

"""The ledger's optional per-rank batch hashes: written only by distributed runs, checked on read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps
from reprotune._run.ledger import RANK_BATCHES, batch_sha256, init_line, read_ledger, train_line


def _write(path: Path, lines: list[dict[str, object]]) -> None:
    path.write_text("".join(canonical_dumps(line, indent=None) for line in lines), encoding="utf-8")


def _line(**extra: object) -> dict[str, object]:
    return train_line(1, 0, [3, 1, 4, 1], 10, 2.5, 1e-3, 0.5, "f" * 64, **extra)  # type: ignore[arg-type]


def test_a_single_process_line_has_no_rank_field() -> None:
    """Without ranks the line is what it always was (single-process ledgers stay byte-identical)."""
    line = _line()
    assert RANK_BATCHES not in line
    assert sorted(line) == sorted(
        [
            "kind",
            "step",
            "epoch",
            "batch_sha256",
            "n_rows",
            "n_tokens",
            "loss",
            "lr",
            "grad_norm",
            "weights_sha256",
        ]
    )


def test_each_ranks_rows_are_hashed_in_rank_order(tmp_path: Path) -> None:
    """The field lists each rank's batch hash; the global batch hash is unchanged; it reads back."""
    line = _line(rank_rows=[[3, 1], [4, 1]])
    assert line[RANK_BATCHES] == [batch_sha256([3, 1]), batch_sha256([4, 1])]
    assert line["batch_sha256"] == batch_sha256([3, 1, 4, 1])
    _write(tmp_path / "ledger.jsonl", [init_line("e" * 64), line])
    ledger = read_ledger(tmp_path / "ledger.jsonl")
    assert ledger.train[0].fields[RANK_BATCHES] == line[RANK_BATCHES]


@pytest.mark.parametrize(
    "bad",
    [[], ["not-a-sha"], "a" * 64, [1, 2]],
    ids=["empty", "not-hex", "not-a-list", "numbers"],
)
def test_a_malformed_rank_field_is_refused_naming_line_and_key(tmp_path: Path, bad: object) -> None:
    """A rank field that is not a list of sha256 digests: refused with the line, the key and the fix."""
    line = _line(rank_rows=[[3, 1], [4, 1]])
    line[RANK_BATCHES] = bad
    _write(tmp_path / "ledger.jsonl", [init_line("e" * 64), line])
    with pytest.raises(InputError) as caught:
        read_ledger(tmp_path / "ledger.jsonl")
    assert caught.value.source == f"{tmp_path / 'ledger.jsonl'}:2 (key {RANK_BATCHES!r})"
    assert caught.value.fix


def test_only_train_lines_carry_rank_hashes(tmp_path: Path) -> None:
    """The field on the init line is refused."""
    init = {**init_line("e" * 64), RANK_BATCHES: ["a" * 64]}
    (tmp_path / "ledger.jsonl").write_text(json.dumps(init) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="only train lines carry it"):
        read_ledger(tmp_path / "ledger.jsonl")

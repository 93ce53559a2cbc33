"""The ledger survives a crash at any byte and truncates back to a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._errors import InputError
from reprotune._run.ledger import (
    LedgerWriter,
    batch_sha256,
    init_line,
    read_ledger,
    train_line,
    val_line,
)
from reprotune._run.ledger_resume import ledger_misfit, truncate_ledger

W = "0" * 64


def _steps(path: Path, *, repair: bool = False) -> list[int]:
    return [e.step for e in read_ledger(path, repair=repair).entries()]


def _write(path: Path, steps: int) -> None:
    with LedgerWriter(path) as ledger:
        ledger.write(init_line(W))
        for step in range(1, steps + 1):
            ledger.write(train_line(step, 0, [step], 3, 1.0 / step, 0.1, 0.5, W))


def test_round_trip_exact_bits(tmp_path: Path) -> None:
    """Losses come back bit for bit from their hex form."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 5)
    ledger = read_ledger(path)
    assert [e.step for e in ledger.entries()] == [0, 1, 2, 3, 4, 5]
    assert ledger.train[2].number("loss") == 1.0 / 3


def test_partial_last_line(tmp_path: Path) -> None:
    """A crash mid-append leaves a partial line: refused by default, dropped with repair."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 3)
    with open(path, "ab") as handle:
        handle.write(b'{"kind":"train","st')
    with pytest.raises(InputError, match="line 5"):
        read_ledger(path)
    assert _steps(path, repair=True) == [0, 1, 2, 3]


def test_corrupt_middle_line_is_never_repaired(tmp_path: Path) -> None:
    """A broken line that is not the last one is an error even with repair."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 3)
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"{broken"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(InputError, match="line 2"):
        read_ledger(path, repair=True)


def test_truncate_back_to_checkpoint(tmp_path: Path) -> None:
    """Truncation keeps lines through the checkpoint step and drops a partial tail."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 6)
    with open(path, "ab") as handle:
        handle.write(b'{"kind"')
    assert truncate_ledger(path, keep_through_step=4) == 5
    assert _steps(path) == [0, 1, 2, 3, 4]


def _write_validated(path: Path, steps: int, *, val_every: int) -> None:
    with LedgerWriter(path) as ledger:
        ledger.write(init_line(W))
        for step in range(1, steps + 1):
            ledger.write(train_line(step, 0, [step], 3, 1.0 / step, 0.1, 0.5, W))
            if step % val_every == 0:
                ledger.write(val_line(step, 2.0, 4, 9))


def _damage(path: Path, line: int) -> None:
    """Line ``line`` (1-based) becomes zeros, as a crash can leave a block that was never written."""
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = b"\0" * len(lines[line - 1])
    path.write_bytes(b"\n".join(lines))


def test_a_damaged_line_past_the_checkpoint_is_dropped_and_told(tmp_path: Path) -> None:
    """Lines after the checkpoint's step were never synced: a damaged one there is dropped with them."""
    path = tmp_path / "ledger.jsonl"
    _write_validated(path, 6, val_every=2)  # init, 1, 2, v2, 3, 4, v4, 5, 6, v6
    _damage(path, 9)  # step 6's train line
    told: list[str] = []
    assert truncate_ledger(path, keep_through_step=4, val_at_step=True, report=told.append) == 7
    assert [(e.kind, e.step) for e in read_ledger(path).entries()][-2:] == [("train", 4), ("val", 4)]
    assert len(told) == 1 and "left out 1 damaged line(s) after step 4" in told[0]


def test_a_damaged_line_where_the_steps_val_line_goes_is_kept_unless_no_val_was_due(tmp_path: Path) -> None:
    """Right after the checkpoint step's train line may be its own val line: refused unless the run
    did not validate then (and also when that is not known)."""
    path = tmp_path / "ledger.jsonl"
    _write_validated(path, 6, val_every=2)
    _damage(path, 7)  # the val line of step 4
    for due in (True, None):
        with pytest.raises(InputError, match="line 7"):
            truncate_ledger(path, keep_through_step=4, val_at_step=due)
        with pytest.raises(InputError, match="line 7"):
            ledger_misfit(path, 4, W, val_at_step=due)
    plain = tmp_path / "plain.jsonl"
    _write(plain, 6)
    _damage(plain, 6)  # step 5's line, right after step 4's: no val line was due at 4
    assert ledger_misfit(plain, 4, W, val_at_step=False) is None
    assert truncate_ledger(plain, keep_through_step=4, val_at_step=False) == 5


def test_a_damaged_line_before_the_checkpoint_step_is_refused(tmp_path: Path) -> None:
    """What the checkpoint's sync made durable must read back: a damaged line there names itself."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 6)
    _damage(path, 3)
    with pytest.raises(InputError, match="line 3 holds zero bytes"):  # it said "utf-32-be"
        truncate_ledger(path, keep_through_step=4, val_at_step=False)
    before = path.read_bytes()
    with pytest.raises(InputError, match="line 3"):
        ledger_misfit(path, 4, W, val_at_step=False)
    assert path.read_bytes() == before


def test_a_ledger_short_of_the_step_with_a_damaged_line_names_it(tmp_path: Path) -> None:
    """When the ledger never reaches the step, every line is checked as before."""
    path = tmp_path / "ledger.jsonl"
    _write(path, 3)
    _damage(path, 4)
    with pytest.raises(InputError, match="line 4"):
        ledger_misfit(path, 5, W, val_at_step=False)


def test_batch_hash_depends_on_order() -> None:
    """The batch hash covers the row ids in order."""
    assert batch_sha256([1, 2, 3]) != batch_sha256([3, 2, 1])
    assert batch_sha256([1, 2, 3]) == batch_sha256([1, 2, 3])
    assert batch_sha256([12, 3]) != batch_sha256([1, 23])


def test_queued_entries_keep_their_order_and_build_late(tmp_path: Path) -> None:
    """Mappings and builders come out in the order written; a builder runs at the flush, once."""
    path = tmp_path / "ledger.jsonl"
    calls: list[int] = []

    def build(step: int) -> dict[str, object]:
        calls.append(step)
        return train_line(step, 0, [step], 3, 1.0, 0.1, 0.5, W)

    with LedgerWriter(path, flush_interval_s=3600) as ledger:
        ledger.write(init_line(W))
        ledger.write(lambda: build(1))
        ledger.write(val_line(1, 2.0, 4, 9))
        ledger.write(lambda: build(2))
        assert calls == [] and path.read_bytes() == b""  # nothing built or written before a flush
        ledger.flush()
        assert calls == [1, 2]
        assert [(e.kind, e.step) for e in read_ledger(path).entries()] == [
            ("init", 0), ("train", 1), ("val", 1), ("train", 2)
        ]  # fmt: skip
        ledger.write(lambda: build(3))
    assert calls == [1, 2, 3]  # closing writes what was queued
    assert _steps(path) == [0, 1, 1, 2, 3]


def test_queued_lines_are_written_when_the_loop_raises(tmp_path: Path) -> None:
    """An exception in the loop still leaves every queued line on disk (nothing lost on a crash)."""
    path = tmp_path / "ledger.jsonl"
    with pytest.raises(RuntimeError), LedgerWriter(path, flush_interval_s=3600) as ledger:
        ledger.write(init_line(W))
        for step in range(1, 4):
            ledger.write(train_line(step, 0, [step], 3, 1.0, 0.1, 0.5, W))
        raise RuntimeError("out of memory")
    assert _steps(path) == [0, 1, 2, 3]


def test_flush_interval_hands_lines_to_the_os(tmp_path: Path) -> None:
    """With a zero interval every write reaches the file at once (what a reader sees mid-run)."""
    path = tmp_path / "ledger.jsonl"
    with LedgerWriter(path, flush_interval_s=0) as ledger:
        ledger.write(init_line(W))
        assert _steps(path) == [0]

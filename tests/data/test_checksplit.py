"""Tests for reprotune._data.checksplit: identical data, edited/added/removed rows, formatting, leakage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reprotune._data.checksplit import check_split
from reprotune._data.leakage import normalize_text
from reprotune._data.loaders import load_table, table_from_columns
from reprotune._data.split import split_table
from reprotune._errors import InputError

ROWS = [{"q": f"question {i}", "a": f"answer {i}", "cat": "x" if i % 2 else "y"} for i in range(30)]


def write_jsonl(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def made(tmp_path: Path) -> tuple[Path, object]:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    return path, split_table(load_table(str(path)), seed=1, stratify_by="cat")


def test_normalize_text() -> None:
    """Case, punctuation, symbols and runs of whitespace do not make texts different."""
    assert normalize_text("  Hello,   WORLD!! ") == normalize_text("hello world") == "hello world"
    assert normalize_text("Ｆｕｌｌ-width") == "full width"


def test_normalize_text_keeps_letters_marks_and_drops_invisible_characters() -> None:
    """Accent and vowel marks are part of a word: other words stay other texts (before, every
    combining mark was removed as a non-word character: "कि" and "के" were one text)."""
    assert normalize_text("कि") != normalize_text("के") and normalize_text("مَلِك") != normalize_text("مُلْك")
    assert normalize_text("cafe\u0301") == normalize_text("CAFÉ") == "café"  # NFKC composes it
    assert normalize_text("zero\u200bwidth\tand_under\x00score") == "zerowidth and under score"


def test_an_id_column_does_not_hide_copies(tmp_path: Path) -> None:
    """A column of one-word values (an id, here as a CSV makes every column) is no text of the
    example: copies of a prompt and response under other ids leak (before, the ids made every row
    unique and the report said "none")."""
    lines = ["id,prompt,response"] + [f"{i},question {i % 10},answer {i % 10}" for i in range(40)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    table = load_table(str(tmp_path / "d.csv"))
    report = check_split(split_table(table, seed=1), table)
    assert report.leak_columns == ("prompt", "response") and report.leaked


def test_text_without_spaces_is_text_and_a_time_stamp_is_not(tmp_path: Path) -> None:
    """Chinese prompts and responses (no spaces between words) are text, and a time stamp with a
    space in it names a moment: copies under other stamps leak (a review found the first version
    left the Chinese columns out, "not checked", and kept the stamps, which hid every copy)."""
    rows = [
        {"prompt": f"你好吗{i % 5}", "response": f"我很好{i % 5}", "ts": f"2024-01-01 10:00:{i:02d}"}
        for i in range(40)
    ]
    table = load_table(str(write_jsonl(tmp_path / "zh.jsonl", rows)))  # type: ignore[arg-type]
    report = check_split(split_table(table, seed=1), table)
    assert report.leak_columns == ("prompt", "response") and report.leaked


#: Time stamps in shapes other than ISO's, each with a space in it; ``{s}`` is a second.
STAMPS = {
    "zone-name": "2024-01-01 10:00:{s:02d} UTC",
    "day-month-year": "12/01/2024 10:{s:02d}",
    "spaced-offset": "2024-01-01 10:00:{s:02d} +0000",
    "rfc-2822": "Mon, 06 Dec 2024 17:32:{s:02d} GMT",
    "ctime": "Fri Dec  6 17:32:{s:02d} 2024",
    "year-slashes": "2024/01/01 10:00:{s:02d}",
    "month-name": "December 6, 2024 10:{s:02d} PM",
    "unix-date": "Fri Dec  6 17:32:{s:02d} UTC 2024",
}


@pytest.mark.parametrize("stamp", list(STAMPS.values()), ids=list(STAMPS))
def test_a_time_stamp_in_a_common_shape_does_not_hide_copies(tmp_path: Path, stamp: str) -> None:
    """A column of time stamps written as logs and spreadsheets write them names moments: copies of
    a prompt and response under other stamps leak (before, only ISO's shape was known, the stamps
    were taken for text, made every row unique and the report said "leakage: none")."""
    rows = [
        {"prompt": f"question {i % 5}", "response": f"answer {i % 5}", "ts": stamp.format(s=i)}
        for i in range(40)
    ]
    table = load_table(str(write_jsonl(tmp_path / "d.jsonl", rows)))
    report = check_split(split_table(table, seed=1), table)
    assert report.leak_columns == ("prompt", "response") and report.leaked


def test_text_that_holds_a_date_is_text(tmp_path: Path) -> None:
    """A column of words is kept even when some of its values are dates and times: one value
    that says something makes it text."""
    notes = ["Dec 6, 2024", "10:05 PM", "Met on Dec 6, 2024 at 10:05 PM", "Fri Dec  6 17:32:00 2024"]
    rows = [{"note": notes[i % 4], "ts": f"2024-01-01 10:00:{i:02d} UTC"} for i in range(40)]
    table = load_table(str(write_jsonl(tmp_path / "d.jsonl", rows)))
    assert check_split(split_table(table, seed=1), table).leak_columns == ("note",)


def test_chat_messages_are_compared_by_their_text(tmp_path: Path) -> None:
    """A column of chat messages (lists of role/content mappings) is text: its copies leak (before,
    a value that was no string compared as empty, and the report said "not checked" or "none")."""
    turns = [[{"role": "user", "content": f"hi number {i % 5}"}] for i in range(30)]
    rows = [{"messages": [*turn, {"role": "assistant", "content": "ok"}]} for turn in turns]
    table = load_table(str(write_jsonl(tmp_path / "chat.jsonl", rows)))  # type: ignore[arg-type]
    manifest = split_table(table, seed=2)
    report = check_split(manifest, table)
    assert report.leak_columns == ("messages",) and report.leaked
    assert report.leaks[0].examples[0].text.startswith("user hi number")


def test_a_leak_column_without_text_is_refused(made: tuple[Path, object], tmp_path: Path) -> None:
    """A named leak column that holds no text compares nothing: an error, not "leakage: none"."""
    rows = [{"q": f"question {i}", "score": i % 3} for i in range(30)]
    table = load_table(str(write_jsonl(tmp_path / "n.jsonl", rows)))  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"leak column 'score' .* holds no text"):
        check_split(split_table(table, seed=1), table, leak_columns=["score"])


def test_identical(made: tuple[Path, object]) -> None:
    """The data the manifest was made from is identical, with no changes."""
    path, manifest = made
    report = check_split(manifest, load_table(str(path)))  # type: ignore[arg-type]
    assert report.identical and not report.formatting_only and report.changes == ()
    assert report.format().startswith("identical")


def test_edited_row_named_with_split_and_ids(tmp_path: Path, made: tuple[Path, object]) -> None:
    """An edited row is reported by index, id (row-hash prefix) and the split it belongs to."""
    _, manifest = made
    rows = [dict(r) for r in ROWS]
    rows[7]["a"] = "changed"
    report = check_split(manifest, load_table(str(write_jsonl(tmp_path / "e.jsonl", rows))))  # type: ignore[arg-type]
    split = next(name for name, idx in manifest.indices.items() if 7 in idx)  # type: ignore[attr-defined]
    assert not report.identical
    assert [(c.kind, c.index, c.new_index, c.split) for c in report.changes] == [("edited", 7, 7, split)]
    assert report.changes[0].old_id == manifest.row_hashes.hex_at(7)[:12]  # type: ignore[attr-defined]
    assert f"edited  row 7 ({split})" in report.format()


def test_the_rows_not_listed_point_to_what_lists_them(tmp_path: Path, made: tuple[Path, object]) -> None:
    """Past max_rows, the report says how to see them all: check-split's own --json, or for a
    refusal inside eval or rerun (which have no --json), the command its fix gives."""
    _, manifest = made
    rows = [{**r, "a": f"changed {i}"} for i, r in enumerate(ROWS)]
    report = check_split(manifest, load_table(str(write_jsonl(tmp_path / "e.jsonl", rows))))  # type: ignore[arg-type]
    assert "  ... and 25 more (--json lists all)" in report.format(max_rows=5)
    shown = report.format(max_rows=5, all_rows="the command below lists all")
    assert "  ... and 25 more (the command below lists all)" in shown and "--json" not in shown


def test_inserted_and_removed_rows_are_aligned(tmp_path: Path, made: tuple[Path, object]) -> None:
    """Inserting one row and removing another reports just those two, not every row after."""
    _, manifest = made
    rows = [dict(r) for r in ROWS]
    rows.insert(3, {"q": "new", "a": "row", "cat": "x"})
    del rows[21]  # was row 20
    report = check_split(manifest, load_table(str(write_jsonl(tmp_path / "i.jsonl", rows))))  # type: ignore[arg-type]
    kinds = [(c.kind, c.index, c.new_index) for c in report.changes]
    assert kinds == [("added", None, 3), ("removed", 20, None)]
    assert report.changes[0].split == "none"


def test_formatting_only(tmp_path: Path, made: tuple[Path, object]) -> None:
    """Same rows in a differently formatted file: not identical, but formatting only."""
    _, manifest = made
    path = tmp_path / "f.jsonl"
    path.write_text(
        "".join(json.dumps(r, indent=None, separators=(", ", ": "), sort_keys=True) + "\r\n" for r in ROWS),
        encoding="utf-8",
    )
    report = check_split(manifest, load_table(str(path)))  # type: ignore[arg-type]
    assert report.formatting_only and not report.identical and report.changes == ()
    assert "formatting only" in report.format()


def test_leakage_by_normalised_text() -> None:
    """Near-copies across splits are reported per split pair with counts and examples."""
    texts = [f"Unique text number {i}" for i in range(40)] + [
        "Hello, World!",
        "hello   world",
        "HELLO world.",
    ] * 4
    table = table_from_columns({"text": texts})
    manifest = split_table(table, seed=0)
    report = check_split(manifest, table)
    where = {s for s, idx in manifest.indices.items() for i in idx if i >= 40}
    assert len(where) >= 2  # the 12 copies fall in more than one split
    leaks = {(lk.split_a, lk.split_b): lk for lk in report.leaks if lk.n_texts}
    assert leaks and all(lk.n_texts == 1 for lk in leaks.values())
    for (a, _b), leak in leaks.items():
        assert leak.n_rows_a == sum(1 for i in manifest.indices[a] if i >= 40)
        assert leak.examples[0].text == "hello world" and leak.n_rows_b == len(leak.examples[0].rows_b)
    assert report.leaked and "leakage" in report.format()
    decoded = json.loads(report.to_json())
    assert decoded["identical"] is True and decoded["leaks"][0]["split_a"] == "train"


def test_leak_columns_default_skips_stratify_column(made: tuple[Path, object]) -> None:
    """By default leakage looks at text columns, not the class label."""
    path, manifest = made
    report = check_split(manifest, load_table(str(path)))  # type: ignore[arg-type]
    assert report.leak_columns == ("q", "a") and not report.leaked


def test_leakage_follows_the_rows_after_a_row_is_removed(tmp_path: Path) -> None:
    """Leakage is looked for over each split's rows where they are now: a row removed before two
    copies in train and test shifts their positions, and the leak is still the same two rows
    (numbered as in the data checked), not two other rows that happen to sit at the old positions."""
    rows = [{"q": f"question {i}", "a": f"answer {i}"} for i in range(40)]
    manifest = split_table(load_table(str(write_jsonl(tmp_path / "d.jsonl", rows))), seed=3)
    train, test = sorted(manifest.indices["train"]), sorted(manifest.indices["test"])
    a, b = train[-1], test[-1]  # copies: the last train row and the last test row say the same
    rows[b] = dict(rows[a])
    manifest = split_table(load_table(str(write_jsonl(tmp_path / "d.jsonl", rows))), seed=3)
    before = {
        (lk.split_a, lk.split_b): lk
        for lk in check_split(manifest, load_table(str(tmp_path / "d.jsonl"))).leaks
    }
    assert before[("train", "test")].examples[0].rows_a == (a,)
    first = min(manifest.indices["validation"])
    assert first < min(a, b)
    del rows[first]  # every later row moves up by one
    now = check_split(manifest, load_table(str(write_jsonl(tmp_path / "r.jsonl", rows))))
    assert [(c.kind, c.index) for c in now.changes] == [("removed", first)]
    leaks = {(lk.split_a, lk.split_b): lk for lk in now.leaks if lk.n_texts}
    assert list(leaks) == [("train", "test")]
    example = leaks[("train", "test")].examples[0]
    assert (example.rows_a, example.rows_b) == ((a - 1,), (b - 1,))
    assert example.text == normalize_text(f"question {a}") + " | " + normalize_text(f"answer {a}")


def test_a_new_column_is_named(tmp_path: Path, made: tuple[Path, object]) -> None:
    """One optional column added to a row makes every row's hash change (null where missing): the
    report names the column, so the user can tell why every row reads as edited."""
    _, manifest = made
    rows = [dict(r) for r in ROWS]
    rows[0]["note"] = "n"
    report = check_split(manifest, load_table(str(write_jsonl(tmp_path / "n.jsonl", rows))))  # type: ignore[arg-type]
    assert report.columns_added == ("note",) and report.columns_removed == ()
    assert len(report.of_kind("edited")) == len(ROWS)
    assert "  columns: added note (a row's hash covers every column" in report.format()

"""Issue 16: a property test over ``reprotune split`` inputs, with Hypothesis.

Random tables (JSONL or CSV; columns of text, numbers, booleans, nulls, NaN and infinities), random
ratios (valid or not), seeds (in range or not, or not numbers) and stratify or group columns
(present or not): ``split`` exits 0 with a manifest whose index lists partition the rows, or exits
2 with a message. Never a traceback, never exit 1.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reprotune._cli import main

CLASS_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from(["a", "b", "c", "", "A"]),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
)
ROWS = st.lists(
    st.fixed_dictionaries({"text": st.text(max_size=6), "label": CLASS_VALUES, "group": CLASS_VALUES}),
    max_size=40,
)
RATIOS = st.one_of(
    st.sampled_from(["0.8,0.1,0.1", "0.5,0.5,0", "1,0,0", "0.34,0.33,0.33"]),
    st.lists(st.floats(-1, 2, allow_nan=False), min_size=2, max_size=4).map(lambda r: ",".join(map(str, r))),
    st.text(max_size=8),
)
SEEDS = st.one_of(
    st.integers(0, 2**63 - 1).map(str),
    st.integers(-(2**70), 2**70).map(str),
    st.text(max_size=6),
)
COLUMN = st.sampled_from([None, "label", "group", "text", "absent"])


def _write(rows: list[dict[str, Any]], fmt: str, folder: Path) -> Path:
    if fmt == "jsonl":
        path = folder / "data.jsonl"
        path.write_text("".join(json.dumps(row, allow_nan=True) + "\n" for row in rows), encoding="utf-8")
    else:
        path = folder / "data.csv"
        with open(path, "w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["text", "label", "group"])
            writer.writerows([row["text"], row["label"], row["group"]] for row in rows)
    return path


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=ROWS,
    fmt=st.sampled_from(["jsonl", "csv"]),
    ratios=RATIOS,
    seed=SEEDS,
    column=COLUMN,
    how=st.sampled_from(["--stratify-by", "--group-by"]),
    policy=st.sampled_from(["train", "drop", "error"]),
)
def test_split_partitions_the_rows_or_says_why(
    rows: list[dict[str, Any]], fmt: str, ratios: str, seed: str, column: str | None, how: str, policy: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = _write(rows, fmt, folder)
        out = folder / "split.json"
        args = ["split", str(data), "--out", str(out), "--ratios", ratios, "--seed", seed]
        args += ["--rare-class-policy", policy] + ([how, column] if column else [])
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(args)
        err = stderr.getvalue()
        assert "Traceback" not in err and "internal error" not in err, err
        assert code in (0, 2), (code, err)
        if code == 2:
            assert "reprotune split: error:" in err
            assert not out.exists()  # nothing half-written
            return
        manifest = json.loads(out.read_text(encoding="utf-8"))
        lists = [manifest[name] for name in ("train", "validation", "test", "dropped")]
        every = sorted(i for part in lists for i in part)
        assert every == list(range(len(rows)))  # each row in exactly one list
        assert all(part == sorted(part) for part in lists)
        assert manifest["seed"] == int(seed.strip())

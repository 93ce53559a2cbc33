"""The benchmarks' own plumbing, without running a benchmark: bench/run_all.py goes on past a
benchmark whose ``--help`` hangs, and bench/bench_split.py stops before timing anything when
scikit-learn (a test tool, not a runtime dependency) is missing, and says how to get it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchscripts import BENCH, load_bench_script


def test_run_all_goes_on_past_a_help_that_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--quick`` asks each benchmark's ``--help``: one that does not answer in time is killed,
    not run, and counted a miss; the next one still runs."""
    (tmp_path / "bench_a_hangs.py").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    (tmp_path / "bench_b_fine.py").write_text(
        "import sys\nif '--help' in sys.argv:\n    print('usage: [--quick]')\nsys.exit(0)\n", encoding="utf-8"
    )
    run_all = load_bench_script("run_all")
    monkeypatch.setattr(run_all, "BENCH_DIR", tmp_path)
    monkeypatch.setattr(run_all, "HELP_TIMEOUT_S", 1)
    assert run_all.offers_quick(tmp_path / "bench_a_hangs.py") is None
    assert run_all.main(["--quick"]) == 1
    out = capsys.readouterr().out
    assert "bench_a_hangs.py: not run: its --help did not answer in 1 s" in out
    assert "######## bench_b_fine.py --quick" in out
    summary = out.split("######## summary", 1)[1]
    assert "MISSED (not run: --help took over 1 s)" in summary and "met its targets" in summary


def test_bench_split_without_scikit_learn_says_so_before_timing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """After the runtime install alone (no scikit-learn) the split benchmark exits 2 at once,
    naming the dev install and --no-sklearn; with --no-sklearn it runs (a tiny size here)."""
    monkeypatch.syspath_prepend(str(BENCH))  # the bench scripts import bench/_machine.py
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if not installed
    bench_split = load_bench_script("bench_split")
    assert bench_split.main(["--rows", "1000", "--repeat", "1"]) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert "scikit-learn is not installed" in said.err and "./scripts/install.sh dev" in said.err
    assert "--no-sklearn" in said.err
    assert bench_split.main(["--rows", "1000", "--repeat", "1", "--no-sklearn"]) in (0, 1)
    assert "reprotune / numpy" in capsys.readouterr().out

"""bench/portable_bytes.py, the cross-machine check of the quickstart's bytes: which modes this CPU
can hold, and how one machine's bytes are judged against those recorded on others (the runs
themselves are the script's, about a minute each, not the suite's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

from benchscripts import load_bench_script
from reprotune._config.loading import load_config
from reprotune._determinism.cpu import cpu_vendor


def _script() -> ModuleType:
    return load_bench_script("portable_bytes")


def _row(
    mode: str, machine: str, adapter: str, torch: str = "2.13.0", adamw: str | None = "for-loop"
) -> dict[str, Any]:
    row = {"mode": mode, "machine": machine, "adapter_sha256": adapter, "ledger_sha256": adapter * 2}
    return {**row, "torch": torch, **({"adamw": adamw} if adamw else {})}


def test_the_modes_tried_are_those_this_cpu_can_hold() -> None:
    modes = _script().holdable_modes()
    assert modes[0] == "native" and "avx2-compatible" in modes
    assert ("avx2-amd" in modes) == (cpu_vendor() == "AuthenticAMD")
    assert ("avx2" in modes) == (cpu_vendor() == "GenuineIntel")


def test_a_portable_mode_is_judged_against_the_same_mode_elsewhere() -> None:
    """Same mode, same torch: MATCH, or DIFFER (a broken promise, but for native, which differs
    between CPUs by design); another mode's equal bytes are named (a portable mode giving another
    machine's native bytes); another torch is not compared."""
    judge = _script().judge
    recorded = [
        _row("avx2-amd", "EPYC 9", "a"),
        _row("native", "EPYC 7", "a"),
        _row("native", "Xeon", "x"),
        _row("avx2-amd", "EPYC 9 old stack", "z", torch="2.12.0"),
    ]
    lines, broken = judge(_row("avx2-amd", "here", "a"), recorded)
    assert lines == ["    MATCH  avx2-amd on EPYC 9", "    EQUALS native on EPYC 7"] and not broken
    lines, broken = judge(_row("avx2-amd", "here", "b"), recorded)
    assert lines == ["    DIFFER avx2-amd on EPYC 9"] and broken
    lines, broken = judge(_row("native", "here", "n"), recorded)
    assert lines == ["    DIFFER native on EPYC 7", "    DIFFER native on Xeon"] and not broken
    lines, _ = judge(_row("native", "here", "n", torch="2.14.0"), recorded)
    assert lines == ["    nothing recorded with torch 2.14.0, AdamW for-loop: no comparison"]


def test_rows_are_judged_only_against_runs_of_the_same_adamw_form() -> None:
    """avx2-compatible runs AdamW fused since 2026-12-05 (other bytes by design): rows made with
    the for-loop form (rows without the field are those) are not judged against it, nor it against
    them; fused rows are."""
    judge = _script().judge
    recorded = [
        _row("avx2-compatible", "EPYC 7 (2026-12-03)", "old", adamw=None),
        _row("avx2-compatible", "EPYC 9", "new", adamw="fused"),
    ]
    lines, broken = judge(_row("avx2-compatible", "here", "new", adamw="fused"), recorded)
    assert lines == ["    MATCH  avx2-compatible on EPYC 9"] and not broken
    lines, broken = judge(_row("avx2-compatible", "here", "old"), recorded)
    assert lines == ["    MATCH  avx2-compatible on EPYC 7 (2026-12-03)"] and not broken
    lines, broken = judge(_row("avx2-compatible", "here", "other", adamw="fused"), recorded[:1])
    assert lines == ["    nothing recorded with torch 2.13.0, AdamW fused: no comparison"] and not broken


def test_recording_replaces_this_machines_rows_for_the_modes_run(tmp_path: Path) -> None:
    script = _script()
    script.RECORDED = tmp_path / "bytes.json"
    old = [_row("native", "here", "o"), _row("avx2-amd", "here", "k"), _row("native", "there", "t")]
    script.RECORDED.write_text(json.dumps({"recorded": old}))
    script.record_rows("here", [{**_row("native", "x", "n"), "vendor": "AuthenticAMD"}], "today")
    rows = json.loads(script.RECORDED.read_text())["recorded"]
    assert [(r["machine"], r["mode"], r["adapter_sha256"]) for r in rows] == [
        ("here", "avx2-amd", "k"),
        ("here", "native", "n"),
        ("there", "native", "t"),
    ]
    assert (
        rows[1]["when"] == "today" and rows[1]["vendor"] == "AuthenticAMD" and rows[1]["adamw"] == "for-loop"
    )


def test_the_emulated_intel_check_runs_a_valid_cut_of_the_quickstart(tmp_path: Path) -> None:
    """bench/emulated_intel.py's quickstart command: the config it makes is valid at any step
    count (the warmup is cut with it), in avx2-compatible, without MLflow."""
    script = load_bench_script("emulated_intel")
    for steps in (1, 4):
        command = script.quickstart_command(steps, tmp_path / "run")
        assert command[1:4] == ["-m", "reprotune", "run"] and command[-1] == "--no-progress"
        overrides = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
        cfg = load_config(command[4], overrides)
        assert (cfg.train.max_steps, cfg.train.eval_every, cfg.determinism.cpu_isa) == (
            steps,
            steps,
            "avx2-compatible",
        )
        assert cfg.tracking.mlflow is False

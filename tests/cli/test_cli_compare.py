"""`reprotune compare` and `reprotune report` through the CLI: output, exit codes, no torch."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._cli import main
from rundirs import RunSpec, truncate_ledger, write_run_dir


@pytest.fixture
def ref(tmp_path: Path) -> Path:
    """The reference run, default spec."""
    return write_run_dir(tmp_path / "ref")


def test_identical_exit_0(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Identical twins: exit 0, the verdict printed first."""
    twin = write_run_dir(tmp_path / "twin")
    assert main(["compare", str(ref), str(twin)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "IDENTICAL"


def test_diverged_exit_1_with_why(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A different seed: exit 1, with the where table and the seed named under why."""
    other = write_run_dir(tmp_path / "seed43", RunSpec(seed=43))
    assert main(["compare", str(ref), str(other)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "DIVERGED"
    assert re.search(r"^  first step with different weights hash +0$", out, re.MULTILINE)
    assert (
        "  1. the LoRA initial weights differ (step 0), and the data order from step 1: root seed 42 vs 43"
        in out
    )
    assert "    seeds.root: 42 -> 43" in out


def test_json_output(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one JSON object with the verdict and where."""
    other = write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=4))
    assert main(["compare", "--json", str(ref), str(other)]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "DIVERGED"
    assert data["where"]["first_divergence_step"] == 4
    assert data["run_b"]["path"] == str(other)


def test_within_tolerance_exit_0(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Small numeric noise under --tolerance: WITHIN TOLERANCE, exit 0."""
    other = write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=3, noise=1e-5))
    assert main(["compare", "--tolerance", "1e-3", str(ref), str(other)]) == 0
    assert capsys.readouterr().out.startswith("WITHIN TOLERANCE (tolerance 0.001)\n")


def test_incomparable_exit_1(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Runs of different base models: INCOMPARABLE, exit 1, the reason printed."""
    other = write_run_dir(tmp_path / "model", RunSpec(model_sha256="e" * 64))
    assert main(["compare", str(ref), str(other)]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "INCOMPARABLE"
    assert "  incomparable: different base model: model.weights_sha256 " in out


def test_not_a_run_dir_exit_2(tmp_path: Path, ref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory that is not a run: exit 2, a message naming it and the fix."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["compare", str(ref), str(empty)]) == 2
    err = capsys.readouterr().err
    assert f"reprotune compare: error: {empty} is not a run directory: it has no record.json" in err
    assert "fix: pass the directory `reprotune run` wrote" in err
    study = tmp_path / "study"  # a seed study: compare said only "not a run directory"
    (study / "runs").mkdir(parents=True)
    (study / "study.json").write_text("{}")
    assert main(["compare", str(ref), str(study)]) == 2
    err = capsys.readouterr().err
    assert "fix: a seed study is compared with another by `reprotune significance STUDY_A STUDY_B`" in err
    assert f"its runs are in {study / 'runs'}" in err


def test_unknown_schema_exit_2(tmp_path: Path, ref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record of an unknown schema version: exit 2, naming the file and the versions."""
    other = tmp_path / "future"
    shutil.copytree(ref, other)
    record = json.loads((other / "record.json").read_text())
    record["schema_version"] = 9
    (other / "record.json").write_text(json.dumps(record))
    assert main(["compare", str(ref), str(other)]) == 2
    err = capsys.readouterr().err
    assert "record schema_version 9 is not supported" in err
    assert str(other / "record.json") in err


def test_truncated_ledger_exit_2(tmp_path: Path, ref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A truncated ledger: exit 2, naming the file and line."""
    other = tmp_path / "cut"
    shutil.copytree(ref, other)
    n_lines = len((other / "ledger.jsonl").read_text().splitlines())
    truncate_ledger(other, 30)
    assert main(["compare", str(ref), str(other)]) == 2
    err = capsys.readouterr().err
    assert f"{other / 'ledger.jsonl'}:{n_lines}: line {n_lines} is incomplete" in err


def test_bad_tolerance_exit_2(ref: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A negative tolerance: exit 2."""
    assert main(["compare", "--tolerance", "-1", str(ref), str(ref)]) == 2
    assert "tolerance -1.0 is not a finite number >= 0" in capsys.readouterr().err


def test_report_cli(ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`reprotune report A B -o FILE` writes the file and says where."""
    other = write_run_dir(tmp_path / "seed43", RunSpec(seed=43))
    out = tmp_path / "out" / "report.html"
    assert main(["report", str(ref), str(other), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert capsys.readouterr().out == f"report written to {out}\n"


def test_report_cli_bad_input_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`reprotune report` on a path that is not a run: exit 2."""
    assert main(["report", str(tmp_path / "missing"), "-o", str(tmp_path / "r.html")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_compare_and_report_never_import_torch(ref: Path, tmp_path: Path) -> None:
    """compare (of runs and of traces) and report, run through the CLI in a fresh process, leave
    torch unimported."""
    from reprotune._formats import TRACE
    from reprotune._run.tracefile import TraceOp, write_trace

    other = write_run_dir(tmp_path / "seed43", RunSpec(seed=43))
    op = TraceOp(
        kind="op",
        i=0,
        phase="forward.0",
        module="model.lm_head",
        op="aten::mm",
        n=0,
        args="['T', 'T']",
        inputs=(("2x2", "float32", "a"),),
        outputs=(),
    )
    header = _trace_header(TRACE.schema, TRACE.version)
    for name in ("a.jsonl", "b.jsonl"):
        write_trace(tmp_path / name, header, [op])
    script = (
        "import sys\n"
        "from reprotune._cli import main\n"
        f"codes = [main(['compare', {str(ref)!r}, {str(other)!r}]),\n"
        f"         main(['report', {str(ref)!r}, {str(other)!r}, '-o', {str(tmp_path / 'r.html')!r}]),\n"
        f"         main(['compare', {str(tmp_path / 'a.jsonl')!r}, {str(tmp_path / 'b.jsonl')!r}])]\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', codes)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "NO-TORCH [1, 0, 0]"


def _trace_header(schema: str, version: int) -> dict[str, object]:
    """A whole trace header of step 1, as `reprotune trace` writes one (its fields checked on read)."""
    return {
        "schema": schema,
        "schema_version": version,
        "run_id": "r",
        "step": 1,
        "replayed_from": 0,
        "reproduced": {"step": True, "before": True},
        "weights_in_sha256": "0" * 64,
        "kernels": {"version": 1},
    }


def test_a_trace_against_a_run_a_missing_one_another_step_or_tolerance_are_refused(
    ref: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace compared with a run directory, an eval directory compared with one, a trace that
    does not exist, traces of two steps, and ``--tolerance``: exit 2, naming what is at fault and
    the fix."""
    from reprotune._formats import TRACE
    from reprotune._run.tracefile import TraceOp, write_trace

    op = TraceOp(
        kind="op", i=0, phase="forward.0", module="m", op="aten::mm", n=0, args="", inputs=(), outputs=()
    )
    header = _trace_header(TRACE.schema, TRACE.version)
    for name in ("a.jsonl", "b.jsonl"):
        write_trace(tmp_path / name, header, [op])
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "eval.json").write_text("{}")

    assert main(["compare", str(tmp_path / "a.jsonl"), str(ref)]) == 2
    err = capsys.readouterr().err
    assert f"{ref} is not a trace (written by `reprotune trace`), but the other one is" in err
    assert "compare two traces of the same step, one from each machine" in err

    assert main(["compare", str(ref), str(tmp_path / "eval")]) == 2
    err = capsys.readouterr().err
    assert f"{ref} is not an eval directory (no eval.json), but the other one is" in err
    assert "compare two eval directories (RUN/evals/<id>), or two run directories" in err
    assert main(["compare", str(tmp_path / "eval"), str(tmp_path / "eval"), "--tolerance", "0.1"]) == 2
    assert "--tolerance applies to runs; evals are compared token by token" in capsys.readouterr().err

    for other in (tmp_path / "b.jsonl", ref):  # beside a trace or a run: a trace's name is no directory
        assert main(["compare", str(tmp_path / "nope.jsonl"), str(other)]) == 2
        err = capsys.readouterr().err
        assert f"no such trace file: {tmp_path / 'nope.jsonl'}" in err and "no such directory" not in err

    write_trace(tmp_path / "c.jsonl", {**header, "step": 2}, [op])
    assert main(["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "c.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "the traces are of different steps: 1 (" in err and "trace the same step on both machines" in err

    assert main(["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--tolerance", "0.1"]) == 2
    assert "--tolerance applies to runs; traces are compared op by op, bit for bit" in capsys.readouterr().err

    cut = tmp_path / "cut.jsonl"  # a trace whose header line was cut: read as a trace, said where
    cut.write_text((tmp_path / "a.jsonl").read_text()[:30])
    for pair in ((cut, tmp_path / "b.jsonl"), (cut, cut)):
        assert main(["compare", *map(str, pair)]) == 2
        err = capsys.readouterr().err
        assert f"{cut}:1: the first line is not JSON" in err and "trace the step again if it was cut" in err

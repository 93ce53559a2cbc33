"""Tests for ``reprotune resume``: a run stopped mid-way and resumed in a fresh process is bitwise
identical to an uninterrupted one; skipping the RNG restore is caught; misuse exits 2.

Real runs of the tiny model (8 steps, a checkpoint at step 4, LoRA dropout 0.1), each in a fresh
``python -m reprotune`` process (about 5 s each, mostly imports).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from reprotune._cli import main
from reprotune._jsonio import sha256_file
from reprotune._proof.compare import compare_runs
from reprotune._run.layout import LEDGER as LEDGER_FILE
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record, write_record
from tinyrun import TinyProject

pytestmark = pytest.mark.slow

ADAPTER = Path("adapter") / "adapter_model.safetensors"
QUIET = ("--no-progress", "--no-tracking")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    """A tiny model, data and the base config (8 steps, save_every 4, eval_every 4) for this module."""
    return TinyProject.create(tmp_path_factory.mktemp("resume-project"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this module's run directories go."""
    return tmp_path_factory.mktemp("resume-runs")


@pytest.fixture(scope="module")
def reference(project: TinyProject, runs: Path) -> Path:
    """The uninterrupted run of the base config."""
    run_dir = runs / "reference"
    project.run_cli("run", str(project.config()), "--run-dir", str(run_dir), *QUIET)
    return run_dir


@pytest.fixture(scope="module")
def stopped(project: TinyProject, runs: Path) -> Path:
    """The base config stopped after step 4 (its checkpoint), as if interrupted. Copy before use."""
    run_dir = runs / "stopped"
    project.run_cli("run", str(project.config()), "--run-dir", str(run_dir), "--stop-after-step", "4", *QUIET)
    return run_dir


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to)
    return to


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [dict(e.fields) for e in read_ledger(run_dir / LEDGER_FILE).entries()]


def _assert_identical(reference: Path, run_dir: Path) -> None:
    """Every ledger line (train and val) and the adapter bytes equal, and compare says IDENTICAL."""
    assert (run_dir / LEDGER_FILE).read_bytes() == (reference / LEDGER_FILE).read_bytes()
    assert sha256_file(run_dir / ADAPTER) == sha256_file(reference / ADAPTER)
    record, ref_record = load_record(run_dir / "record.json"), load_record(reference / "record.json")
    assert record["status"] == "completed"
    assert record["outputs"]["adapter_sha256"] == ref_record["outputs"]["adapter_sha256"]
    assert record["outputs"]["ledger_sha256"] == ref_record["outputs"]["ledger_sha256"]
    assert str(compare_runs(reference, run_dir).verdict) == "IDENTICAL"


def test_stopped_run_is_unfinished_and_ends_at_its_step(stopped: Path) -> None:
    """A run stopped after step 4 says so and holds steps 1-4, their validation line and a checkpoint."""
    assert load_record(stopped / "record.json")["status"] == "stopped"
    lines = _lines(stopped)
    assert [(e["kind"], e["step"]) for e in lines] == [
        ("init", 0),
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("val", 4),
    ]
    assert [p.name for p in (stopped / "checkpoints").iterdir()] == ["step-00000004"]
    assert not (stopped / ADAPTER).exists()


def test_resume_in_a_fresh_process_is_identical(
    project: TinyProject, reference: Path, stopped: Path, tmp_path: Path
) -> None:
    """Stopped after step 4, resumed in a new process: every ledger line and the adapter bitwise equal."""
    run_dir = _copy(stopped, tmp_path / "resumed")
    done = project.run_cli("resume", str(run_dir), *QUIET)
    assert f"resuming {run_dir} from step 4 (step-00000004)" in done.stderr
    assert "completed after 8 steps" in done.stdout
    _assert_identical(reference, run_dir)
    attempts = load_record(run_dir / "record.json")["attempts"]
    assert [a["resumed"] for a in attempts] == [False, True]
    code = main(["compare", str(reference), str(run_dir)])
    assert code == 0


def test_resume_without_rng_restore_diverges_after_the_checkpoint(
    project: TinyProject, reference: Path, stopped: Path, tmp_path: Path
) -> None:
    """Skipping the RNG restore (dropout 0.1) diverges at step 5: same batches, other numbers."""
    run_dir = _copy(stopped, tmp_path / "no-rng")
    project.run_cli("resume", str(run_dir), "--skip-rng-restore", *QUIET)
    result = compare_runs(reference, run_dir)
    assert str(result.verdict) == "DIVERGED"
    assert result.where.first_divergence_step == 5
    ref_lines, lines = _lines(reference), _lines(run_dir)
    assert lines[:6] == ref_lines[:6]  # init, steps 1-4, val at 4: from before the checkpoint
    ref_train = [e for e in ref_lines if e["kind"] == "train"]
    train = [e for e in lines if e["kind"] == "train"]
    assert [e["batch_sha256"] for e in train] == [e["batch_sha256"] for e in ref_train]  # data order intact
    assert train[4]["loss"] != ref_train[4]["loss"]
    assert sha256_file(run_dir / ADAPTER) != sha256_file(reference / ADAPTER)
    assert main(["compare", str(reference), str(run_dir)]) == 1


def test_resume_with_grad_accumulation_drops_lines_past_the_checkpoint(
    project: TinyProject, runs: Path, tmp_path: Path
) -> None:
    """With 2 micro-batches per step, stopped at step 6 (checkpoint 4): steps 5-6 are redone, identical."""
    config = project.config("accum.yaml", train={"batch_size": 2, "grad_accum_steps": 2})
    reference = runs / "accum-reference"
    project.run_cli("run", str(config), "--run-dir", str(reference), *QUIET)
    run_dir = tmp_path / "accum-resumed"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), "--stop-after-step", "6", *QUIET)
    assert [e["step"] for e in _lines(run_dir) if e["kind"] == "train"] == [1, 2, 3, 4, 5, 6]

    done = project.run_cli("resume", str(run_dir), *QUIET)
    assert "from step 4 (step-00000004)" in done.stderr
    _assert_identical(reference, run_dir)
    assert {e["n_rows"] for e in _lines(reference) if e["kind"] == "train"} == {4}


# --- misuse: exit 2 with a message that says what to do -------------------------------------------


@pytest.mark.parametrize("status", ["stopped", "running", "failed"])
def test_run_into_an_unfinished_run_dir_says_resume(
    project: TinyProject, stopped: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], status: str
) -> None:
    """``run`` on a directory holding an unfinished run exits 2 and tells the user to resume it."""
    run_dir = _copy(stopped, tmp_path / "unfinished")
    record = load_record(run_dir / "record.json")
    record["status"] = status
    write_record(run_dir / "record.json", record)
    before = (run_dir / LEDGER_FILE).read_bytes()
    assert main(["run", str(project.config()), "--run-dir", str(run_dir), *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"holds an unfinished run (status {status!r})" in err
    assert f"reprotune resume {run_dir}" in err
    assert (run_dir / LEDGER_FILE).read_bytes() == before  # nothing was touched


def test_run_into_a_completed_run_dir_exits_2(
    project: TinyProject, reference: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run`` on a directory holding a completed run exits 2 and asks for a new directory."""
    assert main(["run", str(project.config()), "--run-dir", str(reference), *QUIET]) == 2
    err = capsys.readouterr().err
    assert "already holds a completed run" in err and "--run-dir" in err


def test_resume_of_a_completed_run_exits_2(reference: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``resume`` on a completed run exits 2: nothing to resume; the run is left as it was."""
    before = sha256_file(reference / "record.json")
    assert main(["resume", str(reference), *QUIET]) == 2
    err = capsys.readouterr().err
    assert "already complete; nothing to resume" in err
    assert sha256_file(reference / "record.json") == before


@pytest.mark.parametrize("kind", ["empty", "missing", "other-files", "config"])
def test_resume_of_a_non_run_dir_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """``resume`` on what holds no run exits 2 saying what it is instead: a missing path, a
    directory without record.json, a config (which `reprotune run` starts)."""
    target = tmp_path / ("cfg.yaml" if kind == "config" else "not-a-run")
    if kind in ("empty", "other-files"):
        target.mkdir()
    if kind == "other-files":
        (target / "notes.txt").write_text("hello\n", encoding="utf-8")
    if kind == "config":
        target.write_text("seed: {root: 1}\n", encoding="utf-8")
    assert main(["resume", str(target), *QUIET]) == 2
    err = capsys.readouterr().err
    expected = {
        "missing": (f"no such directory: {target}", "fix: pass the directory `reprotune run` wrote"),
        "config": (
            f"{target} is a file, not a run directory",
            f"fix: a config starts a run (`reprotune run {target}`); give the directory that run wrote",
        ),
    }.get(kind, (f"{target} is not a run directory: it has no record.json", "fix: pass the directory"))
    for text in expected:
        assert text in err, err


def test_resume_keeps_what_the_first_attempt_recorded(tmp_path: Path) -> None:
    """A resume adds an attempt; the data section (manifest source, the rare-class warning) stays
    as the first attempt wrote it, so compare finds no data difference with an uninterrupted run.
    A record made before ``lora_defaults`` gets none from a resume (the PEFT at hand may not be
    the one that wrote its ``lora``)."""
    project = TinyProject.create(tmp_path / "p")
    with open(project.root / "data.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"prompt": "solo", "response": "one", "category": "solo"}) + "\n")
    project.config("rare.yaml", train={"max_steps": 6, "save_every": 3, "eval_every": 3})
    project.run_cli("run", "rare.yaml", "--run-dir", "runs/full", "--no-progress")
    project.run_cli(
        "run", "rare.yaml", "--run-dir", "runs/resumed", "--no-progress", "--stop-after-step", "3"
    )
    stopped = project.root / "runs" / "resumed" / "record.json"
    older = json.loads(stopped.read_text(encoding="utf-8"))
    del older["lora_defaults"]
    stopped.write_text(json.dumps(older, indent=2), encoding="utf-8")
    resumed_cli = project.run_cli("resume", "runs/resumed", "--no-progress")
    assert "differs from the run's start" not in resumed_cli.stderr  # the run's own split.json, read
    full = load_record(project.root / "runs" / "full" / "record.json")
    resumed = load_record(project.root / "runs" / "resumed" / "record.json")
    assert resumed["data"] == full["data"]
    assert resumed["data"]["manifest_source"] == "made for this run with the derived split seed"
    assert (
        len(resumed["data"]["split_warnings"]) == 1
        and "'solo' (1 row)" in resumed["data"]["split_warnings"][0]
    )
    assert [(a["resumed"], a.get("from_step")) for a in resumed["attempts"]] == [(False, None), (True, 3)]
    assert "drift" not in resumed["attempts"][1] or resumed["attempts"][1]["drift"] == []
    assert "lora_defaults" not in resumed and "lora_defaults" in full
    result = compare_runs(project.root / "runs" / "full", project.root / "runs" / "resumed")
    assert str(result.verdict) == "IDENTICAL"
    assert not [d for d in result.differences if d.category == "data"]


def _same_numbers(reference: Path, run_dir: Path) -> None:
    """Every ledger line and the adapter bitwise the reference's (the configs differ only in where
    they save checkpoints)."""
    assert (run_dir / LEDGER_FILE).read_bytes() == (reference / LEDGER_FILE).read_bytes()
    assert sha256_file(run_dir / ADAPTER) == sha256_file(reference / ADAPTER)
    assert load_record(run_dir / "record.json")["status"] == "completed"


def _resume_in_this_process(project: TinyProject, run_dir: Path, stop_after_step: int) -> None:
    import torch

    from reprotune._train.options import RunOptions
    from reprotune._train.run import resume_run

    options = RunOptions(
        run_dir=run_dir,
        progress=False,
        tracking=False,
        stop_after_step=stop_after_step,
        code_dir=project.root,
    )
    with torch.random.fork_rng():
        resume_run(run_dir, options)


def test_a_checkpoint_past_the_ledger_is_refused_and_newer_ones_dropped(
    project: TinyProject, reference: Path, tmp_path: Path
) -> None:
    """A resume falls back from a damaged step-6 to step 4 and is stopped at 5; the damage mended,
    the next resume must not take step 6, whose ledger lines were dropped (before, it did: the run
    "completed" with steps 1-5 and 7, and compare refused its ledger). A ledger cut short of its
    checkpoint is refused the same way: the resume starts over, and both end as the reference."""
    config = project.config("every-2.yaml", train={"save_every": 2, "keep_checkpoints": 3})
    run_dir = tmp_path / "stale"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), "--stop-after-step", "6", *QUIET)
    optimizer = run_dir / "checkpoints" / "step-00000006" / "optimizer.pt"
    optimizer.rename(tmp_path / "optimizer.pt")
    _resume_in_this_process(project, run_dir, stop_after_step=5)
    assert not optimizer.parent.exists()  # step 6 is of the abandoned future: gone
    done = project.run_cli("resume", str(run_dir), *QUIET)
    assert f"resuming {run_dir} from step 4" in done.stderr
    _same_numbers(reference, run_dir)

    short = tmp_path / "short"
    project.run_cli("run", str(config), "--run-dir", str(short), "--stop-after-step", "4", *QUIET)
    lines = (short / LEDGER_FILE).read_text().splitlines(keepends=True)
    (short / LEDGER_FILE).write_text("".join(lines[:3]))  # init, steps 1-2: short of step 4
    done = project.run_cli("resume", str(short), *QUIET)
    assert "the ledger holds 2 training step(s), not every step up to the checkpoint's 4" in done.stderr
    assert f"resuming {short} from step 2" in done.stderr  # the checkpoint the ledger reaches
    _same_numbers(reference, short)
    gone = tmp_path / "gone"  # the ledger lost: an internal error before; now the run starts over
    project.run_cli("run", str(config), "--run-dir", str(gone), "--stop-after-step", "4", *QUIET)
    (gone / LEDGER_FILE).unlink()
    done = project.run_cli("resume", str(gone), *QUIET)
    assert "the run has no ledger.jsonl to go on from" in done.stderr
    assert f"no checkpoint to resume {gone} from: starting from step 0" in done.stderr  # was silent
    assert load_record(gone / "record.json")["attempts"][-1]["started_over"] is True
    _same_numbers(reference, gone)


def test_keep_one_keeps_the_checkpoint_just_written(
    project: TinyProject, reference: Path, tmp_path: Path
) -> None:
    """keep_checkpoints 1 and a damaged step-6 from the attempt before: the resume starts over and
    the step-3 checkpoint it writes stays (before, the damaged, newer-named step 6 was kept and step
    3 pruned the moment it landed, so every resume started over)."""
    config = project.config("keep-1.yaml", train={"save_every": 3, "keep_checkpoints": 1})
    run_dir = tmp_path / "keep1"
    project.run_cli("run", str(config), "--run-dir", str(run_dir), "--stop-after-step", "6", *QUIET)
    weights = run_dir / "checkpoints" / "step-00000006" / "trainable.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    _resume_in_this_process(project, run_dir, stop_after_step=4)
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["step-00000003"]
    done = project.run_cli("resume", str(run_dir), *QUIET)
    assert f"resuming {run_dir} from step 3" in done.stderr
    _same_numbers(reference, run_dir)


def test_a_damaged_ledger_line_after_the_checkpoint_does_not_block_the_resume(
    project: TinyProject, reference: Path, stopped: Path, tmp_path: Path
) -> None:
    """Lines past the checkpoint were never synced; a crash can leave one of them zeros. The resume
    drops it with the rest, says so, and ends identical (before, it refused the whole run). A
    damaged line the checkpoint's sync made durable (step 4's val line) is still refused."""
    run_dir = _copy(stopped, tmp_path / "torn")
    step_5 = (reference / LEDGER_FILE).read_bytes().split(b"\n")[6] + b"\n"  # init, 1-4, val 4, then 5
    with open(run_dir / LEDGER_FILE, "ab") as handle:
        handle.write(step_5 + b"\0" * 200 + b"\n" + b'{"kind": "tra')
    done = project.run_cli("resume", str(run_dir), *QUIET)
    assert "left out 1 damaged line(s) after step 4" in done.stderr
    _assert_identical(reference, run_dir)

    val_lost = _copy(stopped, tmp_path / "val-lost")
    lines = (val_lost / LEDGER_FILE).read_bytes().split(b"\n")
    lines[5] = b"\0" * len(lines[5])  # line 6: the val line of step 4
    (val_lost / LEDGER_FILE).write_bytes(b"\n".join(lines))
    assert main(["resume", str(val_lost), *QUIET]) == 2


def test_a_resume_refused_before_it_trains_keeps_the_steps_the_run_did(
    project: TinyProject, stopped: Path, tmp_path: Path
) -> None:
    """A resume refused before its checkpoint is restored (here: a damaged split.json) records the
    failed attempt, but the run has still done its 4 steps: ``timings.steps_done`` stays 4 (it
    was written 0, as if nothing had trained), and the resume after the split is put back is
    IDENTICAL to the stopped run resumed at once."""
    run_dir = _copy(stopped, tmp_path / "run")
    split = run_dir / "split.json"
    kept = split.read_bytes()
    split.write_bytes(kept[: len(kept) // 2])
    refused = project.run_cli("resume", str(run_dir), *QUIET, check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    record = load_record(run_dir / "record.json")
    assert record["status"] == "failed" and record["timings"]["steps_done"] == 4
    split.write_bytes(kept)
    project.run_cli("resume", str(run_dir), *QUIET)
    assert load_record(run_dir / "record.json")["timings"]["steps_done"] == 8


def test_a_resume_on_another_base_model_is_refused(tmp_path: Path) -> None:
    """The base model's files changed at the same path between the stop and the resume: refused
    (exit 2), naming the hash recorded and the hash now, before any step (before, a warning, and
    the run completed having trained two models: compare then parted from the resume's step)."""
    from reprotune.testing import build_tiny_model

    project = TinyProject.create(tmp_path / "p")
    run_dir = project.root / "runs" / "x"
    config = str(project.config())
    project.run_cli("run", config, "--run-dir", str(run_dir), "--stop-after-step", "4", *QUIET)
    ledger = (run_dir / LEDGER_FILE).read_bytes()
    recorded = load_record(run_dir / "record.json")["model"]["weights_sha256"]
    shutil.rmtree(project.root / "tiny-model")
    build_tiny_model(project.root / "tiny-model", seed=7)

    refused = project.run_cli("resume", str(run_dir), *QUIET, check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "is not the one the run started with" in refused.stderr
    assert f"model.weights_sha256: recorded {recorded[:12]}..." in refused.stderr
    assert "fix: put the files the run started with back in place" in refused.stderr
    assert (run_dir / LEDGER_FILE).read_bytes() == ledger
    assert load_record(run_dir / "record.json")["timings"]["steps_done"] == 4

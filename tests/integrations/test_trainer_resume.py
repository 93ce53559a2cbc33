"""What a Trainer resume restores, checked before its first step and recorded: a checkpoint
without the optimizer's state, or with an RNG file other than the one saved there, is warned about
at once, recorded in the attempt, and is the first cause when the run diverges (the Trainer itself
logs a missing file at INFO level at most, and restores another RNG file without a word)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_scripts import OFFLINE_ENV, ScriptProject

from reprotune._errors import InputError
from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._proof.compare import compare_runs
from reprotune._run.checkpoint_files import TRAINER_CHECKPOINT_MARKER as CHECKPOINT_MARKER
from reprotune._run.record import load_record
from reprotune.integrations import controls
from reprotune.integrations._resumable import refuse_another_world_size
from warm import run_module, run_script

pytestmark = pytest.mark.slow  # Trainer runs, four of them in fresh processes


def test_a_resume_without_the_optimizer_and_with_another_rng_file_is_warned_recorded_and_blamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = ScriptProject.create(tmp_path)
    project.run("hf_trainer.py", "whole")
    monkeypatch.setenv(controls.STOP_AFTER, "3")
    project.run("hf_trainer.py", "cut")
    monkeypatch.delenv(controls.STOP_AFTER)

    checkpoint = project.root / "out" / "cut" / "checkpoint-3"
    marker = json.loads((checkpoint / CHECKPOINT_MARKER).read_text(encoding="utf-8"))
    assert [r["rank"] for r in marker["ranks"]] == [0]
    assert marker["ranks"][0]["rng_sha256"] == sha256_file(checkpoint / "rng_state.pth")

    (checkpoint / "optimizer.pt").unlink()
    states = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    states["cpu"] = torch.Generator().manual_seed(12345).get_state()  # another run's draws
    torch.save(states, checkpoint / "rng_state.pth")
    monkeypatch.setenv(controls.RESUME_FROM, str(checkpoint))
    resumed = project.run("hf_trainer.py", "cut")

    assert f"the run resumes without optimizer.pt: {checkpoint} has none" in resumed.stderr
    assert "the run resumes with another RNG state than it saved: rng_state.pth" in resumed.stderr
    attempt = load_record(project.root / "cut")["attempts"][-1]
    assert attempt["rng_restored"] is False and attempt["rng_changed"] == ["rng_state.pth"]
    assert attempt["state_missing"] == ["optimizer.pt"] and "rng_missing" not in attempt
    assert [r["missing"] for r in attempt["ranks"]] == [["optimizer.pt"]]

    comparison = compare_runs(project.root / "whole", project.root / "cut")
    assert comparison.verdict.value == "DIVERGED" and comparison.where.first_divergence_step == 4
    first = comparison.causes[0]
    assert first.startswith(
        "numbers differ from step 4 with identical data order: "
        "run B resumed from its step-3 checkpoint with another RNG state for it"
    )
    assert "without optimizer.pt: the optimizer's moments and step count start again from zero" in first


def test_an_exact_resume_records_every_piece_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same stop and resume with the checkpoint untouched: nothing missing, nothing warned,
    IDENTICAL to the uninterrupted run."""
    project = ScriptProject.create(tmp_path)
    project.run("hf_trainer.py", "whole")
    monkeypatch.setenv(controls.STOP_AFTER, "3")
    project.run("hf_trainer.py", "cut")
    monkeypatch.delenv(controls.STOP_AFTER)
    monkeypatch.setenv(controls.RESUME_FROM, str(project.root / "out" / "cut" / "checkpoint-3"))
    resumed = project.run("hf_trainer.py", "cut")

    assert "resumes without" not in resumed.stderr and "another RNG state" not in resumed.stderr
    attempt = load_record(project.root / "cut")["attempts"][-1]
    assert attempt["rng_restored"] is True and [r["missing"] for r in attempt["ranks"]] == [[]]
    assert not {"rng_missing", "rng_changed", "state_missing"} & attempt.keys()
    # the last step done, counted from the run's start, as `reprotune run` records it (it said 3)
    assert load_record(project.root / "cut")["timings"]["steps_done"] == 6
    assert compare_runs(project.root / "whole", project.root / "cut").verdict.value == "IDENTICAL"


def test_resume_from_checkpoint_true_is_checked_against_the_checkpoint_the_trainer_takes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trainer.train(resume_from_checkpoint=True)`` (the Trainer takes its last checkpoint): the
    callback checks that checkpoint, here one whose RNG file was replaced, not a path named "True"."""
    from trainer_scripts import tiny_trainer

    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"
    run_dir, out = tmp_path / "run", tmp_path / "out"

    def trainer() -> Any:
        make = lambda: ReprotuneCallback(run_dir, code_dir=tmp_path)  # noqa: E731
        return tiny_trainer(model_dir, tiny_rows(40, seed=1), out, make, max_steps=8)

    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer().train()
    monkeypatch.delenv(controls.STOP_AFTER)
    checkpoint = out / "checkpoint-4"
    states = torch.load(checkpoint / "rng_state.pth", weights_only=False)
    states["cpu"] = torch.Generator().manual_seed(12345).get_state()
    torch.save(states, checkpoint / "rng_state.pth")
    capsys.readouterr()
    trainer().train(resume_from_checkpoint=True)

    assert f"another RNG state than it saved: rng_state.pth in {checkpoint} is not" in capsys.readouterr().err
    attempt = load_record(run_dir)["attempts"][-1]
    assert attempt["from_checkpoint"] == str(checkpoint) and attempt["rng_changed"] == ["rng_state.pth"]


def test_resuming_a_completed_run_is_refused_and_leaves_its_record_as_it_was(tmp_path: Path) -> None:
    """A Trainer resumed from a checkpoint of a run that has completed: nothing to resume, said
    with the Trainer's own fix; the record and ledger are untouched."""
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune._run.layout import RunLayout
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"
    run_dir, out = tmp_path / "run", tmp_path / "out"

    def trainer() -> Any:
        make = lambda: ReprotuneCallback(run_dir, code_dir=tmp_path)  # noqa: E731
        return tiny_trainer(
            model_dir, tiny_rows(40, seed=1), out, make, max_steps=8, save_strategy="steps", save_steps=4
        )

    trainer().train()
    paths = RunLayout(run_dir)
    before = {path: path.read_bytes() for path in (paths.record, paths.ledger)}
    assert load_record(run_dir)["status"] == "completed"

    with pytest.raises(InputError) as refused:
        trainer().train(resume_from_checkpoint=str(out / "checkpoint-4"))

    assert str(refused.value) == (
        f"{paths.record}: the run in {run_dir} is already complete; nothing to resume\n"
        "fix: resume from its checkpoint into a new run_dir (a branch of this run, its history copied), "
        "or run the script again into a new run directory"
    )
    assert {path: path.read_bytes() for path in before} == before


def test_resuming_from_another_runs_checkpoint_is_refused_and_into_a_new_directory_branches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run B, stopped at step 4, resumed from the step-4 checkpoint of run A, another run (A's
    weights, optimizer and RNG): refused, naming both runs; B's record and ledger stay as they were.
    The same checkpoint resumed into a new directory branches from A (before, that was refused
    too, pointing to A's directory, where a completed run was refused in its turn)."""
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune._run.layout import RunLayout
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(name: str, seed: int) -> Any:
        make = lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path)  # noqa: E731
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),
            tmp_path / f"out-{name}",
            make,
            seed=seed,
            save_strategy="steps",
            save_steps=4,
        )

    trainer("a", seed=2).train()  # another seed: another config, so another run id
    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer("b", seed=1).train()
    monkeypatch.delenv(controls.STOP_AFTER)
    paths = RunLayout(tmp_path / "b")
    before = {path: path.read_bytes() for path in (paths.record, paths.ledger)}
    run_a, run_b = load_record(tmp_path / "a")["run_id"], load_record(tmp_path / "b")["run_id"]
    assert run_a != run_b

    foreign = tmp_path / "out-a" / "checkpoint-4"
    with pytest.raises(InputError) as refused:
        trainer("b", seed=1).train(resume_from_checkpoint=str(foreign))

    message = str(refused.value)
    assert f"the checkpoint {foreign} was saved by run {run_a} ({(tmp_path / 'a').resolve()}), " in message
    assert f"not by run {run_b} ({tmp_path / 'b'}), which resumes from it" in message
    assert {path: path.read_bytes() for path in before} == before

    # Into a new directory: a branch of run A (completed, so its own directory cannot resume). Its
    # history through step 4 is copied under a new run id; it finishes IDENTICAL to A, which is
    # left as it was.
    a_files = {path: path.read_bytes() for path in (tmp_path / "a").rglob("*") if path.is_file()}
    trainer("c", seed=2).train(resume_from_checkpoint=str(foreign))
    record = load_record(tmp_path / "c")
    assert record["status"] == "completed" and record["run_id"] != run_a
    assert record["attempts"][-1]["branched_from"] == {
        "run_id": run_a,
        "run_dir": str((tmp_path / "a").resolve()),
        "status": "completed",
    }
    assert record["attempts"][-1]["from_step"] == 4 and record["attempts"][-1]["rng_restored"] is True
    assert compare_runs(tmp_path / "a", tmp_path / "c").verdict.value == "IDENTICAL"
    assert {path: path.read_bytes() for path in a_files} == a_files

    (tmp_path / "a").rename(tmp_path / "a-moved")  # the run that saved it is gone: name where it was
    with pytest.raises(InputError) as refused:
        trainer("d", seed=2).train(resume_from_checkpoint=str(foreign))
    assert f"the run that saved the checkpoint is not found at {(tmp_path / 'a').resolve()}" in str(
        refused.value
    )
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
    assert f"or set {controls.BRANCH_FROM} to where it lies now" in str(refused.value)
    # told where A lies now (as `reprotune trace --command` tells it), the branch is made from there
    monkeypatch.setenv(controls.BRANCH_FROM, str(tmp_path / "a-moved"))
    trainer("d", seed=2).train(resume_from_checkpoint=str(foreign))
    monkeypatch.delenv(controls.BRANCH_FROM)
    branched = load_record(tmp_path / "d")["attempts"][-1]["branched_from"]
    assert branched == {
        "run_id": run_a,
        "run_dir": str((tmp_path / "a-moved").resolve()),
        "status": "completed",
    }
    assert compare_runs(tmp_path / "a-moved", tmp_path / "d").verdict.value == "IDENTICAL"
    run_c = record["run_id"]
    (tmp_path / "c").rename(tmp_path / "a")  # another run where A was: no history of A to copy
    with pytest.raises(InputError) as refused:
        trainer("e", seed=2).train(resume_from_checkpoint=str(foreign))
    assert (
        f"the checkpoint was saved by run {run_a}, but {(tmp_path / 'a').resolve()} now holds run {run_c}"
        in str(refused.value)
    )
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())
    # REPROTUNE_BRANCH_FROM naming that other run: refused, naming the variable
    monkeypatch.setenv(controls.BRANCH_FROM, str(tmp_path / "a"))
    with pytest.raises(InputError) as refused:
        trainer("e", seed=2).train(resume_from_checkpoint=str(foreign))
    monkeypatch.delenv(controls.BRANCH_FROM)
    assert f"{(tmp_path / 'a').resolve()} (named by {controls.BRANCH_FROM}) now holds run {run_c}" in str(
        refused.value
    )
    assert (
        refused.value.fix
        == f"set {controls.BRANCH_FROM} to the run directory of the run that saved the checkpoint"
    )

    # A back where it was, its ledger cut back to step 3 (as when A was resumed from step 3 and its
    # old checkpoint-4 stayed on disk): the branch is refused after its copy, and its directory is
    # left as it was found, so that a retry starts afresh.
    (tmp_path / "a").rename(tmp_path / "c")
    (tmp_path / "a-moved").rename(tmp_path / "a")
    from reprotune._run.ledger_resume import truncate_ledger

    truncate_ledger(tmp_path / "a" / "ledger.jsonl", keep_through_step=3)
    with pytest.raises(InputError) as refused:
        trainer("f", seed=2).train(resume_from_checkpoint=str(foreign))
    assert "the ledger holds 3 training step(s), not every step up to the checkpoint's 4" in str(
        refused.value
    )
    assert f"branch from a checkpoint of {(tmp_path / 'a').resolve()}'s last attempt" in str(refused.value)
    assert not (tmp_path / "f").exists() or not any((tmp_path / "f").iterdir())

    # B is stopped, not complete: it resumes in its own directory, not as a branch elsewhere.
    with pytest.raises(InputError) as refused:
        trainer("g", seed=1).train(resume_from_checkpoint=str(tmp_path / "out-b" / "checkpoint-4"))
    assert f"resumes from step 4 of run {run_b} (stopped) but {tmp_path / 'g'} holds no run record" in str(
        refused.value
    )
    assert f"fix: resume with the run_dir (or REPROTUNE_RUN_DIR) of {tmp_path / 'b'}" in str(refused.value)
    assert not (tmp_path / "g").exists() or not any((tmp_path / "g").iterdir())


def test_reprotune_resume_of_a_trainer_made_run_says_to_resume_the_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``reprotune resume`` of a stopped run a Trainer script made: exit 2, saying the script
    resumes it (not the Trainer's settings read as an invalid reprotune config)."""
    from trainer_scripts import tiny_trainer

    from reprotune._cli import main
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"
    run_dir = tmp_path / "run"
    make = lambda: ReprotuneCallback(run_dir, code_dir=tmp_path)  # noqa: E731
    monkeypatch.setenv(controls.STOP_AFTER, "2")
    tiny_trainer(model_dir, tiny_rows(40, seed=1), tmp_path / "out", make).train()
    assert load_record(run_dir)["status"] == "stopped"
    capsys.readouterr()

    assert main(["resume", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert f"the run in {run_dir} was written by ReprotuneCallback inside a Trainer script" in err
    assert "run the script again with `trainer.train(resume_from_checkpoint=...)`" in err
    assert "invalid config" not in err


def test_a_stop_inside_an_epoch_and_an_eval_on_start_add_no_validation_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``eval_strategy="epoch"`` with ``eval_on_start``: a run stopped inside an epoch (step 5 of
    10) and resumed is IDENTICAL to the uninterrupted run. The Trainer evaluates where the stop
    ends the loop, as at an epoch's end, and again where the resume starts (``eval_on_start``);
    neither is the run's, and neither writes a line."""
    from trainer_scripts import tiny_trainer

    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(name: str) -> Any:
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),  # 10 steps an epoch at 4 rows a step
            tmp_path / f"out-{name}",
            lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path),
            seed=1,
            eval_rows=tiny_rows(8, seed=2),
            max_steps=14,
            eval_strategy="epoch",
            eval_on_start=True,
        )

    trainer("whole").train()
    monkeypatch.setenv(controls.STOP_AFTER, "5")
    trainer("cut").train()
    monkeypatch.delenv(controls.STOP_AFTER)
    lines = [json.loads(line) for line in (tmp_path / "cut" / "ledger.jsonl").read_text().splitlines()]
    assert [e["step"] for e in lines if e["kind"] == "val"] == [0]  # eval_on_start; none at the stop
    trainer("cut").train(resume_from_checkpoint=str(tmp_path / "out-cut" / "checkpoint-5"))
    whole = [json.loads(line) for line in (tmp_path / "whole" / "ledger.jsonl").read_text().splitlines()]
    assert [e["step"] for e in whole if e["kind"] == "val"] == [0, 10, 14]  # the start, an epoch, the end
    assert compare_runs(tmp_path / "whole", tmp_path / "cut").verdict.value == "IDENTICAL"


def test_a_damaged_ledger_line_after_the_checkpoint_is_dropped_where_the_trainer_did_not_evaluate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash can leave zeros on a ledger line after the checkpoint's (never synced). The Trainer's
    state says whether it evaluated at the checkpoint's step: where it did not (step 3, eval every
    4 steps), the resume drops the damaged line and ends IDENTICAL to the uninterrupted run (it was
    refused: not knowing, the line might be the step's own val line); where it did (step 4), a
    damaged line there is that val line, synced with the checkpoint, and still refused."""
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(name: str) -> Any:
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),
            tmp_path / f"out-{name}",
            lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path),
            eval_rows=tiny_rows(8, seed=2),
            eval_strategy="steps",
            eval_steps=4,
            save_strategy="steps",
            save_steps=1,
        )

    trainer("whole").train()
    monkeypatch.setenv(controls.STOP_AFTER, "3")
    trainer("cut").train()
    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer("val-lost").train()
    monkeypatch.delenv(controls.STOP_AFTER)
    whole = (tmp_path / "whole" / "ledger.jsonl").read_bytes().split(b"\n")
    kinds = [(e["kind"], e["step"]) for e in map(json.loads, whole[:-1])]
    assert kinds[:7] == [
        ("init", 0),
        ("train", 1),
        ("train", 2),
        ("train", 3),
        ("train", 4),
        ("val", 4),
        ("train", 5),
    ]
    ledger = tmp_path / "cut" / "ledger.jsonl"

    assert ledger.read_bytes() == b"\n".join(whole[:4]) + b"\n"  # stopped after step 3
    ledger.write_bytes(ledger.read_bytes() + b"\0" * 120 + b"\n")  # then zeros, as a crash can leave
    trainer("cut").train(resume_from_checkpoint=str(tmp_path / "out-cut" / "checkpoint-3"))
    assert ledger.read_bytes() == b"\n".join(whole)
    assert compare_runs(tmp_path / "whole", tmp_path / "cut").verdict.value == "IDENTICAL"

    ledger = tmp_path / "val-lost" / "ledger.jsonl"
    assert ledger.read_bytes() == b"\n".join(whole[:6]) + b"\n"  # stopped after step 4 and its val
    ledger.write_bytes(b"\n".join(whole[:5]) + b"\n" + b"\0" * len(whole[5]) + b"\n")  # step 4's val
    with pytest.raises(InputError, match=r"ledger\.jsonl:6: line 6 holds zero bytes"):
        trainer("val-lost").train(resume_from_checkpoint=str(tmp_path / "out-val-lost" / "checkpoint-4"))


def test_a_checkpoint_of_another_run_without_a_marker_is_refused_before_the_ledger_is_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint saved by a script without the callback has no marker naming its run; its weights
    at step 2 are not the ledger's, so resuming run ``a`` from it would splice two runs. Refused,
    naming the checkpoint, with the run's ledger and record as they were (it was a warning, and the
    run completed spliced)."""
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(out: str, seed: int, callback: bool) -> Any:
        make = lambda: [ReprotuneCallback(tmp_path / "a", code_dir=tmp_path)] if callback else []  # noqa: E731
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),
            tmp_path / out,
            make,
            seed=seed,
            save_strategy="steps",
            save_steps=2,
            eval_rows={"val": tiny_rows(8, seed=2), "test": tiny_rows(6, seed=3)},
            eval_strategy="steps",
            eval_steps=4,
        )

    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer("out-a", 0, callback=True).train()
    monkeypatch.delenv(controls.STOP_AFTER)
    trainer("out-b", 5, callback=False).train()
    foreign = tmp_path / "out-b" / "checkpoint-2"
    assert not (foreign / CHECKPOINT_MARKER).exists()
    before = {name: (tmp_path / "a" / name).read_bytes() for name in ("record.json", "ledger.jsonl")}

    with pytest.raises(InputError) as refused:
        trainer("out-a", 0, callback=True).train(resume_from_checkpoint=str(foreign))

    assert f"the checkpoint {foreign} does not fit the run's ledger" in str(refused.value)
    assert "its weights are not the ledger's at step 2" in str(refused.value)
    assert {name: (tmp_path / "a" / name).read_bytes() for name in before} == before


def test_a_resume_on_other_rows_or_another_base_model_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``reprotune resume`` refuses a changed data file or base model; a Trainer resume now does
    the same (before, it checked the config hash and the code alone, and both changes went through
    without a word, the record still naming the first rows and model; then the model's was only
    warned): other train rows, or another base model's weights at the same path, are refused
    before anything is written."""
    from safetensors.torch import load_file, save_file
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(rows_seed: int) -> Any:
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=rows_seed),
            tmp_path / "out",
            lambda: ReprotuneCallback(tmp_path / "run", code_dir=tmp_path),
            save_strategy="steps",
            save_steps=2,
            eval_rows={"val": tiny_rows(8, seed=2), "test": tiny_rows(6, seed=3)},
            eval_strategy="steps",
            eval_steps=4,
        )

    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer(1).train()
    monkeypatch.delenv(controls.STOP_AFTER)
    checkpoint = str(tmp_path / "out" / "checkpoint-4")
    before = {name: (tmp_path / "run" / name).read_bytes() for name in ("record.json", "ledger.jsonl")}

    with pytest.raises(InputError, match="the Trainer's train_dataset is not the run's") as refused:
        trainer(2).train(resume_from_checkpoint=checkpoint)
    assert refused.value.source == str(tmp_path / "run" / "record.json")
    assert {name: (tmp_path / "run" / name).read_bytes() for name in before} == before

    weights = load_file(model_dir / "model.safetensors")
    save_file(
        {k: v * 1.01 if v.is_floating_point() else v for k, v in weights.items()},
        model_dir / "model.safetensors",
    )
    with pytest.raises(InputError, match="is not the one the run started with") as refused:
        trainer(1).train(resume_from_checkpoint=checkpoint)
    assert "model.weights_sha256: recorded " in str(refused.value)
    assert "load the base model the run started with in the script" in str(refused.value)
    assert {name: (tmp_path / "run" / name).read_bytes() for name in before} == before


def test_a_branch_made_within_its_sources_second_gets_a_run_id_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run id is the second and the config's hash: a branch made within the second its source
    run was made in took the source's id ("run X branches from run X"), and checks by run id then
    took the two for one. The branch waits for the next second's id. (The clock is the one thing
    stood in for here: the ids it gives in turn.)"""
    from reprotune._config.schema import ExperimentConfig
    from reprotune._run.layout import RunLayout
    from reprotune._run.record import make_run_id, start_record, write_record
    from reprotune.integrations import _resumable

    source, branch_dir = tmp_path / "source", tmp_path / "branch"
    source.mkdir()
    branch_dir.mkdir()
    same = make_run_id("a" * 64)
    record = start_record(same, ExperimentConfig(), {"root": 0})
    record.update(status="completed", error=None, attempts=[{"started_at": "now", "resumed": False}])
    write_record(source / "record.json", record)
    ids = iter([same, same, "20991231-235959-aaaaaaaa"])
    monkeypatch.setattr(_resumable, "make_run_id", lambda sha: next(ids))
    _resumable.branch(source, RunLayout(branch_dir))
    assert load_record(branch_dir)["run_id"] == "20991231-235959-aaaaaaaa"


def test_a_resume_may_change_when_the_trainer_logs_or_saves_never_what_it_computes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resume with other ``save_steps`` and ``logging_steps`` was refused on the config hash
    (naming only the two hashes), though they cannot change the numbers: it goes on now, each
    change warned and noted in the attempt's ``drift``, and equals the run made without a stop
    bit for bit. Another learning rate is still refused, naming the key and both values, and
    nothing of the run is touched."""
    from trainer_scripts import tiny_trainer

    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"

    def trainer(name: str, **args: Any) -> Any:
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),
            tmp_path / f"out-{name}",
            lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path),
            **{"save_strategy": "steps", "save_steps": 2, **args},
        )

    trainer("whole").train()
    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer("cut").train()
    monkeypatch.delenv(controls.STOP_AFTER)
    checkpoint = str(tmp_path / "out-cut" / "checkpoint-4")
    before = {name: (tmp_path / "cut" / name).read_bytes() for name in ("record.json", "ledger.jsonl")}

    with pytest.raises(InputError) as refused:
        trainer("cut", learning_rate=2e-2, save_steps=1).train(resume_from_checkpoint=checkpoint)
    assert "config.trainer.args.learning_rate: recorded 0.01, now 0.02" in str(refused.value)
    assert "save_steps" not in str(refused.value)  # the change that matters is the one named
    assert {name: (tmp_path / "cut" / name).read_bytes() for name in before} == before

    capsys.readouterr()
    trainer("cut", save_steps=1, logging_steps=3).train(resume_from_checkpoint=checkpoint)
    drift = load_record(tmp_path / "cut")["attempts"][-1]["drift"]
    assert "config.trainer.args.save_steps: recorded 2, now 1" in drift
    assert any(line.startswith("config.trainer.args.logging_steps: recorded ") for line in drift), drift
    assert "config.trainer.args.save_steps: recorded 2, now 1" in capsys.readouterr().err
    assert compare_runs(tmp_path / "whole", tmp_path / "cut").verdict.value == "IDENTICAL"
    assert (tmp_path / "whole" / "adapter" / "adapter_model.safetensors").read_bytes() == (
        tmp_path / "cut" / "adapter" / "adapter_model.safetensors"
    ).read_bytes()


def test_a_resume_sends_mlflow_the_steps_before_its_checkpoint_it_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Trainer run stopped at step 4 before MLflow mirrored it (no MLflow for its first attempt;
    as for an attempt killed before its worker stored its steps), resumed with ``mlflow=True``:
    the MLflow run holds every step the ledger holds, 1-8, the ledger's values (before, steps 5-8
    alone: ``reprotune resume`` sent the ledger's earlier steps, a Trainer resume did not). Its two
    named eval sets are a metric each, ``val_loss/val`` and ``val_loss/test``, sent live and from
    the ledger alike (they were both ``val_loss``, two values at a step, the backfill keeping one)."""
    from mlflow.tracking import MlflowClient
    from trainer_scripts import tiny_trainer

    from mlflowstore import seed_mlflow_store
    from reprotune._run.ledger import read_ledger
    from reprotune.integrations.transformers import ReprotuneCallback
    from reprotune.testing import tiny_rows
    from tinyrun import TinyProject

    model_dir = TinyProject.create(tmp_path / "project").root / "tiny-model"
    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "resumed")

    def trainer(mlflow: bool) -> Any:
        return tiny_trainer(
            model_dir,
            tiny_rows(40, seed=1),
            tmp_path / "out",
            lambda: ReprotuneCallback(tmp_path / "run", code_dir=tmp_path, mlflow=mlflow),
            save_strategy="steps",
            save_steps=2,
            eval_rows={"val": tiny_rows(8, seed=2), "test": tiny_rows(6, seed=3)},
            eval_strategy="steps",
            eval_steps=4,
        )

    monkeypatch.setenv(controls.STOP_AFTER, "4")
    trainer(mlflow=False).train()
    monkeypatch.delenv(controls.STOP_AFTER)
    trainer(mlflow=True).train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))

    mirrored = load_record(tmp_path / "run")["trackers"]["mlflow"]
    assert mirrored["ok"] is True, mirrored
    history = MlflowClient(uri).get_metric_history(mirrored["mlflow_run_id"], "train_loss")
    ledger = read_ledger(tmp_path / "run" / "ledger.jsonl")
    assert sorted((m.step, m.value) for m in history) == [(e.step, e.number("loss")) for e in ledger.train]
    assert [e.step for e in ledger.train] == list(range(1, 9))
    client = MlflowClient(uri)
    sent = {
        name: sorted((m.step, m.value) for m in client.get_metric_history(mirrored["mlflow_run_id"], name))
        for name in ("val_loss/val", "val_loss/test", "val_loss")
    }
    val = [(e.step, e.number("loss")) for e in ledger.val]
    assert [step for step, _ in val] == [4, 4, 8, 8]
    assert sent == {"val_loss/val": val[0::2], "val_loss/test": val[1::2], "val_loss": []}


@pytest.mark.distributed
def test_a_resume_in_another_number_of_processes_than_the_run_is_refused_before_the_ledger_is_cut(
    tmp_path: Path,
) -> None:
    """The example script at world size 2 (torchrun), stopped after step 3 with a checkpoint, then
    resumed from it in one process: refused before the run directory is touched, naming both
    world sizes and the launch to use (before: it went on silently with half the global batch,
    the record still holding two ranks and the attempt no note)."""
    project = ScriptProject.create(tmp_path)
    argv = project.argv("hf_trainer.py", "--run-dir", "cut", "--output-dir", "out/cut")
    env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": "1"}
    torchrun = ["--standalone", "--nproc_per_node", "2", *argv[1:]]
    stopped = run_module(
        "torch.distributed.run",
        torchrun,
        cwd=project.root,
        env={**env, controls.STOP_AFTER: "3"},
        timeout=900,
    )
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    run_dir, checkpoint = project.root / "cut", project.root / "out" / "cut" / "checkpoint-3"
    assert [r["rank"] for r in load_record(run_dir)["trainer"]["ranks"]] == [0, 1]
    before = {name: (run_dir / name).read_bytes() for name in ("record.json", "ledger.jsonl")}

    resumed = run_script(
        str(project.root / "hf_trainer.py"),
        argv[2:],
        cwd=project.root,
        env={**env, controls.RESUME_FROM: str(checkpoint)},
        timeout=900,
    )
    assert resumed.returncode != 0
    assert (
        "cut/record.json (key trainer.ranks): the run in cut trained in 2 process(es) (world size 2); "
        "this resume runs in 1 (world size 1): each process trains its own rows of every step, so the "
        "step's batch would be another and the steps after the checkpoint another run's\n"
        "fix: launch the same number of processes as the run: 2 in all "
        "(e.g. `torchrun --nproc_per_node 2 SCRIPT ...`)"
    ) in resumed.stderr
    assert {name: (run_dir / name).read_bytes() for name in before} == before
    assert not (run_dir / ".writer.lock").exists()


def test_a_branch_in_another_number_of_processes_than_its_checkpoints_is_refused(tmp_path: Path) -> None:
    """A resume into a new directory (a branch) holds no record yet: the number of processes is the
    one that saved the checkpoint, as its marker names them; the same number goes on."""
    checkpoint = tmp_path / "out" / "checkpoint-4"
    checkpoint.mkdir(parents=True)
    write_json_atomic(checkpoint / CHECKPOINT_MARKER, {"run_id": "r", "ranks": [{"rank": 0}]})
    refuse_another_world_size(tmp_path / "branch", str(checkpoint), 1)
    with pytest.raises(InputError) as refused:
        refuse_another_world_size(tmp_path / "branch", str(checkpoint), 2)
    assert str(refused.value) == (
        f"{checkpoint}/{CHECKPOINT_MARKER} (key ranks): the run in {tmp_path / 'branch'} trained in 1 "
        "process(es) (world size 1); this resume runs in 2 (world size 2): each process trains its own "
        "rows of every step, so the step's batch would be another and the steps after the checkpoint "
        "another run's\nfix: launch the same number of processes as the run: 1 in all (e.g. `python "
        "SCRIPT ...`, without torchrun)"
    )

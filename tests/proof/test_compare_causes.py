"""What ``compare`` gives as the cause in the cases a review found told wrongly: a resume in another
environment, another validation schedule, an edited last step, a NaN validation loss, a tolerance
beside another experiment, and one config value said twice."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reprotune._jsonio import canonical_dumps
from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Verdict
from rundirs import RunSpec, edit_ledger, two_eval_sets, write_run_dir

KERNELS = {
    "kernels": {
        "version": 1,
        "cpu": {"aten_capability": "AVX512", "model": "EPYC", "vendor": "AuthenticAMD"},
        "portable": {"cpu_isa": "native"},
        "steering_env": {"ATEN_CPU_CAPABILITY": None},
    }
}


def _edit_record(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads((run / "record.json").read_text())
    change(record)
    (run / "record.json").write_text(canonical_dumps(record))


def _resumed(run: Path, from_step: int, **drift: list[str]) -> None:
    """Give ``run`` a second attempt, resumed from ``from_step`` with every state restored, that
    noted ``drift`` (``environment_drift=[...]``, ...) as ``reprotune resume`` does."""
    attempt = {"resumed": True, "from_step": from_step, "rng_restored": True, **drift}
    _edit_record(run, lambda r: r.update(attempts=[{"resumed": False}, attempt]))


def _loss(run: Path, step: int, kind: str = "train") -> float:
    lines = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    return float.fromhex(next(e["loss"] for e in lines if e["kind"] == kind and e["step"] == step))


def test_a_resume_under_other_kernels_is_the_kernel_cause_with_the_trace_commands(tmp_path: Path) -> None:
    """`ATEN_CPU_CAPABILITY=default reprotune resume RUN`: the attempt notes the kernel facts that
    moved, and compare names them as the kernel cause they are, with the trace commands (run B's
    under the variable its resume ran with); it said only "an exact resume changes nothing"."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(environment=KERNELS))
    drift = write_run_dir(tmp_path / "drift", RunSpec(noise_from_step=5, environment=KERNELS))
    _resumed(
        drift,
        4,
        environment_drift=[
            "environment.kernels.cpu.aten_capability: recorded 'AVX512', now 'DEFAULT'",
            "environment.kernels.steering_env.ATEN_CPU_CAPABILITY: recorded None, now 'default'",
        ],
    )
    result = compare_runs(ref, drift)
    assert result.verdict is Verdict.DIVERGED
    assert result.differences == ()  # the records agree: the resume ran otherwise
    assert result.causes[0].startswith(
        "numbers differ from step 5 with identical data order: run B was resumed from its step-4 "
        "checkpoint with other kernel facts than it started with (noted on that attempt): CPU kernels "
        "differ: CPU capability AVX512 vs DEFAULT; kernel environment variables "
        "ATEN_CPU_CAPABILITY=unset vs ATEN_CPU_CAPABILITY=default: the same inputs give other bits"
    ), result.causes
    assert not any("exact resume" in cause for cause in result.causes)
    assert result.next_steps[1] == f"  reprotune trace {ref} --step 5 --out A-step-5.trace.jsonl"
    assert result.next_steps[3] == (
        f"  ATEN_CPU_CAPABILITY=default reprotune trace {drift} --step 5 --out B-step-5.trace.jsonl"
    )


@pytest.mark.parametrize(
    ("key", "line", "said"),
    [
        (
            "environment_drift",
            "environment.torch.version: recorded '2.13.0', now '2.14.1'",
            "with other environment than it started with (noted on that attempt): "
            "torch.version 2.13.0 vs 2.14.1",
        ),
        (
            "code_drift",
            "code.commit: recorded '0123456789abcdef0123456789abcdef01234567', now 'fedcba'",
            "with other code than it started with (noted on that attempt): code.commit "
            "0123456789abcdef0123456789abcdef01234567 vs fedcba",
        ),
        (
            "drift",
            "model.config_files.config.json: recorded 'aaa', now 'bbb'",
            "with other base model files than it started with (noted on that attempt): a file that "
            "defines the base model's computation differs: config.json aaa vs bbb",
        ),
    ],
    ids=["environment", "code", "model-file"],
)
def test_a_resume_s_other_environment_code_or_model_is_named_with_its_resume(
    tmp_path: Path, key: str, line: str, said: str
) -> None:
    """What else a resume noted (a library, the code, a model file whose name holds a dot) is said
    as the kind of difference it is, naming the resume."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(model={"config_files": {"config.json": "aaa"}}))
    other = write_run_dir(
        tmp_path / "other", RunSpec(noise_from_step=5, model={"config_files": {"config.json": "aaa"}})
    )
    _resumed(other, 4, **{key: [line]})
    causes = compare_runs(ref, other).causes
    assert any(f"run B was resumed from its step-4 checkpoint {said}" in cause for cause in causes), causes
    assert not any("exact resume" in cause for cause in causes)


def test_run_a_s_resume_and_a_resume_after_the_divergence(tmp_path: Path) -> None:
    """A drift noted by run A's resume is told from A's side (A's value first); a resume from after
    the runs part did not compute where they part, and is not named."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(noise_from_step=5))
    other = write_run_dir(tmp_path / "other")
    line = "environment.torch.version: recorded '2.13.0', now '2.14.1'"
    _resumed(ref, 4, environment_drift=[line])
    assert (
        "run A was resumed from its step-4 checkpoint with other environment"
        in compare_runs(ref, other).causes[0]
    )
    assert "torch.version 2.14.1 vs 2.13.0" in compare_runs(ref, other).causes[0]
    _resumed(ref, 6, environment_drift=[line])
    assert not any("resumed" in cause for cause in compare_runs(ref, other).causes)


def test_another_validation_schedule_is_its_config_value_not_an_edit(tmp_path: Path) -> None:
    """`train.eval_every` 4 vs 8 over 12 steps: only the validation after step 4 is missing, one
    line; the cause is the config value (it said "the ledger looks edited" first). A validation line
    deleted by hand, with no config difference, still reads as an edit."""
    ref = write_run_dir(tmp_path / "ref")
    result = compare_runs(ref, write_run_dir(tmp_path / "every8", RunSpec(eval_every=8)))
    assert result.where.lines_differing == 1
    assert result.causes == (
        "the runs validated at other steps from step 4, and every number both recorded agrees: "
        "config.train.eval_every 4 vs 8",
    )
    deleted = tmp_path / "deleted"
    shutil.copytree(ref, deleted)
    ledger = deleted / "ledger.jsonl"
    lines = ledger.read_text().splitlines(keepends=True)
    kept = [x for x in lines if (json.loads(x)["kind"], json.loads(x)["step"]) != ("val", 4)]
    ledger.write_text("".join(kept))
    edited = compare_runs(ref, deleted).causes
    assert edited[-1].startswith("only the ledger line of step 4 differs (validation schedule)"), edited


def test_a_loss_edited_at_the_last_step_is_written_not_trained(tmp_path: Path) -> None:
    """Only the last step's loss edited, the record's ledger sha256 updated: its weights hash and
    the adapter agree, so the line was written otherwise (it was called nondeterminism, with trace
    commands); a last step whose weights differ too is no edit."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(environment=KERNELS))
    forged = tmp_path / "forged"
    shutil.copytree(ref, forged)
    edit_ledger(forged, 12, "loss", (_loss(ref, 12) + 0.5).hex(), as_written=True)
    result = compare_runs(ref, forged)
    assert result.causes == (
        "only the ledger line of step 12 differs (loss) and its weights and the adapter agree: the "
        "ledger looks edited or corrupted, not trained differently",
    )
    assert result.next_steps == ()
    trained = compare_runs(
        ref, write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=12, environment=KERNELS))
    )
    assert not any("edited" in cause for cause in trained.causes) and trained.next_steps


def test_a_nan_validation_loss_is_the_largest_difference(tmp_path: Path) -> None:
    """A finite validation difference at step 4, a NaN at step 8: the NaN is the largest (it was
    hidden behind the finite one, as the training losses' is not)."""
    ref = write_run_dir(tmp_path / "ref")
    other = tmp_path / "other"
    shutil.copytree(ref, other)
    edit_ledger(other, 4, "loss", (_loss(ref, 4, "val") + 0.5).hex(), kind="val", as_written=True)
    edit_ledger(other, 8, "loss", "nan", kind="val", as_written=True)
    largest = compare_runs(ref, other).where.largest_val_loss_diff
    assert largest is not None and largest.step == 8 and math.isnan(largest.abs_diff)


@pytest.mark.parametrize(
    ("spec", "verdict"),
    [
        (RunSpec(lr=0.06), Verdict.DIVERGED),
        (RunSpec(seed_overrides={"dropout": 5}), Verdict.DIVERGED),
        (
            RunSpec(noise_from_step=3, noise=1e-5, config={"determinism": {"threads": 4}}),
            Verdict.WITHIN_TOLERANCE,
        ),
        (
            RunSpec(noise_from_step=3, noise=1e-5, environment={"torch": {"version": "2.14.1"}}),
            Verdict.WITHIN_TOLERANCE,
        ),
        (
            RunSpec(
                noise_from_step=3, noise=1e-5, config={"train": {"save_every": 2, "keep_checkpoints": 5}}
            ),
            Verdict.WITHIN_TOLERANCE,
        ),
        (
            RunSpec(noise_from_step=3, noise=1e-5, config={"eval": {"generate_max_rows": 3}}),
            Verdict.WITHIN_TOLERANCE,
        ),
    ],
    ids=["learning-rate", "dropout-seed", "threads", "torch", "checkpointing", "generation"],
)
def test_a_tolerance_never_forgives_another_experiment(
    tmp_path: Path, spec: RunSpec, verdict: Verdict
) -> None:
    """`--tolerance 1` over another learning rate or seed: DIVERGED, saying why (it was WITHIN
    TOLERANCE); the same experiment on another machine or torch, or checkpointed or generating
    otherwise (its books, not its numbers), stays within it."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(config={"determinism": {"threads": 2}}))
    result = compare_runs(ref, write_run_dir(tmp_path / "other", spec), tolerance=1.0)
    assert result.verdict is verdict
    said = [n for n in result.notes if n.startswith("a tolerance forgives the numbers of one experiment")]
    assert bool(said) == (verdict is Verdict.DIVERGED), result.notes


@pytest.mark.parametrize(
    ("spec_a", "spec_b", "said", "restated"),
    [
        (
            RunSpec(config={"model": {"max_length": 64}}),
            RunSpec(config={"model": {"max_length": 48}}, model={"max_length": 48}, noise_from_step=1),
            "config.model.max_length 64 vs 48",
            "model.max_length",
        ),
        (
            RunSpec(config={"lora": {"dropout": 0.1}}),
            RunSpec(config={"lora": {"dropout": 0.2}}, lora={"lora_dropout": 0.2}, noise_from_step=1),
            "config.lora.dropout 0.1 vs 0.2",
            "lora.lora_dropout",
        ),
        (RunSpec(), RunSpec(steps=10), "config.train.max_steps 12 vs 10", "data.order.total_steps"),
    ],
    ids=["max-length", "lora-dropout", "max-steps"],
)
def test_a_record_value_taken_from_the_config_is_said_once(
    tmp_path: Path, spec_a: RunSpec, spec_b: RunSpec, said: str, restated: str
) -> None:
    """The record's model, LoRA and data order sections take some values from the config: with
    the config value named, theirs is no second cause (both were)."""
    runs = [write_run_dir(tmp_path / name, spec) for name, spec in (("a", spec_a), ("b", spec_b))]
    for run, spec in zip(runs, (spec_a, spec_b), strict=True):
        order = {"rows_per_step": 2, "total_steps": spec.steps, "version": 1}
        _edit_record(run, lambda r, order=order: r["data"].update(order=order))
    result = compare_runs(*runs)
    assert restated in {d.key for d in result.differences}  # still listed
    assert any(said in cause for cause in result.causes), result.causes
    assert not any(re.search(rf"[:;] {re.escape(restated)} ", c) for c in result.causes), result.causes


def test_two_val_lines_at_a_step_are_each_compared(tmp_path: Path) -> None:
    """A Trainer's dict of eval datasets writes one val line a set at each evaluation: compare and
    spot's intervals keyed them by step, so the first set's line went unseen (a changed loss there
    compared IDENTICAL)."""
    from reprotune._proof.intervals import interval_lines

    a = write_run_dir(tmp_path / "a")
    b = write_run_dir(tmp_path / "b")
    two_eval_sets(a)
    two_eval_sets(b, first_loss_at_4=float.hex(2.5))
    result = compare_runs(a, b)
    assert result.verdict.value == "DIVERGED" and result.where.first_val_step == 4
    lines = interval_lines(a, 0, 8)
    assert ("val", 4) in lines and ("val 2", 4) in lines and lines[("val", 4)] != lines[("val 2", 4)]


def test_a_resume_onto_what_the_other_run_ran_with_is_no_cause(tmp_path: Path) -> None:
    """Run A started on one torch and was resumed at step 4 on run B's: both computed step 5 on the
    same torch, so torch is not the cause where they part at 5 (it was named, as the runs'
    starting environments differ); what is left is A's resume."""
    ref = write_run_dir(tmp_path / "ref", RunSpec(noise_from_step=5))
    other = write_run_dir(tmp_path / "other")
    _edit_record(other, lambda r: r["environment"]["torch"].update(version="2.14.1"))
    _resumed(ref, 4, environment_drift=["environment.torch.version: recorded '2.13.0', now '2.14.1'"])
    result = compare_runs(ref, other)
    assert any(d.key == "environment.torch.version" for d in result.differences)  # listed, as started
    assert not any("torch" in cause for cause in result.causes), result.causes
    assert any("run A was resumed from its step-4 checkpoint" in cause for cause in result.causes)


def test_save_arguments_choose_the_adapter_under_load_best_model_at_end(tmp_path: Path) -> None:
    """A Trainer's save_* arguments cannot change the numbers, but with load_best_model_at_end they
    choose which checkpoint becomes the adapter: inert without it, a possible cause with it."""
    from reprotune._proof.record_diff import record_differences
    from reprotune._run.rundir import open_run_dir

    def pair(best: bool) -> dict[str, bool]:
        runs = [
            write_run_dir(
                tmp_path / f"{best}-{steps}",
                RunSpec(config={"trainer": {"args": {"save_steps": steps, "load_best_model_at_end": best}}}),
            )
            for steps in (2, 4)
        ]
        found = record_differences(*(open_run_dir(run) for run in runs))
        return {d.key: d.inert for d in found if d.key.startswith("config.trainer.args.")}

    assert pair(best=False) == {"config.trainer.args.save_steps": True}
    assert pair(best=True) == {"config.trainer.args.save_steps": False}

"""compare_runs on hand-built run directories: verdicts, where, what differs and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps
from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Difference, Verdict
from rundirs import RunSpec, batches, default_rows, edit_ledger, make_split, write_run_dir


@pytest.fixture
def ref(tmp_path: Path) -> Path:
    """The reference run, default spec."""
    return write_run_dir(tmp_path / "ref")


def test_identical_twins(ref: Path, tmp_path: Path) -> None:
    """Two runs of the same spec are IDENTICAL, with nothing differing anywhere."""
    twin = write_run_dir(tmp_path / "twin")
    result = compare_runs(ref, twin)
    assert result.verdict is Verdict.IDENTICAL
    assert result.exit_code == 0
    assert result.where.first_divergence_step is None
    assert result.where.lines_differing == 0
    assert result.where.steps_compared == 12
    assert result.adapter is not None and result.adapter.identical
    assert result.differences == ()
    assert result.causes == ()
    assert result.incomparable == ()


def test_different_root_seed_diverges_at_init_and_names_seed(ref: Path, tmp_path: Path) -> None:
    """A different root seed: DIVERGED at step 0 (LoRA init), data order from step 1, seed named first."""
    other = write_run_dir(tmp_path / "seed43", RunSpec(seed=43))
    result = compare_runs(ref, other)
    assert result.verdict is Verdict.DIVERGED
    assert result.exit_code == 1
    assert result.where.first_divergence_step == 0
    assert result.where.first_weights_step == 0
    assert result.where.first_batch_step == 1
    assert result.causes[0].startswith(
        "the LoRA initial weights differ (step 0), and the data order from step 1: root seed 42 vs 43"
    )
    assert Difference("seeds", "seeds.root", 42, 43, "changed") in result.differences
    # One fact, one cause: the config's seed and the manifest's sha256 only restate the seeds and
    # the split, named above (they were causes of their own).
    assert {"config.seed", "data.manifest_sha256"} <= {d.key for d in result.differences}
    assert not [c for c in result.causes if "config.seed" in c or "manifest_sha256" in c]


def test_edited_row_diverges_with_manifest_named(tmp_path: Path) -> None:
    """One edited data row and a new manifest: DIVERGED where the row is first used, the row named."""
    spec = RunSpec()
    row = batches(spec)[2][0]  # first used at step 3 (rows repeat only in later epochs)
    assert all(row not in b for b in batches(spec)[:2])
    ref = write_run_dir(tmp_path / "ref", spec)
    rows = default_rows()
    rows[row] = "an edited prompt -> an edited response"
    edited = write_run_dir(tmp_path / "edited", RunSpec(rows=rows))
    result = compare_runs(ref, edited)
    assert result.verdict is Verdict.DIVERGED
    assert result.where.first_batch_step is None  # same indices: same data order
    assert result.where.first_loss_step == 3
    assert result.where.first_divergence_step == 3
    assert result.split is not None
    assert result.split.content_changed == (row,)
    assert result.split.moved == ()
    assert result.causes[0] == (
        f"numbers differ from step 3 with identical data order: "
        f"the split manifests differ in 1 row (content changed: row {row})"
    )
    assert {d.key for d in result.differences} == {"data.file_sha256", "data.manifest_sha256"}


def test_different_split_is_data_order_cause(ref: Path, tmp_path: Path) -> None:
    """A different split seed moves rows between splits: data order differs from step 1, rows named."""
    other = write_run_dir(tmp_path / "split", RunSpec(seed_overrides={"split": 7}))
    result = compare_runs(ref, other)
    assert result.verdict is Verdict.DIVERGED
    assert result.where.first_batch_step == 1
    assert result.where.first_weights_step == 1  # same LoRA init
    assert result.split is not None
    a, b = make_split(RunSpec()), make_split(RunSpec(seed_overrides={"split": 7}))
    expected = sorted(
        i for i in range(24) if next(n for n in a if i in a[n]) != next(n for n in b if i in b[n])
    )
    assert [m.row for m in result.split.moved] == expected
    head = "data order differs from step 1: the split manifests differ in"
    first = result.split.moved[0]
    moved = f"row {first.row} {first.split_a}->{first.split_b}, row "
    assert result.causes[0].startswith(f"{head} {len(expected)} rows (in another split: {moved}")
    assert result.causes[1].startswith("data order differs from step 1: derived seed split ")


def test_data_order_seed_named(ref: Path, tmp_path: Path) -> None:
    """Only the data-order seed differs: data order differs from step 1 and that seed is the cause."""
    other = write_run_dir(tmp_path / "order", RunSpec(seed_overrides={"data_order": 5}))
    result = compare_runs(ref, other)
    assert result.where.first_divergence_step == 1
    assert result.where.first_batch_step == 1
    assert result.causes == (f"data order differs from step 1: derived seed data_order {_seed(ref)} vs 5",)


def _seed(run: Path, name: str = "data_order") -> int:
    return int(json.loads((run / "record.json").read_text())["seeds"][name])


def test_environment_difference_listed_when_numbers_agree(ref: Path, tmp_path: Path) -> None:
    """A thread count that differs but changes no number: IDENTICAL, and the difference is listed."""
    other = write_run_dir(tmp_path / "threads", RunSpec(environment={"torch": {"num_threads": 4}}))
    result = compare_runs(ref, other)
    assert result.verdict is Verdict.IDENTICAL
    assert result.differences == (
        Difference("environment", "environment.torch.num_threads", 2, 4, "changed"),
    )
    assert "1 recorded values differ, yet no number changed" in result.notes
    assert "environment.torch.num_threads: 2 -> 4" in result.format()


def test_an_empty_mapping_beside_its_keys_is_no_difference_of_its_own(tmp_path: Path) -> None:
    """``seed.overrides: {}`` in A, ``seed.overrides.split: 3`` in B: the key B adds is the difference,
    not also ``{} -> (absent)`` (a flattening artefact), both ways round; an emptied mapping whose
    other side has a value is still one."""
    empty = write_run_dir(tmp_path / "empty", RunSpec(config={"overrides": {}}))
    one = write_run_dir(tmp_path / "one", RunSpec(config={"overrides": {"split": 3}}))
    for a, b, kind in ((empty, one, "added"), (one, empty, "removed")):
        differences = compare_runs(a, b).differences
        assert [d.key for d in differences] == ["config.overrides.split"], differences
        assert differences[0].change == kind
    other = write_run_dir(tmp_path / "scalar", RunSpec(config={"overrides": 0}))
    keys = [d.key for d in compare_runs(empty, other).differences]
    assert keys == ["config.overrides"]


def test_environment_difference_is_cause_of_numbers(ref: Path, tmp_path: Path) -> None:
    """Numbers that part at step 7 with identical data order are tied to the torch version that differs."""
    spec = RunSpec(environment={"torch": {"version": "2.14.1"}}, noise_from_step=7)
    result = compare_runs(ref, write_run_dir(tmp_path / "torch", spec))
    assert result.verdict is Verdict.DIVERGED
    assert result.where.first_batch_step is None
    assert result.where.first_divergence_step == 7
    assert result.causes == (
        "numbers differ from step 7 with identical data order: torch.version 2.13.0 vs 2.14.1",
    )


def test_nothing_recorded_differs_points_at_the_trace(tmp_path: Path) -> None:
    """Runs that diverge with no recorded difference, kernel facts included: nondeterminism, and
    the two `reprotune trace` commands of the first divergent step (one per machine) and the
    comparison of their traces, not `reprotune doctor` (its probe compares runs on one machine)."""
    kernels = {"kernels": {"version": 1, "cpu": {"aten_capability": "AVX2", "model": "EPYC"}}}
    ref = write_run_dir(tmp_path / "ref", RunSpec(environment=kernels))
    result = compare_runs(
        ref, write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=5, environment=kernels))
    )
    assert result.verdict is Verdict.DIVERGED
    assert result.differences == ()
    assert len(result.causes) == 1
    assert result.causes[0].startswith("numbers differ from step 5 with identical data order, yet nothing")
    assert "kernel facts" in result.causes[0] and "nondeterminism" in result.causes[0]
    assert "doctor" not in result.causes[0]
    assert result.next_steps == (
        "on A's machine (EPYC):",
        f"  reprotune trace {ref} --step 5 --out A-step-5.trace.jsonl",
        "on B's machine (EPYC):",
        f"  reprotune trace {tmp_path / 'noisy'} --step 5 --out B-step-5.trace.jsonl",
        "then, with both files in one place:",
        "  reprotune compare A-step-5.trace.jsonl B-step-5.trace.jsonl",
    )
    assert "find the first op that differs" in result.format()


def test_the_trace_commands_paste_into_a_shell(tmp_path: Path) -> None:
    """A path with a space and a quote is quoted; the kernel-steering variables each run was made
    with stand before its command, so that the pasted command traces under the run's own kernels."""
    steering = {"OMP_NUM_THREADS": "4", "MKL_CBWR": None}
    kernels = {"kernels": {"version": 1, "cpu": {"model": "EPYC"}, "steering_env": steering}}
    ref = write_run_dir(tmp_path / "ref", RunSpec(environment=kernels))
    other = write_run_dir(tmp_path / "it's b", RunSpec(noise_from_step=5, environment=kernels))
    steps = compare_runs(ref, other).next_steps
    assert steps[1] == f"  OMP_NUM_THREADS=4 reprotune trace {ref} --step 5 --out A-step-5.trace.jsonl"
    quoted = "'" + str(other).replace("'", "'\"'\"'") + "'"
    assert steps[3] == f"  OMP_NUM_THREADS=4 reprotune trace {quoted} --step 5 --out B-step-5.trace.jsonl"


def test_records_without_kernel_facts_make_them_unknown(ref: Path, tmp_path: Path) -> None:
    """Records made before kernel facts were recorded still compare: with nothing else recorded
    differing, the cause says the kernel facts are unknown (never "nothing recorded differs"),
    a note says whose, and the trace commands follow."""
    result = compare_runs(ref, write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=5)))
    assert result.verdict is Verdict.DIVERGED
    assert len(result.causes) == 1
    assert "kernel facts are unknown for both runs' record" in result.causes[0]
    assert "nothing recorded differs" not in result.causes[0]
    assert any(n.startswith("neither record holds kernel facts") for n in result.notes)
    assert result.next_steps[1].startswith(f"  reprotune trace {ref} --step 5")


def test_hand_edited_ledger_value(ref: Path, tmp_path: Path) -> None:
    """A loss edited by hand at step 5: DIVERGED at step 5, one line differs, the edit is called out."""
    other = tmp_path / "edited"
    shutil.copytree(ref, other)
    entries = [json.loads(line) for line in (ref / "ledger.jsonl").read_text().splitlines()]
    original = next(e["loss"] for e in entries if e["kind"] == "train" and e["step"] == 5)
    edit_ledger(other, 5, "loss", (float.fromhex(original) + 0.25).hex())
    result = compare_runs(ref, other)
    assert result.verdict is Verdict.DIVERGED
    assert result.where.first_divergence_step == 5
    assert result.where.first_loss_step == 5
    assert result.where.first_weights_step is None
    assert result.where.lines_differing == 1
    diff = result.where.largest_loss_diff
    assert diff is not None and diff.step == 5
    assert diff.abs_diff == abs((float.fromhex(original) + 0.25) - float.fromhex(original))
    assert result.causes == (
        "run B's ledger does not match the sha256 in its record: it was edited or damaged after the run "
        "wrote it, so its lines are not the run's (restore it from a copy, or rerun the run)",
        "only the ledger line of step 5 differs (loss) and every later step agrees: "
        "the ledger looks edited or corrupted, not trained differently",
    )
    assert "run B's ledger does not match the sha256 in its record (edited since?)" in result.notes
    # Losses edited from step 5 on (each line, as a real change would): still the edit, never
    # nondeterminism, and no trace commands to run for it.
    for step in range(6, 13):
        value = next(e["loss"] for e in entries if e["kind"] == "train" and e["step"] == step)
        edit_ledger(other, step, "loss", (float.fromhex(value) * 1.0000001).hex())
    many = compare_runs(ref, other)
    assert many.causes[0].startswith("run B's ledger does not match the sha256 in its record")
    assert not any("nondeterminism" in cause for cause in many.causes) and many.next_steps == ()


def test_validation_lines_pair_by_step(ref: Path, tmp_path: Path) -> None:
    """Validation lines are compared step by step, never by position: another eval schedule of the
    same training (val at 3, 6, 9, 12 vs 4, 8, 12) differs in its schedule, not in a validation
    loss; a shorter run's last validation (step 6) is not held against the reference's step 8."""
    other = compare_runs(ref, write_run_dir(tmp_path / "every3", RunSpec(eval_every=3)))
    assert other.verdict is Verdict.DIVERGED
    where = other.where
    assert (where.first_val_step, where.first_loss_step, where.first_weights_step) == (None, None, None)
    assert (where.first_other_step, where.other_fields) == (3, ("validation schedule",))
    assert where.largest_val_loss_diff is None
    assert other.causes[0] == (
        "the runs validated at other steps from step 3, and every number both recorded agrees: "
        "config.train.eval_every 4 vs 3"
    )
    shorter = compare_runs(ref, write_run_dir(tmp_path / "short", RunSpec(steps=6)))
    assert shorter.verdict is Verdict.INCOMPARABLE
    assert shorter.where.first_val_step is None and shorter.where.largest_val_loss_diff is None


@pytest.mark.parametrize(
    ("tolerance", "verdict"),
    [(None, Verdict.DIVERGED), (1e-3, Verdict.WITHIN_TOLERANCE), (1e-9, Verdict.DIVERGED)],
    ids=["no-tolerance", "loose", "tight"],
)
def test_tolerance(ref: Path, tmp_path: Path, tolerance: float | None, verdict: Verdict) -> None:
    """Numbers off by ~1e-5 with the same data order are WITHIN_TOLERANCE only for a tolerance above that."""
    other = write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=3, noise=1e-5))
    result = compare_runs(ref, other, tolerance=tolerance)
    assert result.verdict is verdict
    assert result.exit_code == (0 if verdict is Verdict.WITHIN_TOLERANCE else 1)


def test_tolerance_never_forgives_data_order(ref: Path, tmp_path: Path) -> None:
    """A different data order is DIVERGED whatever the tolerance."""
    other = write_run_dir(tmp_path / "order", RunSpec(seed_overrides={"data_order": 5}))
    assert compare_runs(ref, other, tolerance=1e9).verdict is Verdict.DIVERGED


def test_adapter_tensor_differences_exact(ref: Path, tmp_path: Path) -> None:
    """The per-tensor max |difference| is exactly what numpy computes on the two adapter files."""
    other = write_run_dir(tmp_path / "noisy", RunSpec(noise_from_step=3, noise=1e-5))
    result = compare_runs(ref, other)
    ta = load_file(str(ref / "adapter" / "adapter_model.safetensors"))
    tb = load_file(str(other / "adapter" / "adapter_model.safetensors"))
    assert result.adapter is not None and not result.adapter.identical
    got = {t.name: t.max_abs_diff for t in result.adapter.tensors}
    want = {k: float(np.abs(ta[k].astype(np.float64) - tb[k].astype(np.float64)).max()) for k in ta}
    assert got == want
    assert all(v > 0 for v in got.values())


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (RunSpec(model_sha256="f" * 64), "different base model: model.weights_sha256"),
        (RunSpec(steps=10), "different training length: run A has 12 steps (completed), run B has 10"),
        (RunSpec(lora_r=2), "the adapters have different tensors or shapes (1 differ, e.g. "),
    ],
    ids=["base-model", "steps", "lora-rank"],
)
def test_incomparable(ref: Path, tmp_path: Path, spec: RunSpec, reason: str) -> None:
    """Runs of different experiments are INCOMPARABLE, saying what makes them so."""
    result = compare_runs(ref, write_run_dir(tmp_path / "other", spec))
    assert result.verdict is Verdict.INCOMPARABLE
    assert result.exit_code == 1
    assert any(r.startswith(reason) for r in result.incomparable), result.incomparable


def test_missing_adapter_is_incomparable(ref: Path, tmp_path: Path) -> None:
    """A run without its adapter cannot be IDENTICAL even with an equal ledger."""
    other = tmp_path / "noadapter"
    shutil.copytree(ref, other)
    (other / "adapter" / "adapter_model.safetensors").unlink()
    result = compare_runs(ref, other)
    assert result.verdict is Verdict.INCOMPARABLE
    assert result.incomparable == ("run B has no adapter (adapter/adapter_model.safetensors is missing)",)
    assert result.adapter is not None  # said "(absent)", not Python's None
    assert f"adapter: differs (sha256 {result.adapter.sha256_a[:12]} vs (absent))" in result.format()


@pytest.mark.parametrize("name", ["ledger.jsonl", "split.json", "adapter/adapter_model.safetensors"])
def test_a_directory_where_a_run_file_belongs_is_damage_not_absence(
    ref: Path, tmp_path: Path, name: str
) -> None:
    """A run file replaced by a directory is refused as damage, naming it: it read as missing (a
    split.json directory compared IDENTICAL with a note "has no split.json")."""
    other = tmp_path / "damaged"
    shutil.copytree(ref, other)
    (other / name).unlink()
    (other / name).mkdir()
    with pytest.raises(InputError, match="is a directory, where the run writes a file") as info:
        compare_runs(ref, other)
    assert info.value.source == str(other / name)


def test_to_json_is_canonical_and_complete(ref: Path, tmp_path: Path) -> None:
    """to_json() is JSON-serializable, versioned, and carries verdict, where, causes and differences."""
    result = compare_runs(ref, write_run_dir(tmp_path / "seed43", RunSpec(seed=43)))
    data = json.loads(canonical_dumps(result.to_json()))
    assert data["schema"] == "reprotune/comparison"
    assert data["schema_version"] == 2 and "next_steps" in data
    assert data["verdict"] == "DIVERGED"
    assert data["where"]["first_divergence_step"] == 0
    assert data["causes"] == list(result.causes)
    root = {"category": "seeds", "key": "seeds.root", "a": 42, "b": 43, "change": "changed", "inert": False}
    assert root in data["differences"]
    assert data["resumes"] == []
    assert data["split"]["rows_differing"] == result.split.rows_differing if result.split else False


def test_verdict_prints_as_its_value() -> None:
    """A verdict formats as its plain value on every Python, and compares equal to the string."""
    assert f"{Verdict.WITHIN_TOLERANCE}" == "WITHIN_TOLERANCE"
    assert Verdict.IDENTICAL == "IDENTICAL"
    assert Verdict.WITHIN_TOLERANCE.label == "WITHIN TOLERANCE"


@pytest.mark.parametrize("tolerance", [-1.0, float("nan"), float("inf")], ids=["negative", "nan", "inf"])
def test_bad_tolerance(ref: Path, tolerance: float) -> None:
    """A tolerance that is negative or not finite is bad input."""
    with pytest.raises(InputError, match="tolerance"):
        compare_runs(ref, ref, tolerance=tolerance)


#: One row per kind of fact the inert table holds (inert.INERT_KEYS and its patterns), each
#: with a value pair: listed under "cannot change the numbers", never a cause.
INERT_ROWS = [
    ("code.branch", "main", "feature"),
    ("code.patch_file", "code.patch", None),
    ("config.config_dir", "/a", "/b"),
    ("config.data.path", "a.jsonl", "b.jsonl"),
    ("config.lora.base_model_name_or_path", "/home/a/model", "/home/b/model"),  # a Trainer-made run's
    ("config.model.name", "tiny", "tiny-copy"),
    ("config.split.manifest", "a.json", "b.json"),
    ("config.tracking.uri", "sqlite:///a.db", "sqlite:///b.db"),
    ("data.manifest_file", "split.json", "other.json"),
    ("data.manifest_source", "made", "given"),
    ("data.source", "a.jsonl", "b.jsonl"),
    ("data.split_warnings", [], ["rare"]),
    ("distributed.ranks[1]", None, {"rank": 1}),
    ("distributed.ranks[1].host", "node-a", "node-b"),
    ("distributed.ranks[1].device", "cuda:1", "cuda:0"),
    ("distributed.ranks[1].environment_sha256", "a" * 64, "b" * 64),
    ("distributed.ranks[1].environment.python.executable", "/a/bin/python", "/b/bin/python"),
    ("distributed.timeout_s", 60, 120),
    ("environment.cpu.logical_cores", 2, 8),
    ("environment.kernels.version", 1, 2),
    ("environment.python.executable", "/a/.venv/bin/python", "/a/.venv-floor/bin/python"),
    ("environment.stack", "tested (lock)", "untested"),
    ("lora.base_model_name_or_path", "a", "b"),
    ("lora.peft_version", "0.21.2", None),
    ("model.kind", "a", "b"),
    ("model.requested_revision", "a", "b"),
    ("model.resolved_path", "/a", "/b"),
    ("model.revision", "a", "b"),
    ("model.source", "a", "b"),
    ("environment.env.MLFLOW_EXPERIMENT_ID", None, "3"),
    ("environment.env.MLFLOW_TRACKING_URI", None, "sqlite:///mlflow.db"),
    ("environment.env.WANDB_NOTES", None, "x"),
    ("environment.env.TENSORBOARD_LOGDIR", None, "tb"),
    ("environment.env.HF_HUB_DISABLE_TELEMETRY", None, "1"),
    ("code.untracked", [], ["train.log", "wandb/run-1/files/output.log", "events.out.tfevents.17.host"]),
    ("config.trainer.args.logging_steps", 500, 1),
    ("config.trainer.args.save_steps", 500, 2),
    ("config.trainer.args.save_strategy", "no", "steps"),
    ("config.trainer.args.push_to_hub", False, True),
]

#: And what stays a possible cause however innocent its name looks.
CAUSE_ROWS = [
    ("environment.env.CUBLAS_WORKSPACE_CONFIG", None, ":4096:8"),
    ("environment.env.OMP_NUM_THREADS", "1", "2"),
    ("code.untracked", [], ["train.log", "helpers.py"]),
    ("code.commit", "a" * 40, "b" * 40),
    ("config.train.learning_rate", 0.1, 0.2),
    ("config.trainer.args.eval_steps", 4, 2),  # an evaluation may draw from the RNG the steps use
    ("config.trainer.args.learning_rate", 0.1, 0.2),
    ("distributed.ranks[1].environment.kernels.cpu.aten_capability", "AVX512", "DEFAULT"),
    ("distributed.ranks[1].environment.threads.torch_intra_op", 1, 2),
]


@pytest.mark.parametrize(("key", "a", "b"), INERT_ROWS, ids=[row[0] for row in INERT_ROWS])
def test_each_row_of_the_inert_table_cannot_change_the_numbers(key: str, a: object, b: object) -> None:
    from reprotune._proof.inert import INERT_KEYS, is_inert

    assert is_inert(key, a, b)
    assert {row[0] for row in INERT_ROWS} >= set(INERT_KEYS) - {"config.tracking"} | {"config.tracking.uri"}


@pytest.mark.parametrize(("key", "a", "b"), CAUSE_ROWS, ids=[f"{r[0]}={r[2]}" for r in CAUSE_ROWS])
def test_what_can_change_the_numbers_is_not_inert(key: str, a: object, b: object) -> None:
    from reprotune._proof.inert import is_inert

    assert not is_inert(key, a, b)


def test_log_files_and_tracker_variables_never_rank_above_a_seed(ref: Path, tmp_path: Path) -> None:
    """Run B has another data-order seed, untracked log files and the variables a Trainer's MLflow
    reporting sets: the seed is the one cause; the rest is listed as unable to change the numbers."""
    other = write_run_dir(
        tmp_path / "noisy",
        RunSpec(
            seed_overrides={"data_order": 5},
            environment={"env": {"MLFLOW_EXPERIMENT_ID": "3", "MLFLOW_TRACKING_URI": "file:./mlruns"}},
        ),
    )
    record = json.loads((other / "record.json").read_text())
    record["code"]["untracked"] = ["train.log", "logs/stdout.txt"]
    (other / "record.json").write_text(json.dumps(record))
    result = compare_runs(ref, other)
    assert result.causes == (f"data order differs from step 1: derived seed data_order {_seed(ref)} vs 5",)
    inert = {d.key for d in result.differences if d.inert}
    assert {
        "environment.env.MLFLOW_EXPERIMENT_ID",
        "environment.env.MLFLOW_TRACKING_URI",
        "code.untracked",
    } <= inert
    assert "(cannot change the numbers)" in result.format()


def test_a_recorded_peft_before_seed_finding_is_the_first_cause_when_the_init_differs(
    ref: Path, tmp_path: Path
) -> None:
    """Initial weights that differ, nothing recorded that explains them, but run B's record (a
    Trainer's) warns that its LoRA init was not covered by its seed: that finding is the first
    cause, not "nondeterminism"."""
    other = write_run_dir(tmp_path / "late-seed", RunSpec(noise_from_step=1))
    edit_ledger(other, 0, "weights_sha256", "f" * 64, kind="init", as_written=True)
    plain = compare_runs(ref, other)
    assert plain.where.first_weights_step == 0 and plain.causes[0].startswith(
        "the LoRA initial weights differ"
    )
    assert not any("peft-before-seed" in cause for cause in plain.causes)

    record = json.loads((other / "record.json").read_text())
    record["findings"] = [
        {"code": "peft-before-seed", "severity": "warning", "title": "built unseeded", "fix": "seed first"}
    ]
    (other / "record.json").write_text(canonical_dumps(record))
    result = compare_runs(ref, other)
    assert result.causes[0] == (
        "the LoRA initial weights differ (step 0): run B's record warns peft-before-seed: built unseeded "
        "(fix: seed first)"
    )
    assert result.next_steps == ()

    # Two unseeded Trainer runs, kernel facts recorded and equal: one cause naming both records,
    # and no "nothing recorded differs" beside it (it was said, with the finding once per run)
    kernels = {"kernels": {"version": 1, "cpu": {"aten_capability": "AVX2", "model": "EPYC"}}}
    one = write_run_dir(tmp_path / "one", RunSpec(environment=kernels))
    two = write_run_dir(tmp_path / "two", RunSpec(noise_from_step=1, environment=kernels))
    edit_ledger(two, 0, "weights_sha256", "e" * 64, kind="init", as_written=True)
    for run in (one, two):
        data = json.loads((run / "record.json").read_text())
        (run / "record.json").write_text(canonical_dumps({**data, "findings": record["findings"]}))
    result = compare_runs(one, two)
    assert result.causes == (
        "the LoRA initial weights differ (step 0): both runs' records warn peft-before-seed: built unseeded "
        "(fix: seed first)",
    )


def test_a_steering_variable_is_one_cause_with_the_kernels_not_two(tmp_path: Path) -> None:
    """The record's environment variables and its kernel facts' steering_env both hold MKL_CBWR: a
    run in a portable mode against a native one names it once, in the kernel cause (it was listed
    again as a second environment cause)."""

    def environment(cbwr: str | None) -> dict[str, Any]:
        kernels = {"version": 1, "cpu": {"model": "EPYC"}, "steering_env": {"MKL_CBWR": cbwr}}
        return {"kernels": kernels, "env": {"MKL_CBWR": cbwr} if cbwr else {}}

    ref = write_run_dir(tmp_path / "native", RunSpec(environment=environment(None)))
    portable = write_run_dir(
        tmp_path / "portable", RunSpec(noise_from_step=1, environment=environment("COMPATIBLE,STRICT"))
    )
    result = compare_runs(ref, portable)
    assert len(result.causes) == 1, result.causes
    assert "kernel environment variables MKL_CBWR=unset vs MKL_CBWR=COMPATIBLE,STRICT" in result.causes[0]
    assert any(d.key == "environment.env.MKL_CBWR" for d in result.differences)  # still listed


def test_a_trace_command_unsets_before_it_sets() -> None:
    """`env` reads its `-u` options before the first VAR=value: unsets go first (after one, `env`
    took `-u` for the command to run, exit 127); values and the path are quoted for a shell."""
    from reprotune._proof.microscope import steering_assignments, trace_command

    recorded = {"steering_env": {"MKL_NUM_THREADS": "4", "OMP_NUM_THREADS": None}}
    here = {"steering_env": {"MKL_NUM_THREADS": None, "OMP_NUM_THREADS": "8"}}
    assignments = steering_assignments(recorded, here)
    assert assignments == ["MKL_NUM_THREADS=4", "-u OMP_NUM_THREADS"]
    command = trace_command("runs/my run", 3, assignments)
    assert command == "env -u OMP_NUM_THREADS MKL_NUM_THREADS=4 reprotune trace 'runs/my run' --step 3"


def test_torchs_algorithm_settings_alone_are_kernel_settings_not_two_machines(tmp_path: Path) -> None:
    """On one H200 a strict run and an off run parted at the efficient attention's backward, which
    deterministic algorithms switch: the kernel facts differ only in torch's settings, so the cause
    says so (not "CPU kernels differ ... on these two machines") and still counts as a kernel cause
    (the trace commands follow); against a record from before the section, nothing is claimed."""
    from reprotune._proof.causes import is_traceable_cause

    gpu = {"devices": [{"index": 0, "name": "NVIDIA H200", "capability": "9.0", "sm_count": 132}]}

    def environment(deterministic: bool | None) -> dict[str, Any]:
        kernels: dict[str, Any] = {"version": 1, "cpu": {"model": "Xeon"}, "cuda": gpu}
        if deterministic is not None:
            kernels["algorithms"] = {"deterministic_algorithms": deterministic, "cudnn_benchmark": False}
        return {"kernels": kernels}

    strict = write_run_dir(tmp_path / "strict", RunSpec(environment=environment(True)))
    off = write_run_dir(tmp_path / "off", RunSpec(noise_from_step=2, environment=environment(False)))
    causes = compare_runs(strict, off).causes
    assert (
        "kernel settings differ: torch's algorithm settings deterministic_algorithms=True vs "
        "deterministic_algorithms=False" in causes[0]
    ), causes
    assert "two machines" not in causes[0] and is_traceable_cause(causes[0])
    older = write_run_dir(tmp_path / "older", RunSpec(noise_from_step=2, environment=environment(None)))
    assert not any("algorithm settings" in c for c in compare_runs(strict, older).causes)


def test_two_cpus_in_one_portable_mode_that_still_part_are_not_told_to_pin_the_mode(tmp_path: Path) -> None:
    """Two AMD CPUs, both runs in determinism.cpu_isa avx2-amd, parted all the same: the cause names
    the CPUs that differ and says both ran in the mode (its pins did not hold there), instead of
    advising the mode they already ran in; in native, the advice stands."""

    def environment(isa: list[str], model: str, mode: str) -> dict[str, Any]:
        cpu = {"aten_capability": "AVX2", "model": model, "isa": isa, "vendor": "AuthenticAMD"}
        return {"kernels": {"version": 1, "cpu": cpu, "portable": {"cpu_isa": mode}}}

    narrow, wide = ["avx", "avx2", "fma"], ["avx", "avx2", "fma", "avx512f"]
    for mode in ("avx2-amd", "native"):
        one = write_run_dir(
            tmp_path / f"{mode}-one", RunSpec(environment=environment(wide, "EPYC 9B14", mode))
        )
        two = write_run_dir(
            tmp_path / f"{mode}-two",
            RunSpec(noise_from_step=1, environment=environment(narrow, "EPYC 7B12", mode)),
        )
        cause = compare_runs(one, two).causes[0]
        assert (
            "from step 1 with identical data order: CPU kernels differ: CPU EPYC 9B14 vs EPYC 7B12; "
            "CPU instruction sets only avx512f" in cause
        )
        pinned = "both ran in determinism.cpu_isa avx2-amd, which pins every kernel knob reprotune knows"
        assert (pinned in cause) == (mode == "avx2-amd"), cause
        advice = "determinism.cpu_isa: avx2-amd on both pins CPU kernels to one baseline AMD CPUs share"
        assert (advice in cause) == (mode == "native")


@pytest.mark.parametrize(
    ("vendors", "advice"),
    [
        (("GenuineIntel", "GenuineIntel"), "determinism.cpu_isa: avx2 on both"),
        (("GenuineIntel", "AuthenticAMD"), "determinism.cpu_isa: avx2-compatible on both"),
        ((None, "AuthenticAMD"), "avx2 on Intel CPUs, avx2-amd on AMD, avx2-compatible across them"),
    ],
)
def test_the_kernel_cause_advises_the_baseline_both_cpus_can_hold(
    tmp_path: Path, vendors: tuple[str | None, str | None], advice: str
) -> None:
    """Native runs on two CPUs that part: the advice names the mode both machines' vendors can hold
    (Intel and Intel: avx2; Intel and AMD: the vendor-neutral avx2-compatible); a vendor one record
    lacks (written before the fact) gets every mode, each with the CPUs it is for."""

    def environment(vendor: str | None, capability: str) -> dict[str, Any]:
        cpu = {"aten_capability": capability, "model": "x", **({"vendor": vendor} if vendor else {})}
        return {"kernels": {"version": 1, "cpu": cpu, "portable": {"cpu_isa": "native"}}}

    one = write_run_dir(tmp_path / "one", RunSpec(environment=environment(vendors[0], "AVX512")))
    two = write_run_dir(
        tmp_path / "two", RunSpec(noise_from_step=1, environment=environment(vendors[1], "AVX2"))
    )
    cause = compare_runs(one, two).causes[0]
    assert "CPU kernels differ: CPU capability AVX512 vs AVX2" in cause and advice in cause, cause


def test_runs_that_part_first_in_a_validation_pass_trace_their_first_differing_training_step(
    tmp_path: Path,
) -> None:
    """A trace replays an optimizer step, not a validation pass: where the runs part first in a
    validation loss, compare says so and its commands trace the first training step where they
    part; with none, it prints no command (traces of agreeing steps would show nothing)."""
    kernels = {"kernels": {"version": 1, "cpu": {"aten_capability": "AVX2", "model": "EPYC"}}}
    ref = write_run_dir(tmp_path / "ref", RunSpec(environment=kernels))
    later = write_run_dir(tmp_path / "later", RunSpec(noise_from_step=6, environment=kernels))
    edit_ledger(later, 4, "loss", (0.5).hex(), kind="val", as_written=True)
    result = compare_runs(ref, later)
    assert result.where.first_divergence_step == 4 and result.where.first_val_step == 4
    assert result.next_steps[0] == (
        "the runs part first in the validation after step 4, their training steps agreeing through "
        "it: `reprotune trace` replays an optimizer step, not a validation pass; their training "
        "parts at step 6, traced here:"
    )
    assert result.next_steps[2] == f"  reprotune trace {ref} --step 6 --out A-step-6.trace.jsonl"
    assert result.next_steps[-1] == "  reprotune compare A-step-6.trace.jsonl B-step-6.trace.jsonl"
    only = write_run_dir(tmp_path / "only", RunSpec(environment=kernels))
    for step, loss in ((4, 0.5), (8, 0.25)):  # two passes (one line alone reads as an edit)
        edit_ledger(only, step, "loss", loss.hex(), kind="val", as_written=True)
    steps = compare_runs(ref, only).next_steps
    assert len(steps) == 1 and steps[0].endswith("not a validation pass")

"""ReprotuneCallback inside a real transformers.Trainer on the tiny model, in this process: every
step's exact loss whatever logging_steps is, the warnings and findings at train begin, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import transformers
from trainer_scripts import as_logged, length_grouped, tiny_trainer

from reprotune._cli import main
from reprotune._errors import InputError
from reprotune._run.ledger import batch_sha256, read_ledger
from reprotune._run.record import load_record
from reprotune._run.rundir import open_run_dir
from reprotune.integrations._findings import (
    SeedProbe,
    TrainerFacts,
    probe_seed,
    seeds_before_adapter,
    trainer_findings,
)
from reprotune.integrations._portable import sqrt_taking_optimizer
from reprotune.integrations._sections import config_misread
from reprotune.integrations.controls import STOP_AFTER, Controls
from reprotune.integrations.transformers import ReproducibilityWarning, ReprotuneCallback
from reprotune.testing import tiny_rows
from tinyrun import TinyProject


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return TinyProject.create(tmp_path_factory.mktemp("tiny")).root / "tiny-model"


def _train(
    model_dir: Path,
    tmp_path: Path,
    name: str,
    *,
    wandb: bool = False,
    prepare: Callable[[Any], None] | None = None,
    **kwargs: Any,
) -> tuple[Any, Path]:
    """A tiny Trainer run into ``tmp_path/name`` (``prepare``: applied to the Trainer first)."""
    run_dir = tmp_path / name
    trainer = tiny_trainer(
        model_dir,
        tiny_rows(40, seed=1),
        tmp_path / f"out-{name}",
        lambda: ReprotuneCallback(run_dir, code_dir=tmp_path, wandb=wandb),
        **kwargs,
    )
    if prepare is not None:
        prepare(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibilityWarning)
        trainer.train()
    return trainer, run_dir


def test_every_step_has_its_exact_loss_whatever_logging_steps(model_dir: Path, tmp_path: Path) -> None:
    """With logging_steps=1 each ledger loss is bit for bit the loss the Trainer logs for that
    step (transformers 4.x logs it rounded to 4 decimals: the ledger's, so rounded, equals it);
    with logging_steps=10 (one averaged log) the ledger is the same, line for line."""
    trainer, every = _train(model_dir, tmp_path, "every", logging_steps=1)
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    ledger = read_ledger(every / "ledger.jsonl")
    assert len(ledger.train) == 8 == len(logged)
    assert [as_logged(e.fields["loss"]) for e in ledger.train] == [float(x).hex() for x in logged]
    assert [e.fields["grad_norm"] for e in ledger.train] == [
        float(entry["grad_norm"]).hex() for entry in trainer.state.log_history if "loss" in entry
    ]

    trainer, sparse = _train(model_dir, tmp_path, "sparse", logging_steps=10)
    assert len([entry for entry in trainer.state.log_history if "loss" in entry]) == 0  # none logged
    assert (sparse / "ledger.jsonl").read_bytes() == (every / "ledger.jsonl").read_bytes()
    record = load_record(sparse)
    assert record["status"] == "completed"
    assert record["config"]["trainer"]["args"]["logging_steps"] == 10
    assert record["outputs"]["adapter_sha256"] == load_record(every)["outputs"]["adapter_sha256"]
    assert open_run_dir(sparse).ledger.init is not None
    # A Trainer-made run has no reprotune config: `rerun` refuses it with exit 2, naming the way.
    assert main(["rerun", str(sparse)]) == 2


@pytest.mark.parametrize("sized", [False, True], ids=["streamed", "sized"])
def test_an_iterable_dataset_trains_and_its_batches_are_its_rows_content(
    sized: bool, model_dir: Path, tmp_path: Path
) -> None:
    """A train set the Trainer iterates (a torch ``IterableDataset``, as a streamed dataset is,
    with a length or without): its batch sampler yields no row indices, so the run records the
    rows' content as each batch's hash and says so (``rows-unrecorded``); training goes on (it
    stopped at the first batch; with a length, at train begin, hashing rows by index)."""

    class Streamed(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
        def __init__(self, rows: list[dict[str, Any]]) -> None:
            self.rows = rows

        def __iter__(self) -> Any:
            return iter(self.rows)

    class Sized(Streamed):
        def __len__(self) -> int:
            return len(self.rows)

    def iterated(trainer: Any) -> None:
        trainer.train_dataset = (Sized if sized else Streamed)(list(trainer.train_dataset))

    _, run_dir = _train(model_dir, tmp_path, "streamed", prepare=iterated)
    record = load_record(run_dir)
    assert record["status"] == "completed" and "rows-unrecorded" in {f["code"] for f in record["findings"]}
    train = read_ledger(run_dir / "ledger.jsonl").train
    assert len(train) == 8 and all(e.fields["batch_sha256"] == e.fields["inputs_sha256"] for e in train)
    assert record["data"]["train_rows_sha256"] is None  # no rows by index to hash


def test_the_callback_changes_nothing_the_trainer_computes(model_dir: Path, tmp_path: Path) -> None:
    """The same Trainer with a plain callback and with ReprotuneCallback: every step's loss and
    grad norm bit for bit equal, and the same trained LoRA weights (the callback observes: it draws
    from no RNG and does not reorder the batches)."""
    from transformers import TrainerCallback

    deterministic = torch.are_deterministic_algorithms_enabled()
    try:  # full_determinism switches torch's deterministic algorithms on for the whole process
        plain = tiny_trainer(model_dir, tiny_rows(40, seed=1), tmp_path / "out-plain", TrainerCallback)
        plain.train()
        observed, _ = _train(model_dir, tmp_path, "observed")
    finally:
        torch.use_deterministic_algorithms(deterministic)

    def steps(trainer: Any) -> list[tuple[str, str]]:
        logged = [e for e in trainer.state.log_history if "loss" in e]
        return [(float(e["loss"]).hex(), float(e["grad_norm"]).hex()) for e in logged]

    assert len(steps(plain)) == 8 and steps(plain) == steps(observed)
    lora_plain = {k: v for k, v in plain.model.state_dict().items() if "lora_" in k}
    lora_observed = {k: v for k, v in observed.model.state_dict().items() if "lora_" in k}
    assert lora_plain.keys() == lora_observed.keys() and lora_plain
    assert all(torch.equal(lora_plain[k], lora_observed[k]) for k in lora_plain)


def test_gradient_accumulation_step_is_all_its_micro_batches(model_dir: Path, tmp_path: Path) -> None:
    """With 2 micro-batches a step, each line's loss is the step's logged loss bit for bit, and its
    rows are both micro-batches', exactly the indices the Trainer's sampler drew for that step
    (drawn ahead of use, matched by position)."""
    trainer, run_dir = _train(model_dir, tmp_path, "ga", max_steps=4, gradient_accumulation_steps=2)
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    train = read_ledger(run_dir / "ledger.jsonl").train
    assert [as_logged(e.fields["loss"]) for e in train] == [float(x).hex() for x in logged]
    # accelerate's SeedableRandomSampler: epoch 0 is randperm(rows) from seed + 0 (seed 0 here).
    order = torch.randperm(40, generator=torch.Generator().manual_seed(0)).tolist()
    expected = [batch_sha256(order[8 * i : 8 * i + 8]) for i in range(4)]
    assert [e.fields["batch_sha256"] for e in train] == expected
    assert [e.fields["n_rows"] for e in train] == [8, 8, 8, 8]


def test_callback_mirrors_to_wandb_offline(model_dir: Path, tmp_path: Path) -> None:
    """ReprotuneCallback(wandb=True): an offline W&B run in the run directory whose summary holds
    the final loss bit for bit, read back with wandb's own reader."""
    _, run_dir = _train(model_dir, tmp_path, "wb", max_steps=3, wandb=True)
    info = load_record(run_dir)["trackers"]["wandb"]
    assert info["ok"] and info["mode"] == "offline" and Path(info["run_dir"]).parent == run_dir / "wandb"
    env = {**os.environ, "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", info["run_dir"]]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=True)
    summary = json.loads(done.stdout)["summary"]
    assert summary["train_loss"] == read_ledger(run_dir / "ledger.jsonl").train[-1].number("loss")
    assert summary["status"] == "completed"


def test_the_trainers_own_wandb_files_beside_the_script_are_not_a_dirty_tree(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A script in a clean git checkout with ``report_to="wandb"``: W&B's callback writes
    ``./wandb/`` before ours reads the tree, and the run records a clean tree (before, ``wandb/``'s
    files were untracked code: dirty, and a later resume or trace refused the code as drifted once
    they changed). A file of the user's is still untracked code."""
    repo = tmp_path / "project"
    repo.mkdir()
    for command in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "script"]):
        if command[0] == "add":
            (repo / "train.py").write_text("print('train')\n")
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *command], cwd=repo, check=True
        )
    import wandb

    wandb.teardown()  # W&B keeps the directory it was first set up in for its process: set up here
    request.addfinalizer(wandb.teardown)  # and the next test's not in this one's
    monkeypatch.chdir(repo)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    runs = tmp_path / "runs"

    def train(name: str) -> dict[str, Any]:
        make = lambda: ReprotuneCallback(runs / name, code_dir=repo)  # noqa: E731
        trainer = tiny_trainer(
            model_dir, tiny_rows(16, seed=1), tmp_path / f"out-{name}", make, max_steps=2, report_to="wandb"
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ReproducibilityWarning)
            trainer.train()
        return load_record(runs / name)["code"]

    code = train("a")
    assert any((repo / "wandb").iterdir())  # W&B's callback wrote beside the script
    assert code["dirty"] is False and code["untracked"] == []
    (repo / "helper.py").write_text("x = 1\n")
    code = train("b")
    assert code["dirty"] is True and code["untracked"] == ["helper.py"]


def test_the_best_checkpoints_adapter_says_which_step_it_holds(model_dir: Path, tmp_path: Path) -> None:
    """``load_best_model_at_end``: the Trainer reloads the best checkpoint before the adapter is
    saved; the record names that step (``outputs.adapter_step``), whose ledger weights are the
    weights the run ended with (before, nothing said the adapter was not the last step's)."""
    from reprotune._model.lora import WeightsHasher, trainable_tensors

    settings = {
        "max_steps": 8,
        "learning_rate": 3.0,  # so far the loss climbs again: the best is not the last
        "eval_strategy": "steps",
        "eval_steps": 2,
        "save_strategy": "steps",
        "save_steps": 2,
        "load_best_model_at_end": True,
        "metric_for_best_model": "eval_loss",
    }
    trainer, run_dir = _train(model_dir, tmp_path, "best", eval_rows=tiny_rows(8, seed=2), **settings)
    best = int(Path(trainer.state.best_model_checkpoint).name.split("-")[-1])
    assert best < 8, "the test needs a best step before the last"
    outputs = load_record(run_dir)["outputs"]
    assert outputs["adapter_step"] == best
    ended_with = WeightsHasher(trainable_tensors(trainer.model))()
    train = read_ledger(run_dir / "ledger.jsonl").train
    assert train[best - 1].fields["weights_sha256"] == ended_with != train[-1].fields["weights_sha256"]


def test_auto_find_batch_size_retrying_after_running_out_of_memory_starts_the_run_again(
    model_dir: Path, tmp_path: Path
) -> None:
    """The first step runs out of memory at batch size 8 (raised as PyTorch's CPU allocator says
    it); the Trainer begins its loop again with a smaller batch: the run starts again in its run
    directory, the batch size it found in its config, and every line of the smaller batch (before,
    the retry refused its own run directory as not empty, and train() failed)."""
    from transformers import TrainerCallback

    class OutOfMemoryAtEight(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if trainer._train_batch_size == 8:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB")

    def prepare(made: Any) -> None:
        nonlocal trainer
        trainer = made
        made.add_callback(OutOfMemoryAtEight())

    trainer: Any = None
    settings = {"max_steps": 3, "auto_find_batch_size": True, "per_device_train_batch_size": 8}
    trained, run_dir = _train(model_dir, tmp_path, "retry", prepare=prepare, **settings)
    found = trained._train_batch_size
    assert 0 < found < 8
    record = load_record(run_dir)
    assert record["status"] == "completed" and len(record["attempts"]) == 1
    assert record["config"]["trainer"]["train_batch_size"] == found
    assert [e.fields["n_rows"] for e in read_ledger(run_dir / "ledger.jsonl").train] == [found] * 3


def test_a_second_train_after_a_failed_one_under_add_callback_keeps_the_first_run(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A callback ``add_callback`` added does not wrap ``train()``: a first train that fails leaves
    its run unfinished, and a second train() ends it interrupted and starts a run of its own (it is
    no batch-size retry: the first run's directory is kept, not taken over and emptied); without
    ``auto_find_batch_size`` finding a smaller batch the config holds no ``train_batch_size``."""
    from transformers import TrainerCallback

    class FailsAtStepTwo(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                raise ValueError("the script's own bug")

    monkeypatch.chdir(tmp_path)
    rows = tiny_rows(16, seed=1)
    trainer = tiny_trainer(model_dir, rows, tmp_path / "out", list, max_steps=4, auto_find_batch_size=True)
    trainer.add_callback(ReprotuneCallback(code_dir=tmp_path))
    trainer.add_callback(FailsAtStepTwo())
    with warnings.catch_warnings(), pytest.raises(ValueError, match="own bug"):
        warnings.simplefilter("ignore", ReproducibilityWarning)
        trainer.train()
    trainer.remove_callback(FailsAtStepTwo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibilityWarning)
        trainer.train()
    records = sorted((load_record(d) for d in (tmp_path / "runs").iterdir()), key=lambda r: r["status"])
    assert [r["status"] for r in records] == ["completed", "interrupted"]
    assert all("train_batch_size" not in r["config"]["trainer"] for r in records)


def test_every_callback_finding_code_is_known_and_documented() -> None:
    """The codes the callback's findings are made with (its rules' and ``_finding``'s) are exactly
    FINDING_CODES, and docs/integrations.md explains each one."""
    import ast

    from reprotune.integrations import _findings

    made = set()
    for node in ast.walk(ast.parse(Path(_findings.__file__).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            at = {"_finding": 0, "_Rule": 1}.get(node.func.id)
            if at is not None and isinstance(node.args[at], ast.Constant):
                made.add(node.args[at].value)
    assert made == set(_findings.FINDING_CODES)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    assert [code for code in _findings.FINDING_CODES if f"`{code}`" not in doc] == []


def test_findings_are_warned_once_and_recorded(model_dir: Path, tmp_path: Path) -> None:
    """full_determinism off, a length-grouped order and a PEFT model built before the seed are
    each warned about at train begin and recorded as findings, as doctor writes them."""
    run_dir = tmp_path / "run"
    trainer = tiny_trainer(
        model_dir,
        tiny_rows(40, seed=1),
        tmp_path / "out",
        lambda: ReprotuneCallback(run_dir, code_dir=tmp_path),
        seed_first=False,
        max_steps=2,
        full_determinism=False,
        **length_grouped(),
    )
    # The finding reads torch's process-wide flag, which other tests in this process may have
    # switched on (a strict-mode run, full_determinism): off here, as in a fresh script.
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.train()
    finally:
        torch.use_deterministic_algorithms(deterministic)
    messages = [str(w.message) for w in caught if issubclass(w.category, ReproducibilityWarning)]
    codes = [f["code"] for f in load_record(run_dir)["findings"]]
    for code in ("deterministic-algorithms-off", "sampling-strategy", "peft-before-seed"):
        assert code in codes
    assert len(messages) == len(codes)
    assert any("full_determinism" in m for m in messages)
    assert any("built before the seed was set" in m for m in messages)
    finding = load_record(run_dir)["findings"][0]
    assert set(finding) == {"code", "severity", "title", "why", "fix"}


def _facts(**changes: Any) -> TrainerFacts:
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir="unused", use_cpu=True, full_determinism=True, report_to="none")
    for key, value in changes.pop("args", {}).items():
        setattr(args, key, value)  # settings a CPU machine refuses at construction (fp16, tf32)
    base: dict[str, Any] = {
        "args": args,
        "deterministic_algorithms": True,
        "tf32_matmul": False,
        "workers_seeded": True,
        "seedable_sampler": True,
        "is_peft": True,
        "adapter_made_by_trainer": False,
        "seed_probe": SeedProbe(initial_seed=42, fresh=False),
    }
    return TrainerFacts(**{**base, **changes})


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        (
            {"args": {"full_determinism": False}, "deterministic_algorithms": False},
            "deterministic-algorithms-off",
        ),
        ({"args": {"dataloader_num_workers": 2}, "workers_seeded": False}, "dataloader-workers-unseeded"),
        ({"args": {"fp16": True}}, "fp16"),
        ({"args": {"tf32": True}}, "tf32-matmul-on"),
        ({"tf32_matmul": True}, "tf32-matmul-on"),
        ({"seed_probe": SeedProbe(initial_seed=1234, fresh=False)}, "peft-before-seed"),
        ({"seed_probe": SeedProbe(initial_seed=42, fresh=True)}, "peft-before-seed"),
        ({"args": {"train_sampling_strategy": "group_by_length"}}, "sampling-strategy"),
        ({"seedable_sampler": False}, "sampler-unseeded"),
        ({"args": {"ignore_data_skip": True}}, "ignore-data-skip"),
        ({"rows_recorded": False}, "rows-unrecorded"),
        ({"model_hashed": False}, "model-unhashed"),
        ({"data_hashed": False}, "data-unhashed"),
        ({"world_size": 2}, "distributed-rank0-only"),
        ({"args": {"torch_compile": True}}, "torch-compile"),
        ({"cpu_isa": "avx2-compatible", "unfused_optimizer": "AdamW"}, "portable-mode-optimizer"),
        ({"config_misread": ("config.json gives ...", "add ...")}, "config-read-otherwise"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_setting_gives_its_finding(changes: dict[str, Any], code: str) -> None:
    """One risky setting, one finding with that code (and none on the clean setup)."""
    assert trainer_findings(_facts()) == []
    assert [f["code"] for f in trainer_findings(_facts(**changes))] == [code]


@pytest.mark.parametrize(
    "changes",
    [
        {"adapter_made_by_trainer": True, "seed_probe": SeedProbe(initial_seed=7, fresh=True)},
        {"is_peft": False, "seed_probe": SeedProbe(initial_seed=7, fresh=True)},
        {"seed_probe": None},
    ],
    ids=["trl-peft-config", "no-peft", "callback-added-late"],
)
def test_no_seed_finding_where_it_cannot_apply(changes: dict[str, Any]) -> None:
    """An adapter the trainer builds after seeding, a model without one, or no probe: no finding."""
    assert trainer_findings(_facts(**changes)) == []


def test_only_an_unfused_optimizer_in_the_cross_vendor_mode_is_a_finding() -> None:
    """The finding needs both: avx2-compatible in force and an optimizer that takes MKL's square
    root. Which optimizers do is read from the real torch optimizers: AdamW and Adam unless fused,
    Adagrad; not SGD, not the fused AdamW."""
    assert trainer_findings(_facts(cpu_isa="avx2-compatible")) == []
    assert trainer_findings(_facts(cpu_isa="avx2-amd", unfused_optimizer="AdamW")) == []
    finding = trainer_findings(_facts(cpu_isa="avx2-compatible", unfused_optimizer="AdamW"))[0]
    assert finding["title"] == (
        "determinism.cpu_isa avx2-compatible is in force, but the optimizer (AdamW) is not the fused AdamW"
    )
    assert 'optim="adamw_torch_fused"' in finding["fix"]
    params = [torch.nn.Parameter(torch.ones(2))]
    assert sqrt_taking_optimizer(torch.optim.AdamW(params, fused=True)) is None
    assert sqrt_taking_optimizer(torch.optim.SGD(params, lr=0.1)) is None
    assert sqrt_taking_optimizer(None) is None
    assert sqrt_taking_optimizer(torch.optim.AdamW(params)) == "AdamW"
    assert sqrt_taking_optimizer(torch.optim.Adam(params, foreach=True)) == "Adam"
    assert sqrt_taking_optimizer(torch.optim.Adagrad(params)) == "Adagrad"


def test_an_adapter_the_trainer_builds_before_seeding_gives_the_seed_finding() -> None:
    """SFTTrainer(peft_config=...) on a TRL that builds the adapter before it seeds (0.x), made
    without seed_everything(args.seed) first: the finding, whose fix names where the seed goes;
    the same with the seed set first, or a trainer that seeds first (TRL 1.x): none."""
    unseeded = {"adapter_made_by_trainer": True, "trainer_seeds_first": False}
    findings = trainer_findings(_facts(**unseeded, seed_probe=SeedProbe(initial_seed=7, fresh=False)))
    assert [f["code"] for f in findings] == ["peft-before-seed"]
    assert "built the LoRA adapter from peft_config before it seeded" in findings[0]["title"]
    assert "seed_everything(args.seed) before making the trainer" in findings[0]["fix"]
    assert trainer_findings(_facts(**unseeded, seed_probe=SeedProbe(initial_seed=42, fresh=True))) == []


def test_which_trainers_seed_before_they_build_the_adapter() -> None:
    """Read from the source of the ``__init__`` that builds the adapter: a subclass that seeds
    first, one that does not, and the installed TRL's SFTTrainer (1.x seeds first, 0.x did not)."""
    import trl
    from peft import get_peft_model
    from transformers import Trainer, set_seed
    from trl import SFTTrainer

    class SeedsFirst(Trainer):
        def __init__(self, model: Any, args: Any, peft_config: Any) -> None:
            set_seed(args.seed)
            super().__init__(model=get_peft_model(model, peft_config), args=args)

    class BuildsFirst(Trainer):
        def __init__(self, model: Any, args: Any, peft_config: Any) -> None:
            model = get_peft_model(model, peft_config)
            set_seed(args.seed)
            super().__init__(model=model, args=args)

    assert seeds_before_adapter(SeedsFirst) is True
    assert seeds_before_adapter(BuildsFirst) is False
    assert seeds_before_adapter(SFTTrainer) is (int(trl.__version__.split(".")[0]) >= 1)


def test_seed_probe_reads_the_rng_without_drawing() -> None:
    """Fresh right after a seed, not after a draw; the probe itself draws nothing."""
    torch.manual_seed(42)
    assert probe_seed() == SeedProbe(42, True)
    assert probe_seed() == SeedProbe(42, True)
    torch.rand(1)
    assert probe_seed() == SeedProbe(42, False)


def test_controls_round_trip_and_refuse_bad_values() -> None:
    """What verify sets is what the callback reads; a bad value names its variable."""
    controls = Controls(
        run_dir=Path("r"), output_dir=Path("o"), stop_after=3, resume_from=Path("c"), branch_from=Path("b")
    )
    assert Controls.from_env(controls.to_env()) == controls
    assert Controls.from_env({}) == Controls()
    with pytest.raises(InputError, match=STOP_AFTER) as info:
        Controls.from_env({STOP_AFTER: "0"})
    assert info.value.source == f"environment variable {STOP_AFTER}"


def test_wandb_without_the_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """ReprotuneCallback(wandb=True) where wandb cannot be imported: an InputError with the fix."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(InputError, match=r"reprotune\[wandb\]") as info:
        ReprotuneCallback(wandb=True)
    assert info.value.source == "ReprotuneCallback(wandb=True)"


def test_a_run_dir_holding_files_is_refused(model_dir: Path, tmp_path: Path) -> None:
    """A non-empty run directory is refused before the first step, naming it; nothing is written."""
    run_dir = tmp_path / "taken"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine", encoding="utf-8")
    trainer = tiny_trainer(
        model_dir, tiny_rows(8, seed=1), tmp_path / "out", lambda: ReprotuneCallback(run_dir), max_steps=1
    )
    with pytest.raises(
        InputError,
        match=f"^ReprotuneCallback run_dir {re.escape(repr(str(run_dir)))} exists and is not empty",
    ) as info:
        trainer.train()
    assert info.value.source == "ReprotuneCallback run_dir" and "pass another run_dir" in str(info.value.fix)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]


def _children_running(module: str) -> list[int]:
    """The processes this one started that run ``python -m MODULE`` and have not ended."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue  # ended meanwhile
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and module.encode() in command:
            found.append(int(stat.parent.name))
    return found


def test_a_refused_start_with_mlflow_leaves_no_mlflow_worker(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mlflow=True`` and a run directory that is refused: the MLflow tracker is made only once the
    directory is claimed, so no worker process is left behind (one was, for every refused start: a
    notebook retrying gathered them)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_dir = tmp_path / "taken"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine", encoding="utf-8")
    trainer = tiny_trainer(
        model_dir,
        tiny_rows(8, seed=1),
        tmp_path / "out",
        lambda: ReprotuneCallback(run_dir, mlflow=True),
        max_steps=1,
    )
    with pytest.raises(InputError, match="exists and is not empty"):
        trainer.train()
    assert _children_running("reprotune._trackers.mlflow_worker") == []
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]


def test_sigterm_during_training_records_the_run_interrupted_then_ends_as_the_signal_would(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM (what `kill`, a scheduler or verify's leg timeout sends) mid-training, with its
    default action in force: the record says `interrupted` with its end time and the lock is
    released (it stayed `running`, locked); then the signal is sent again, the default action
    back, so that the script ends as it would have without reprotune (here the sending is caught:
    it would end pytest)."""
    import signal
    import types

    from transformers import TrainerCallback

    import reprotune.integrations.transformers as callback_module
    from reprotune._errors import Interrupted

    class TermAtStepTwo(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == 2:
                signal.raise_signal(signal.SIGTERM)

    delivered: list[tuple[int, object]] = []

    class _Os(types.SimpleNamespace):
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

    fake_os = _Os(kill=lambda pid, sig: delivered.append((sig, signal.getsignal(sig))))
    monkeypatch.setattr(callback_module, "os", fake_os)
    run_dir = tmp_path / "termed"
    trainer = tiny_trainer(
        model_dir, tiny_rows(16, seed=1), tmp_path / "out", lambda: ReprotuneCallback(run_dir)
    )
    trainer.add_callback(TermAtStepTwo())
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with pytest.raises(Interrupted):
        trainer.train()
    record = load_record(run_dir)
    assert record["status"] == "interrupted" and record["timings"]["ended_at"]
    assert record["error"] == {"message": "stopped by SIGTERM", "type": "Interrupted"}
    assert len(read_ledger(run_dir / "ledger.jsonl").train) == 2
    assert not (run_dir / ".writer.lock").exists()  # released: `reprotune resume`/compare see it ended
    assert delivered == [(signal.SIGTERM, signal.SIG_DFL)]  # once, after the record, to the default


def test_the_callback_needs_no_training_code() -> None:
    """Importing the integration does not import reprotune's own training code: of ``_train`` only
    the run writer, which every path that writes a run directory shares."""
    code = (
        "import sys, reprotune.integrations.transformers; "
        "print(sorted(m for m in sys.modules if m.startswith('reprotune._train')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['reprotune._train', 'reprotune._train.writer']"


def test_an_rng_seeded_otherwise_when_the_callback_was_made_names_both_possible_causes() -> None:
    """The RNG is read when the callback is made: another seed there means an unseeded PEFT model,
    or a callback made before the script seeded; the finding says both and how to place each."""
    [finding] = trainer_findings(_facts(seed_probe=SeedProbe(initial_seed=1234, fresh=False)))
    title = finding["title"]
    assert (
        "torch's RNG seed was 1234, not TrainingArguments.seed=42, when the callback was made (a random"
        in title
    )
    assert "or the callback was made before the script seeded" in title
    assert "make the callback in the Trainer(...) call, after both" in finding["fix"]


@pytest.mark.parametrize("flag", ["mlflow", "wandb"])
def test_a_tracker_switch_that_is_not_a_bool_is_refused(flag: str) -> None:
    """``ReprotuneCallback(mlflow="yes")`` would have switched the tracker on by truthiness."""
    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback

    with pytest.raises(InputError, match=f"{flag}='yes' is not True or False"):
        ReprotuneCallback(**{flag: "yes"})


@pytest.mark.parametrize("project", [7, ""])
def test_a_wandb_project_that_is_not_a_name_is_refused(project: object) -> None:
    """A non-string project would only fail when the run's record is written at its end."""
    from reprotune._errors import InputError
    from reprotune.integrations.transformers import ReprotuneCallback

    with pytest.raises(InputError, match=f"wandb_project={project!r} is not a project name"):
        ReprotuneCallback(wandb_project=project)  # type: ignore[arg-type]


def test_a_second_callback_is_refused_before_any_run_directory_is_made(
    model_dir: Path, tmp_path: Path
) -> None:
    """Two ReprotuneCallbacks in one Trainer (in callbacks=[...], or one more by add_callback):
    refused by name; it said 'the run directory is not empty' of a new one, or failed with 'no
    training_step was observed'."""
    run_dir = tmp_path / "twice"
    with pytest.raises(InputError, match="the Trainer holds 2 ReprotuneCallbacks") as info:
        tiny_trainer(
            model_dir,
            tiny_rows(8, seed=1),
            tmp_path / "out",
            lambda: [ReprotuneCallback(run_dir), ReprotuneCallback(run_dir)],
            max_steps=1,
        )
    assert "give the Trainer one ReprotuneCallback" in str(info.value)
    trainer = tiny_trainer(
        model_dir, tiny_rows(8, seed=1), tmp_path / "out", lambda: ReprotuneCallback(run_dir), max_steps=1
    )
    trainer.add_callback(ReprotuneCallback(tmp_path / "other"))
    with pytest.raises(InputError, match="the Trainer holds 2 ReprotuneCallbacks"):
        trainer.train()
    assert not run_dir.exists() and not (tmp_path / "other").exists()


def test_resume_of_a_completed_trainer_run_and_a_run_dir_inside_a_run_say_what_applies(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`reprotune resume` of a completed Trainer-made run points to running the script again (it
    offered `reprotune rerun`, which refuses such runs); a callback run_dir inside a run directory
    is refused naming the callback's run_dir (it named a --run-dir option the callback has not)."""
    run_dir = tmp_path / "done"
    tiny_trainer(
        model_dir, tiny_rows(8, seed=1), tmp_path / "out", lambda: ReprotuneCallback(run_dir), max_steps=1
    ).train()
    assert main(["resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "written by ReprotuneCallback inside a Trainer script: it completed" in err
    assert (
        "fix: run the script again and `reprotune compare` the two runs" in err
        and "reprotune rerun" not in err
    )
    inside = run_dir / "sub"
    trainer = tiny_trainer(
        model_dir, tiny_rows(8, seed=1), tmp_path / "out2", lambda: ReprotuneCallback(inside), max_steps=1
    )
    with pytest.raises(
        InputError, match=f"ReprotuneCallback run_dir '{inside}' is inside the run directory {run_dir}"
    ):
        trainer.train()
    assert not inside.exists()


@pytest.mark.parametrize("seed_first", [True, False], ids=["seeded-init", "unseeded-init"])
def test_a_data_seed_control_parted_before_its_batches_is_inconclusive(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seed_first: bool
) -> None:
    """verify --command's data-order control: with the LoRA built after the seed it parts where
    its batches do and counts; built before (an unseeded init), it parts at step 0, before any
    batch, so its DIVERGED proves nothing about the check: inconclusive, not ok."""
    from reprotune._proof.verification import Leg, judge_data_order_control

    _, reference = _train(model_dir, tmp_path, "reference", max_steps=3, seed_first=seed_first)
    monkeypatch.setenv("REPROTUNE_PERTURB_DATA_SEED", "1")
    _, control = _train(model_dir, tmp_path, "control", max_steps=3, seed_first=seed_first)
    leg, comparison = judge_data_order_control(Leg("control-data-seed", str(control), "DIVERGED"), reference)
    assert leg.verdict == "DIVERGED"
    if seed_first:
        assert comparison.where.first_divergence_step == comparison.where.first_batch_step == 1
        assert leg.passed is True and leg.note is not None and leg.note.startswith("why: ")
    else:
        assert comparison.where.first_divergence_step == 0 and comparison.where.first_batch_step == 1
        assert leg.passed is None
        assert leg.note is not None
        assert "parted at step 0 (the initial weights), before its batches" in leg.note


def test_an_output_dir_holding_another_runs_checkpoints_is_a_finding(model_dir: Path, tmp_path: Path) -> None:
    """Run B saving into the output_dir where run A saved its checkpoints (B's saves at the same
    steps overwrite A's, after which A cannot resume from them): warned and recorded at train
    begin, naming A's checkpoints. A resuming from its own checkpoint there gets no such finding,
    also with resume_from_checkpoint=True (the last checkpoint, as the Trainer takes it)."""
    out = tmp_path / "out"

    def trainer(name: str) -> Any:
        make = lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path)  # noqa: E731
        return tiny_trainer(
            model_dir, tiny_rows(40, seed=1), out, make, max_steps=2, save_strategy="steps", save_steps=1
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibilityWarning)
        trainer("a").train()
    run_a = load_record(tmp_path / "a")["run_id"]
    assert "output-dir-shared" not in [f["code"] for f in load_record(tmp_path / "a")["findings"]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer("b").train()
    shared = [f for f in load_record(tmp_path / "b")["findings"] if f["code"] == "output-dir-shared"]
    assert len(shared) == 1 and shared[0]["severity"] == "warning"
    assert shared[0]["title"] == (
        f"output_dir {out} holds checkpoints another run saved: "
        f"checkpoint-1 (run {run_a}), checkpoint-2 (run {run_a})"
    )
    assert any("holds checkpoints another run saved" in str(w.message) for w in caught)

    from reprotune.integrations._ranks import foreign_checkpoints

    # Now B's markers are in both: B resuming from its own last checkpoint sees nothing foreign.
    assert foreign_checkpoints(str(out), "True") == ()
    assert foreign_checkpoints(str(out), str(out / "checkpoint-1")) == ()
    assert foreign_checkpoints(str(out), None) == tuple(
        f"checkpoint-{n} (run {load_record(tmp_path / 'b')['run_id']})" for n in (1, 2)
    )
    assert foreign_checkpoints(str(tmp_path / "nowhere"), None) == ()
    # A branch (a resume into a new run directory) is a new run: every checkpoint there is another's.
    assert len(foreign_checkpoints(str(out), str(out / "checkpoint-1"), tmp_path / "branch")) == 2
    assert foreign_checkpoints(str(out), str(out / "checkpoint-1"), tmp_path / "b") == ()


def test_a_rotary_base_this_transformers_does_not_read_is_a_finding(model_dir: Path, tmp_path: Path) -> None:
    """A base model whose config.json gives its rotary base only in ``rope_parameters`` (as
    transformers 5 writes it), trained under the callback: transformers 4 (the floors' part of
    scripts/test.sh) computes with its default base, which the callback warns and records, naming
    the file, both bases and the key to add; transformers 5 reads it, and there is no finding."""
    rope_only = tmp_path / "rope-only-model"
    shutil.copytree(model_dir, rope_only)
    config = json.loads((rope_only / "config.json").read_text(encoding="utf-8"))
    for legacy in ("rope_theta", "rope_scaling"):
        config.pop(legacy, None)
    config["rope_parameters"] = {"rope_theta": 100000.0, "rope_type": "default"}
    (rope_only / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    _, run_dir = _train(rope_only, tmp_path, "run", max_steps=1)
    found = [f for f in load_record(run_dir)["findings"] if f["code"] == "config-read-otherwise"]
    if int(transformers.__version__.split(".")[0]) >= 5:
        assert found == []
        return
    assert len(found) == 1 and found[0]["severity"] == "warning"
    assert found[0]["title"] == (
        f"{rope_only.resolve() / 'config.json'} gives the rotary base as "
        "rope_parameters.rope_theta = 100000.0, a key this transformers does not read: the model "
        "computes with rope_theta 10000.0 (its default), "
        "not the model that was saved (by transformers 5)"
    )
    assert found[0]["fix"] == (
        'add "rope_theta": 100000.0 beside rope_parameters in config.json, or use transformers 5'
    )


def test_config_misread_compares_the_loaded_config_with_its_file(tmp_path: Path) -> None:
    """What the callback reads on either stack: the loaded config's rotary base against the
    config.json of the folder the model section found (transformers 4's default 10000.0 against
    the file's 100000.0 is a misreading, with the fix naming the value); an equal base, a file
    with ``rope_theta`` at its top, or no folder found, is none."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}))
    found = {"resolved_path": str(tmp_path)}
    read_as = lambda theta: SimpleNamespace(config=SimpleNamespace(rope_theta=theta))  # noqa: E731
    misread = config_misread(read_as(10000.0), found)
    assert misread is not None
    assert misread[0].startswith(f"{path} gives the rotary base as rope_parameters.rope_theta = 100000.0")
    assert (
        misread[1]
        == 'add "rope_theta": 100000.0 beside rope_parameters in config.json, or use transformers 5'
    )
    assert config_misread(read_as(100000.0), found) is None
    assert config_misread(read_as(10000.0), {"resolved_path": None}) is None
    path.write_text(json.dumps({"rope_theta": 100000.0, "rope_parameters": {"rope_theta": 100000.0}}))
    assert config_misread(read_as(10000.0), found) is None


def test_what_the_trainers_own_callbacks_write_in_an_output_dir_inside_the_run_dir_is_no_other_run(
    model_dir: Path, tmp_path: Path
) -> None:
    """verify's legs put the Trainer's output directory inside the run directory; a callback the
    Trainer calls first (TensorBoard's, in transformers 5) writes there at train begin. The run
    directory is still claimed, also by a branch (a resume from another run's checkpoint, as
    `trace --command` makes); a file of anyone else's there is still refused."""
    from transformers import TrainerCallback

    class EventWriter(TrainerCallback):  # as TensorBoard's: its log directory under output_dir
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            (Path(args.output_dir) / "runs").mkdir(parents=True, exist_ok=True)
            (Path(args.output_dir) / "runs" / "events.out").write_bytes(b"event")

    def trainer(run_dir: Path) -> Any:
        make = lambda: [EventWriter(), ReprotuneCallback(run_dir, code_dir=tmp_path)]  # noqa: E731
        rows = tiny_rows(40, seed=1)
        return tiny_trainer(
            model_dir,
            rows,
            run_dir / "trainer-output",
            make,
            max_steps=2,
            save_strategy="steps",
            save_steps=1,
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReproducibilityWarning)
        trainer(tmp_path / "leg").train()
        assert load_record(tmp_path / "leg")["status"] == "completed"
        trainer(tmp_path / "branch").train(
            resume_from_checkpoint=str(tmp_path / "leg" / "trainer-output" / "checkpoint-1")
        )
        assert load_record(tmp_path / "branch")["attempts"][-1]["branched_from"]["run_dir"] == str(
            (tmp_path / "leg").resolve()
        )
        (tmp_path / "taken").mkdir()
        (tmp_path / "taken" / "notes.txt").write_text("mine")
        with pytest.raises(InputError, match="exists and is not empty"):
            trainer(tmp_path / "taken").train()


def test_a_failed_branch_removes_what_it_wrote_and_leaves_the_trainers_output_dir(tmp_path: Path) -> None:
    """A branch refused after its copy removes its own files so that a retry starts afresh; the
    Trainer's output directory inside the run directory (verify's legs put it there), which it may
    hold from before (TensorBoard's event files), is left."""
    from reprotune._run.layout import RunLayout
    from reprotune.integrations._resumable import remove_branch

    root = tmp_path / "leg"
    (root / "trainer-output" / "runs").mkdir(parents=True)
    (root / "trainer-output" / "runs" / "events.out").write_bytes(b"event")
    for name in ("record.json", "ledger.jsonl"):
        (root / name).write_text("{}")
    (root / "split.rows").mkdir()
    remove_branch(RunLayout(root), str(root / "trainer-output"))
    assert [p.name for p in root.iterdir()] == ["trainer-output"]
    assert (root / "trainer-output" / "runs" / "events.out").read_bytes() == b"event"
    remove_branch(RunLayout(root))
    assert list(root.iterdir()) == []


def test_scored_tokens_shift_a_causal_lms_labels_and_count_a_classifiers_whole() -> None:
    """A causal LM's labels are shifted (the first token is never scored); a sequence classifier's
    labels, one a row, are counted whole (they were shifted too: B - 1 a micro-batch)."""
    from reprotune.integrations._probes import _scored_tokens

    ids = torch.ones(3, 5, dtype=torch.long)
    causal = torch.tensor([[-100, 1, 1, 1, -100]] * 3)
    assert _scored_tokens({"input_ids": ids, "labels": causal}) == 9
    assert _scored_tokens({"inputs_embeds": torch.zeros(3, 5, 4), "labels": causal}) == 9
    assert _scored_tokens({"input_ids": ids, "labels": torch.tensor([0, 1, 1])}) == 3
    assert _scored_tokens({"input_ids": ids, "attention_mask": torch.ones(3, 5)}) == 15


def test_runs_apart_in_logging_and_saving_alone_give_the_same_bits(model_dir: Path, tmp_path: Path) -> None:
    """What compare's inert table says of a Trainer's logging_* and save_* arguments, shown: two
    runs apart in them alone write byte-identical ledgers and adapters, and compare lists the
    arguments as unable to change the numbers, never as a cause."""
    from reprotune._proof.compare import compare_runs

    def train(name: str, **args: Any) -> None:
        made = lambda: ReprotuneCallback(tmp_path / name, code_dir=tmp_path)  # noqa: E731
        tiny_trainer(model_dir, tiny_rows(40, seed=1), tmp_path / f"out-{name}", made, **args).train()

    train("a", logging_steps=1)
    train(
        "b", logging_steps=3, logging_first_step=True, save_strategy="steps", save_steps=2, save_total_limit=1
    )
    for name in ("ledger.jsonl", "adapter/adapter_model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    result = compare_runs(tmp_path / "a", tmp_path / "b")
    assert result.verdict.value == "IDENTICAL"
    listed = {d.key: d.inert for d in result.differences if d.key.startswith("config.trainer.args.")}
    assert listed and all(listed.values()), listed


def test_named_eval_datasets_each_write_a_val_line_and_are_hashed(model_dir: Path, tmp_path: Path) -> None:
    """``eval_dataset={"val": ..., "test": ...}``: the Trainer logs ``eval_val_loss`` and
    ``eval_test_loss``; each is a val line of its set's rows, in the dict's order, and the data
    section counts and hashes both sets and names them in their order (before: no val line at all,
    ``eval_rows`` the number of keys, no hash)."""
    made = lambda: ReprotuneCallback(tmp_path / "run", code_dir=tmp_path)  # noqa: E731
    sets = {"val": tiny_rows(8, seed=2), "test": tiny_rows(6, seed=3)}
    trainer = tiny_trainer(
        model_dir,
        tiny_rows(40, seed=1),
        tmp_path / "out",
        made,
        eval_rows=sets,
        eval_strategy="steps",
        eval_steps=4,
    )
    trainer.train()
    history = {
        k: e[k] for e in trainer.state.log_history for k in e if k.endswith("_loss") and e["step"] == 4
    }
    val = [e for e in read_ledger(tmp_path / "run" / "ledger.jsonl").entries() if e.kind == "val"]
    assert [(e.step, e.fields["n_rows"]) for e in val] == [(4, 8), (4, 6), (8, 8), (8, 6)]
    assert [float.fromhex(e.fields["loss"]) for e in val[:2]] == [
        history["eval_val_loss"],
        history["eval_test_loss"],
    ]
    data = load_record(tmp_path / "run")["data"]
    assert data["eval_rows"] == 14 and isinstance(data["eval_rows_sha256"], str)
    assert data["eval_sets"] == ["val", "test"]  # the report names each set's curve


def test_a_token_in_the_trainers_arguments_is_masked_in_the_config(model_dir: Path, tmp_path: Path) -> None:
    """A TRL config's ``model_init_kwargs={"token": ...}`` is a Trainer argument: the record's
    ``config`` (hashed, and sent to MLflow as params) held it in full, though the record's
    ``trainer.args`` masked it; both mask it now."""
    from reprotune._trackers.base import flatten_params
    from reprotune.integrations._sections import run_config

    token = "hf_" + "Ab3dE" * 7
    trainer = tiny_trainer(model_dir, tiny_rows(8, seed=1), tmp_path / "out", list, max_steps=1)
    args = {"learning_rate": 0.01, "model_init_kwargs": {"token": token}}
    config = run_config(trainer, args, "tiny", {})
    assert config["trainer"]["args"]["learning_rate"] == 0.01
    assert token not in json.dumps(config) and token not in json.dumps(flatten_params(config))

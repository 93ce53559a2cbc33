"""The training loop in this process on the tiny model: seeds, precision, epochs, recording, MLflow.

Each run takes well under a second once torch and transformers are imported, so every test makes
the runs it compares. Runs happen inside ``torch.random.fork_rng`` because the loop seeds torch's
global generator for dropout; the conftest fixture restores the determinism flags it sets.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from mlflowstore import seed_mlflow_store
from recording import recorded_steps
from reprotune._config.loading import load_config
from reprotune._data.manifest import load_manifest
from reprotune._data.order import DataOrder
from reprotune._jsonio import sha256_file
from reprotune._run.ledger import batch_sha256
from reprotune._train.loss import logits_to_keep, supports_logits_to_keep, token_loss_sum
from reprotune._train.run import RunOptions, RunResult, resume_run, run_experiment


def _run(
    project: Any, run_dir: Path, *overrides: str, config: Path | None = None, **options: Any
) -> RunResult:
    """Run the tiny project's config (with ``--set``-style overrides) in this process."""
    cfg = load_config(config or project.config("train-base.yaml"), list(overrides))
    options = {"progress": False, "code_dir": project.root, **options}
    with torch.random.fork_rng():
        return run_experiment(cfg, RunOptions(run_dir=run_dir, **options))


def _ledger(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "ledger.jsonl").read_text(encoding="utf-8").splitlines()]


def _train_lines(run_dir: Path) -> list[dict[str, Any]]:
    return [e for e in _ledger(run_dir) if e["kind"] == "train"]


def _init_hash(run_dir: Path) -> str:
    (init,) = [e for e in _ledger(run_dir) if e["kind"] == "init"]
    return str(init["weights_sha256"])


def test_root_seed_changes_weights_from_step_0(tiny_project: Any, tmp_path: Path) -> None:
    """A new root seed gives new LoRA init weights (step 0) and a new data order."""
    base = _run(tiny_project, tmp_path / "base")
    other = _run(tiny_project, tmp_path / "other", "seed.root=2")
    assert base.record["seeds"]["lora_init"] != other.record["seeds"]["lora_init"]
    assert _init_hash(base.run_dir) != _init_hash(other.run_dir)
    assert _train_lines(base.run_dir)[0]["batch_sha256"] != _train_lines(other.run_dir)[0]["batch_sha256"]
    assert base.adapter_sha256 != other.adapter_sha256


def test_lora_init_seed_alone_changes_weights_not_data(tiny_project: Any, tmp_path: Path) -> None:
    """Overriding only the LoRA-init seed changes the step-0 weights and leaves every batch as it was."""
    base = _run(tiny_project, tmp_path / "base")
    other = _run(tiny_project, tmp_path / "other", "seed.overrides.lora_init=12345")
    assert other.record["seeds"]["lora_init"] == 12345
    for consumer in ("split", "data_order", "dropout", "eval"):
        assert other.record["seeds"][consumer] == base.record["seeds"][consumer]
    assert _init_hash(base.run_dir) != _init_hash(other.run_dir)
    base_lines, other_lines = _train_lines(base.run_dir), _train_lines(other.run_dir)
    assert [e["batch_sha256"] for e in base_lines] == [e["batch_sha256"] for e in other_lines]
    assert all(
        a["weights_sha256"] != b["weights_sha256"] for a, b in zip(base_lines, other_lines, strict=True)
    )


def test_data_order_seed_alone_changes_batches_not_init(tiny_project: Any, tmp_path: Path) -> None:
    """Overriding only the data-order seed keeps step 0's weights and changes the batch from step 1."""
    base = _run(tiny_project, tmp_path / "base")
    other = _run(tiny_project, tmp_path / "other", "seed.overrides.data_order=12345")
    assert other.record["seeds"]["lora_init"] == base.record["seeds"]["lora_init"]
    assert other.record["data"]["manifest_sha256"] == base.record["data"]["manifest_sha256"]
    assert _init_hash(base.run_dir) == _init_hash(other.run_dir)
    base_lines, other_lines = _train_lines(base.run_dir), _train_lines(other.run_dir)
    assert base_lines[0]["batch_sha256"] != other_lines[0]["batch_sha256"]
    assert base_lines[0]["weights_sha256"] != other_lines[0]["weights_sha256"]


def test_ledger_batches_follow_the_data_order(tiny_project: Any, tmp_path: Path) -> None:
    """Each step's batch hash is the hash of DataOrder(seed, train rows).step_rows(step)."""
    result = _run(tiny_project, tmp_path / "run")
    manifest = load_manifest(result.run_dir / "split.json")
    order = DataOrder(result.record["seeds"]["data_order"], [int(i) for i in manifest.indices["train"]], 4)
    lines = _train_lines(result.run_dir)
    assert [e["batch_sha256"] for e in lines] == [batch_sha256(order.step_rows(e["step"])) for e in lines]


def test_epochs_run_ceil_of_train_rows_over_batch(tiny_project: Any, tmp_path: Path) -> None:
    """``train.epochs: 1`` with batch 5 over 64 training rows runs ceil(64 / 5) = 13 steps."""
    config = tiny_project.config(
        "train-epochs.yaml",
        train={"epochs": 1, "max_steps": None, "batch_size": 5, "eval_every": 0, "save_every": 0},
    )
    result = _run(tiny_project, tmp_path / "run", config=config)
    assert result.record["data"]["split_sizes"]["train"] == 64
    assert result.status == "completed"
    assert result.steps_done == 13
    assert result.record["data"]["order"]["total_steps"] == 13
    lines = _train_lines(result.run_dir)
    assert [e["step"] for e in lines] == list(range(1, 14))
    assert [e["n_rows"] for e in lines] == [5] * 13
    assert {e["epoch"] for e in lines} == {0}  # step 13 starts at row 60 of epoch 0
    val = [e for e in _ledger(result.run_dir) if e["kind"] == "val"]
    assert [e["step"] for e in val] == [13]  # eval_every 0: only at the end


def _unrecorded(project: Any, run_dir: Path, records_step: Any = lambda _step: False) -> RunResult:
    with recorded_steps(records_step):
        return _run(project, run_dir)


def test_recording_off_trains_the_same_numbers(tiny_project: Any, tmp_path: Path) -> None:
    """``recorded_steps`` off (the benchmark's baseline) skips per-step lines but trains identically;
    the hooks are themselves again after the block."""
    on = _run(tiny_project, tmp_path / "on")
    off = _unrecorded(tiny_project, tmp_path / "off")
    assert off.status == "completed"
    assert off.adapter_sha256 == on.adapter_sha256
    assert [e["kind"] for e in _ledger(off.run_dir)] == ["init", "val", "val"]
    assert off.record["timings"]["step_time_s_mean"] > 0
    again = _run(tiny_project, tmp_path / "again")
    assert _ledger(again.run_dir) == _ledger(on.run_dir)


def test_recording_predicate_records_only_the_steps_it_picks(tiny_project: Any, tmp_path: Path) -> None:
    """The benchmark's alternating mode: picked steps get their exact lines, training is unchanged."""
    full = _run(tiny_project, tmp_path / "full")
    picked = _unrecorded(tiny_project, tmp_path / "picked", lambda step: step % 3 == 0)
    assert picked.adapter_sha256 == full.adapter_sha256
    full_lines = {e["step"]: e for e in _train_lines(full.run_dir)}
    picked_lines = _train_lines(picked.run_dir)
    assert [e["step"] for e in picked_lines] == [s for s in sorted(full_lines) if s % 3 == 0]
    assert all(e == full_lines[e["step"]] for e in picked_lines)


def test_record_times_the_recording_work(tiny_project: Any, tmp_path: Path) -> None:
    """The record says what recording cost; the result carries every step's time."""
    on = _run(tiny_project, tmp_path / "on")
    off = _unrecorded(tiny_project, tmp_path / "off")
    steps = on.record["timings"]["steps_done"]
    assert len(on.step_times_s) == steps and all(t > 0 for t in on.step_times_s)
    assert 0 < on.record["timings"]["recording_time_s"] < sum(on.step_times_s)
    # Both figures are rounded to 6 decimals: the time to the microsecond, so compare within that.
    total = sum(on.step_times_s)
    share = on.record["timings"]["recording_time_s"] / total
    assert on.record["timings"]["recording_share"] == pytest.approx(share, abs=1e-6 + 0.5e-6 / total)
    assert off.record["timings"]["recording_time_s"] == 0


def test_bf16_on_cpu_completes_and_is_reproducible(tiny_project: Any, tmp_path: Path) -> None:
    """bf16 autocast on CPU completes, twin runs are bitwise identical, and it differs from fp32."""
    first = _run(tiny_project, tmp_path / "a", "train.precision=bf16")
    second = _run(tiny_project, tmp_path / "b", "train.precision=bf16")
    fp32 = _run(tiny_project, tmp_path / "fp32")
    assert first.status == second.status == "completed"
    assert first.record["config"]["train"]["precision"] == "bf16"
    assert (first.run_dir / "ledger.jsonl").read_bytes() == (second.run_dir / "ledger.jsonl").read_bytes()
    assert first.adapter_sha256 == second.adapter_sha256
    assert first.final_val_loss is not None and math.isfinite(first.final_val_loss)
    # Autocast really ran in bf16: the losses are not the fp32 losses.
    assert [e["loss"] for e in _train_lines(first.run_dir)] != [e["loss"] for e in _train_lines(fp32.run_dir)]


def _git_repo(path: Path) -> str:
    """A one-commit git repository at ``path``; returns the commit."""
    path.mkdir()
    (path / "train.py").write_text("print('code under test')\n", encoding="utf-8")
    git = ["git", "-C", str(path), "-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "code"], check=True)
    done = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return done.stdout.strip()


@pytest.fixture
def mlflow_uri() -> Any:
    """Set MLflow's tracking URI explicitly for the test, and unset it afterwards."""
    import mlflow

    def use(uri: str) -> None:
        mlflow.set_tracking_uri(uri)

    yield use
    mlflow.set_tracking_uri(None)  # type: ignore[arg-type]


def test_a_resumed_run_continues_its_mlflow_run(tiny_project: Any, tmp_path: Path, mlflow_uri: Any) -> None:
    """Stopped after step 6 (the checkpoint at 4), then resumed: one MLflow run, FINISHED, each step
    of the ledger logged once, named by the record (before, two runs of one name, steps 5-6 in
    both, and the record named the second only)."""
    from mlflow.tracking import MlflowClient

    from reprotune._train.run import resume_run

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    tracking = {
        "mlflow": True,
        "uri": uri,
        "artifact_location": str(tmp_path / "art"),
        "experiment": "resumed",
    }
    config = tiny_project.config("train-resumed.yaml", tracking=tracking)
    stopped = _run(tiny_project, tmp_path / "run", config=config, stop_after_step=6)
    first = stopped.record["trackers"]["mlflow"]["mlflow_run_id"]
    with torch.random.fork_rng():
        result = resume_run(
            tmp_path / "run", RunOptions(run_dir=tmp_path / "run", progress=False, code_dir=tiny_project.root)
        )
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("resumed").experiment_id])
    assert run.info.run_id == first == result.record["trackers"]["mlflow"]["mlflow_run_id"]
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(first, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [
        (e["step"], float.fromhex(e["loss"])) for e in _train_lines(tmp_path / "run")
    ]


def test_mlflow_mirrors_params_tags_metrics_and_artifacts(
    tiny_project: Any, tmp_path: Path, mlflow_uri: Any
) -> None:
    """mlflow.search_runs on the SQLite store finds the run: params, tags, metric history, artifacts."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = seed_mlflow_store(tmp_path / "mlflow.db")
    config = tiny_project.config(
        "train-mlflow.yaml",
        tracking={
            "mlflow": True,
            "uri": uri,
            "artifact_location": str(tmp_path / "mlartifacts"),
            "experiment": "reprotune-test",
        },
    )
    commit = _git_repo(tmp_path / "code")
    result = _run(tiny_project, tmp_path / "run", config=config, code_dir=tmp_path / "code")
    record = result.record
    assert record["trackers"]["mlflow"]["ok"] is True

    mlflow_uri(uri)
    runs = mlflow.search_runs(experiment_names=["reprotune-test"], output_format="list")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_id == record["trackers"]["mlflow"]["mlflow_run_id"]
    assert run.info.status == "FINISHED"

    params = run.data.params
    assert params["train.learning_rate"] == "0.01"
    assert params["lora.r"] == "4"
    assert params["seed.root"] == "1"
    assert params["model.name"] == record["config"]["model"]["name"]

    tags = run.data.tags
    assert tags["git.commit"] == commit
    assert tags["git.dirty"] == "False"
    assert tags["data.sha256"] == record["data"]["file_sha256"]
    assert (
        tags["data.manifest_sha256"]
        == record["data"]["manifest_sha256"]
        == sha256_file(tmp_path / "run/split.json")
    )
    assert tags["model.source"] == record["model"]["source"]
    assert tags["model.weights_sha256"] == record["model"]["weights_sha256"]
    assert tags["reprotune.version"] == record["reprotune_version"]
    assert tags["reprotune.run_dir"] == str((tmp_path / "run").resolve())

    client = MlflowClient(tracking_uri=uri)
    lines = _train_lines(result.run_dir)
    history = sorted(client.get_metric_history(run.info.run_id, "train_loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in history] == [(e["step"], float.fromhex(e["loss"])) for e in lines]
    grad = sorted(client.get_metric_history(run.info.run_id, "grad_norm"), key=lambda m: m.step)
    assert [m.value for m in grad] == [float.fromhex(e["grad_norm"]) for e in lines]
    assert len(client.get_metric_history(run.info.run_id, "lr")) == 8
    val_lines = [e for e in _ledger(result.run_dir) if e["kind"] == "val"]
    val = sorted(client.get_metric_history(run.info.run_id, "val_loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in val] == [(e["step"], float.fromhex(e["loss"])) for e in val_lines]
    assert [m.step for m in val] == [4, 8]
    assert record["trackers"]["mlflow"]["metrics_logged"] == 8 * 3 + 2
    # The typed record reads back what reprotune itself reads: the tracker's run, the last
    # validation loss (the ledger's last val line, bit for bit) and the data order's length.
    typed = result.typed
    assert typed is not None and typed.trackers is not None and typed.outputs is not None
    assert typed.trackers["mlflow"].mlflow_run_id == run.info.run_id
    assert typed.trackers["mlflow"].tracking_uri == uri
    assert typed.trackers["mlflow"].experiment == "reprotune-test"
    assert typed.outputs.final_val_loss == val_lines[-1]["loss"]
    assert typed.data is not None and typed.data.order is not None
    assert typed.data.order.total_steps == 8 == typed.timings.steps_done

    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"record.json", "ledger", "adapter", "split", "config"} <= top
    adapter = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "adapter")}
    assert "adapter_model.safetensors" in adapter
    stored = tmp_path / "mlartifacts"
    adapters = list(stored.rglob("adapter_model.safetensors"))
    assert len(adapters) == 1
    assert sha256_file(adapters[0]) == result.adapter_sha256


def test_logits_to_keep_starts_at_the_first_scored_position() -> None:
    """Logits are kept from the first position whose next token any row scores; at least one."""
    labels = torch.tensor([[-100, -100, -100, 5, 6, -100], [-100, -100, 7, 8, -100, -100]])
    assert logits_to_keep(labels) == 6 - 1  # row 1 scores token 2, predicted at position 1
    assert logits_to_keep(torch.full((2, 4), -100)) == 1
    assert logits_to_keep(torch.tensor([[1, 2, 3]])) == 3


@pytest.mark.parametrize("side", ["right", "left"])
def test_loss_from_kept_logits_matches_every_logit(tmp_path: Path, side: str) -> None:
    """Skipping the prompt's logits changes the loss and its gradients only by float rounding."""
    from transformers import AutoModelForCausalLM

    from reprotune._train.batches import collate
    from reprotune.testing import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m", seed=0))
    assert supports_logits_to_keep(model)
    examples = [
        (list(range(3, 15)), [-100] * 9 + [11, 12, 13, 14][1:]),
        (list(range(20, 27)), [-100] * 4 + [24, 25, 26]),
    ]
    batch = collate(examples, pad_token_id=0, padding_side=side)
    keep = logits_to_keep(batch["labels"])
    assert keep < batch["labels"].shape[1]  # the test skips something
    losses, grads = [], []
    for k in (None, keep):
        model.zero_grad(set_to_none=True)
        loss = token_loss_sum(model, batch, keep=k)
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.lm_head.weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_a_plain_run_never_enters_the_distributed_modules(tiny_project: Any, tmp_path: Path) -> None:
    """The seam (``_train.strategy``): a plain run, with validation and a checkpoint, and a plain
    resume call no function of the distributed modules; its setup's distribution is ``LOCAL``."""
    from reprotune._train.strategy import LOCAL

    distributed = ("distributed.py", "dist_step.py", "dist_checkpoint.py", "dist_run.py", "dist_strategy.py")
    distributed += ("dist_record.py",)
    distributed += ("sharding.py",)
    entered: set[str] = set()
    seen: list[Any] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if "/reprotune/_train/" in path and path.endswith(distributed):
                entered.add(f"{path.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    class Seen:
        def on_step_end(self, end: Any) -> None:
            seen.append(end.rank_rows)

    import sys

    sys.setprofile(profile)
    try:
        result = _run(tiny_project, tmp_path / "plain", "train.save_every=2", hooks=[Seen()])
        _run(tiny_project, tmp_path / "stopped", "train.save_every=2", stop_after_step=2)
        with torch.random.fork_rng():
            resumed = resume_run(tmp_path / "stopped", RunOptions(progress=False, code_dir=tiny_project.root))
    finally:
        sys.setprofile(None)
    assert result.status == "completed" and (tmp_path / "plain" / "checkpoints").is_dir()
    assert resumed.status == "completed"  # a plain resume too
    assert entered == set()
    assert seen and all(rows is None for rows in seen)
    from reprotune._train.setup import Setup

    assert Setup.__dataclass_fields__["distribution"].default is LOCAL


_PLAIN_RUN_AND_RESUME = """
import json, sys
from pathlib import Path
from reprotune._config.loading import load_config
from reprotune._train.run import RunOptions, resume_run, run_experiment

config, run_dir, root = sys.argv[1], Path(sys.argv[2]) / "run", Path(sys.argv[3])
options = {"progress": False, "code_dir": root}
cfg = load_config(config, ["train.save_every=2"])
stopped = run_experiment(cfg, RunOptions(run_dir=run_dir, stop_after_step=2, **options))
resumed = resume_run(run_dir, RunOptions(**options))
loaded = sorted(name for name in sys.modules if name.startswith("reprotune._train."))
print(json.dumps({"statuses": [stopped.status, resumed.status], "loaded": loaded}))
"""


def test_a_plain_run_never_loads_the_distributed_modules(tiny_project: Any, tmp_path: Path) -> None:
    """In a fresh interpreter (this one loaded them for other tests), a plain run stopped at a
    checkpoint and its resume load no distributed module: they are imported only under torchrun."""
    import sys

    config = tiny_project.config("train-base.yaml")
    done = subprocess.run(
        [sys.executable, "-c", _PLAIN_RUN_AND_RESUME, *map(str, (config, tmp_path, tiny_project.root))],
        cwd=tiny_project.root,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["statuses"] == ["stopped", "completed"]
    modules = {name.rsplit(".", 1)[-1] for name in result["loaded"]}
    assert {"run", "attempt", "loop", "step", "strategy"} <= modules  # the plain path, as a control
    distributed = {"distributed", "dist_step", "dist_checkpoint", "dist_run", "dist_strategy", "dist_record"}
    assert modules & (distributed | {"sharding"}) == set()


def test_a_setup_cannot_say_two_things_about_its_ranks(tiny_project: Any, tmp_path: Path) -> None:
    """``Setup.dist`` (a rank's context) and ``Setup.distribution`` (the seam) go together: a setup
    built with one but not the other is refused, so no code path can read a plain run from one and a
    distributed one from the other."""
    import dataclasses

    from reprotune._train.dist_strategy import Distributed
    from reprotune._train.setup import build_setup

    cfg = load_config(tiny_project.config("train-base.yaml"))
    with torch.random.fork_rng():
        setup = build_setup(cfg, manifest_out=tmp_path / "split.json")
    assert setup.dist is None
    with pytest.raises(ValueError, match="dist and distribution disagree"):
        dataclasses.replace(setup, dist=object())
    with pytest.raises(ValueError, match="dist and distribution disagree"):
        dataclasses.replace(setup, distribution=Distributed.__new__(Distributed))
    # A plain run's restore never changes the world size (check_resume_world refuses a plain
    # resume of a torchrun run before it gets here); handed one, it says so instead of ignoring it.
    from reprotune._config.schema import ExperimentConfig
    from reprotune._run.layout import RunLayout
    from reprotune._run.live_record import LiveRecord
    from reprotune._train.strategy import LOCAL, Resume

    record = LiveRecord.start("20261202-000000-abcdef12", ExperimentConfig(), {"root": 0})
    record.begin_attempt(resumed=True)
    resume = Resume(record, RunLayout(tmp_path / "run"), True, {"from": 2, "to": 1}, print)
    with pytest.raises(ValueError, match="cannot change its world size"):
        LOCAL.restore(setup, resume)
    assert LOCAL.restore(setup, dataclasses.replace(resume, change=None)) == 0  # no checkpoint: step 0

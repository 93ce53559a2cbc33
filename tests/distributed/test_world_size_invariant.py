"""``train.world_size_invariant`` under real ``torchrun`` launches (CPU, gloo) of the tiny model:
world sizes 1, 2 and 4 give the same bits for DDP and for FSDP2; a run stopped at one world size
and resumed at another equals the uninterrupted run; with the mode off, world sizes 1 and 2 differ,
so the mode is what makes them equal.

The config: 8 optimizer steps of 4 global micro-batches of 2 rows, LoRA dropout 0.1 (the tiny
project's), a checkpoint every 4 steps, validation at 4 and 8. A launch takes about 7-15 s here;
the launches are module fixtures shared by the tests (12 in all).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Verdict
from reprotune._run.ledger import read_ledger
from reprotune._run.record import load_record
from tinyrun import TinyProject
from torchruns import QUIET, TRAIN, completed, launch

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

WORLD_SIZES = (1, 2, 4)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    tiny = TinyProject.create(tmp_path_factory.mktemp("invariant-project"))
    determinism = {"mode": "strict", "threads": 1, "device": "cpu"}
    for strategy in ("ddp", "fsdp"):
        for invariant in (True, False):
            tiny.config(
                f"{strategy}-{'on' if invariant else 'off'}.yaml",
                train={**TRAIN, "world_size_invariant": invariant},
                determinism=determinism,
                distributed={"strategy": strategy, "timeout_s": 120},
            )
    return tiny


def _run(project: TinyProject, config: str, nproc: int, name: str, *extra: str) -> Path:
    return completed(
        launch(project, nproc, "run", config, "--run-dir", f"runs/{name}", *extra, *QUIET)
    ).run_dir


@pytest.fixture(scope="module")
def invariant_runs(project: TinyProject) -> dict[tuple[str, int], Path]:
    """(strategy, world size) -> the run directory of the config in the mode at that world size."""
    return {
        (strategy, n): _run(project, f"{strategy}-on.yaml", n, f"{strategy}-on-w{n}")
        for strategy in ("ddp", "fsdp")
        for n in WORLD_SIZES
    }


def _numbers(run_dir: Path) -> list[tuple[object, ...]]:
    """Every train line's step, global batch hash, loss bits, weights hash and grad norm bits."""
    return [
        (
            e.step,
            e.fields["batch_sha256"],
            e.fields["loss"],
            e.fields["weights_sha256"],
            e.fields["grad_norm"],
        )
        for e in read_ledger(run_dir / "ledger.jsonl").train
    ]


def _val_losses(run_dir: Path) -> list[object]:
    return [e.fields["loss"] for e in read_ledger(run_dir / "ledger.jsonl").val]


def _adapter(run_dir: Path) -> bytes:
    return (run_dir / "adapter" / "adapter_model.safetensors").read_bytes()


def _assert_same_bits(a: Path, b: Path) -> None:
    assert _numbers(a) == _numbers(b)
    assert _val_losses(a) == _val_losses(b)
    assert _adapter(a) == _adapter(b)
    comparison = compare_runs(a, b)  # no tolerance
    assert comparison.verdict is Verdict.IDENTICAL, comparison.causes


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_world_sizes_1_2_and_4_give_the_same_bits(
    strategy: str, invariant_runs: dict[tuple[str, int], Path]
) -> None:
    """Every loss, weights hash, grad norm and validation loss, and the adapter's bytes, the same
    at world sizes 1, 2 and 4; compare says IDENTICAL without a tolerance; each record says the
    mode was in force and how the gradients were summed."""
    base = invariant_runs[(strategy, 1)]
    assert len(_numbers(base)) == 8
    for n in WORLD_SIZES[1:]:
        _assert_same_bits(base, invariant_runs[(strategy, n)])
    for n in WORLD_SIZES:
        record = load_record(invariant_runs[(strategy, n)])
        assert record["config"]["train"]["world_size_invariant"] is True
        section = record["distributed"]
        assert (section["world_size"], section["strategy"], section["world_size_invariant"]) == (
            n,
            strategy,
            True,
        )
        assert section["reductions"]["gradients"].startswith("world-size invariant: ")


def test_without_the_mode_world_sizes_1_and_2_differ(
    project: TinyProject, invariant_runs: dict[tuple[str, int], Path]
) -> None:
    """The same config with the mode off: world sizes 1 and 2 take the same rows and part in the
    numbers (the backend adds the ranks' partial sums in another order), so it is the mode that
    makes the runs above equal. The mode changes nothing at step 1 (one micro-batch order only
    matters once gradients are added), and its world size 1 is the same bits as the mode's."""
    off = {n: _run(project, "ddp-off.yaml", n, f"ddp-off-w{n}") for n in (1, 2)}
    comparison = compare_runs(off[1], off[2])
    assert comparison.verdict is Verdict.DIVERGED
    assert comparison.where.first_batch_step is None
    assert comparison.where.first_weights_step is not None
    assert _numbers(off[1]) != _numbers(off[2])
    # At world size 1 both modes add the micro-batches' gradients in the same order.
    assert _numbers(off[1]) == _numbers(invariant_runs[("ddp", 1)])


def test_a_run_resumed_at_another_world_size_equals_the_uninterrupted_run(
    project: TinyProject, invariant_runs: dict[tuple[str, int], Path]
) -> None:
    """DDP stopped after its step-4 checkpoint at world size 2 and resumed at 1, and FSDP2 stopped
    at 1 and resumed at 2, each without --allow-world-size-change: IDENTICAL to the uninterrupted
    runs (ledger numbers, validation, adapter bytes); the record notes the change."""
    for strategy, first, then in (("ddp", 2, 1), ("fsdp", 1, 2)):
        name = f"{strategy}-on-{first}-then-{then}"
        run_dir = _run(project, f"{strategy}-on.yaml", first, name, "--stop-after-step", "4")
        completed(launch(project, then, "resume", str(run_dir), *QUIET))
        _assert_same_bits(invariant_runs[(strategy, 1)], run_dir)
        record = load_record(run_dir)
        change = record["distributed"]["world_size_changes"]
        assert [{k: c[k] for k in ("from", "to", "at_step")} for c in change] == [
            {"from": first, "to": then, "at_step": 4}
        ]
        # every rank's RNG state restored only where the checkpoint had one for each (1 -> 2: rank 1
        # had none and was seeded as at a run's start)
        assert record["attempts"][-1]["rng_restored"] is (then <= first)

"""Where a distributed step's rows go, the seeds of its micro-batches, and what must agree between
ranks: pure functions, checked without launching anything."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._config.loading import config_from_dict
from reprotune._determinism.rng import capture_rng_state, ranks_rng_from_tensors, ranks_rng_to_tensors
from reprotune._errors import ConfigError, InputError
from reprotune._jsonio import sha256_file, write_json_atomic
from reprotune._run.checkpoint_files import (
    DATA_FILES,
    STATE_FILE,
    _state_sha256,
    checkpoint_dir,
    verify_checkpoint,
)
from reprotune._run.ranks import (
    check_ranks_agree,
    check_resume_world,
    rank_environment_drift,
    ranks_section,
    resume_world_change,
)
from reprotune._run.record import RunRecord, typed_record
from reprotune._run.record_sections import DistributedRecord
from reprotune._train.distributed import (
    check_placement,
    micro_batch_seed,
    rank_micro_batches,
    rank_seed,
    shard_rows,
)


def test_every_micro_batch_goes_to_exactly_one_rank_in_blocks() -> None:
    """Rank r of W trains the contiguous block r*K/W ... (r+1)*K/W-1 of the K micro-batches."""
    assert [list(rank_micro_batches(8, r, 2)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(rank_micro_batches(8, r, 4)) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [list(rank_micro_batches(3, 0, 1))] == [[0, 1, 2]]


@pytest.mark.parametrize("world", [1, 2, 4], ids=lambda w: f"W{w}")
def test_shards_are_the_global_batch_in_order(world: int) -> None:
    """The ranks' rows, concatenated in rank order, are the step's rows: the same global batch at
    every world size."""
    rows = [17, 3, 99, 42, 8, 15, 23, 4]
    shards = shard_rows(rows, batch_size=2, world_size=world)
    assert len(shards) == world
    assert [row for shard in shards for row in shard] == rows


def test_a_world_size_that_does_not_divide_the_micro_batches_is_refused() -> None:
    """grad_accum_steps 3 at world size 2: refused, naming the key, both numbers and a fix that
    keeps the step's rows where it can."""
    check_placement(4, 2, batch_size=4)
    with pytest.raises(InputError) as caught:
        check_placement(3, 2, batch_size=4)
    assert caught.value.source == "train.grad_accum_steps"
    assert "3 is not a multiple of the world size 2" in caught.value.message
    # the fix keeps the step's 12 rows (it once offered grad_accum_steps=2 alone: 8 rows)
    assert caught.value.fix == (
        "keep the step's 12 rows in 2 micro-batches: --set train.grad_accum_steps=2 --set train.batch_size=6"
    )
    with pytest.raises(InputError) as caught:  # 3 rows cannot be split in 2: the rows must change
        check_placement(3, 2, batch_size=1)
    assert "train.grad_accum_steps=2), which changes the step's rows" in str(caught.value.fix)


def test_micro_batch_seeds_are_pinned_and_independent_of_the_rank() -> None:
    """The derivation is fixed (records depend on it): a golden value, and distinct per step,
    micro-batch and rank."""
    # sha256("reprotune/dist-seed/v1/7/1/0"), first 8 bytes big-endian, masked to 63 bits
    assert micro_batch_seed(7, 1, 0) == 8333060702230245445
    seeds = {micro_batch_seed(7, s, k) for s in range(1, 5) for k in range(4)}
    assert len(seeds) == 16
    assert rank_seed(7, 0) == 2469786723908518921  # sha256("reprotune/dist-seed/v1/7/rank/0")
    assert rank_seed(7, 0) != rank_seed(7, 1)
    assert all(0 <= s < 2**63 for s in seeds)


def test_every_ranks_rng_state_round_trips_without_pickle() -> None:
    """Two ranks' captured states, saved as tensors and JSON, come back equal, each to its rank."""
    torch.manual_seed(1)
    first = capture_rng_state()
    torch.manual_seed(2)
    second = capture_rng_state()
    tensors, meta = ranks_rng_to_tensors([first, second])
    back = ranks_rng_from_tensors(tensors, meta)
    assert len(back) == 2
    for got, want in zip(back, (first, second), strict=True):
        assert torch.equal(got["torch"], want["torch"])
        assert got["python"] == want["python"]
    assert not torch.equal(back[0]["torch"], back[1]["torch"])


def test_the_distributed_config_section_has_defaults_and_checks() -> None:
    """strategy ddp, backend auto, timeout 1800 s by default; a bad value names its key."""
    cfg = config_from_dict({})
    assert cfg.distributed.strategy == "ddp"
    assert cfg.distributed.backend == "auto"
    assert cfg.distributed.timeout_s == 1800.0
    assert cfg.resolved()["distributed"] == {"strategy": "ddp", "backend": "auto", "timeout_s": 1800.0}
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"distributed": {"strategy": "zero3", "timeout_s": 0}})
    text = str(caught.value)
    assert "distributed.strategy" in text and "distributed.timeout_s" in text


# --- what ranks must agree on ------------------------------------------------------------------


def _identity(rank: int, host: str = "node-a") -> dict[str, Any]:
    return {
        "rank": rank,
        "local_rank": rank,
        "host": host,
        "device": "cpu",
        "device_name": "CPU",
        "environment": {
            "python": {"version": "3.11.9"},
            "distributions": {"torch": "2.13.0", "numpy": "2.4.6", "peft": "0.21.2"},
        },
        "inputs": {"model_weights_sha256": "a" * 64, "data_sha256": "b" * 64, "lora_init_sha256": "c" * 64},
    }


def test_ranks_with_the_same_packages_and_inputs_agree() -> None:
    """Equal reports pass, and the record's entries say the environments do not differ."""
    identities = [_identity(0), _identity(1)]
    check_ranks_agree(identities)
    section = ranks_section(identities)
    assert [entry["rank"] for entry in section] == [0, 1]
    assert section[0]["environment_sha256"] == section[1]["environment_sha256"]
    assert section[1]["environment_differs"] == []


def test_ranks_with_other_packages_are_refused_by_name() -> None:
    """A rank with another torch and without peft: refused, naming the rank, its host, each package
    and both versions, before anything trains."""
    other = _identity(1, host="node-b")
    other["environment"]["distributions"]["torch"] = "2.12.0"
    del other["environment"]["distributions"]["peft"]
    with pytest.raises(InputError) as caught:
        check_ranks_agree([_identity(0), other])
    message = caught.value.message
    assert "rank 1 (host node-b)" in message
    assert "torch 2.12.0 (rank 0: 2.13.0)" in message
    assert "peft not installed (rank 0: 0.21.2)" in message
    assert "pip freeze" in str(caught.value.fix)
    section = ranks_section([_identity(0), other])
    assert any("distributions.torch" in line for line in section[1]["environment_differs"])


def test_ranks_that_loaded_other_inputs_are_refused() -> None:
    """Another LoRA init (or model, data) on one rank: refused, naming what differs."""
    other = copy.deepcopy(_identity(1))
    other["inputs"]["lora_init_sha256"] = "d" * 64
    with pytest.raises(InputError, match=r"rank 1 \(host node-a\) loaded other LoRA init than rank 0"):
        check_ranks_agree([_identity(0), other])


@pytest.mark.parametrize(
    ("recorded", "now", "allow", "expected"),
    [
        (None, None, False, None),
        ({"world_size": 2}, 2, False, None),
        ({"world_size": 2}, 1, True, {"from": 2, "to": 1}),
        ({"world_size": 2, "world_size_changes": [{"from": 2, "to": 1, "at_step": 3}]}, 1, False, None),
    ],
    ids=["plain", "same-world", "allowed-change", "after-a-recorded-change"],
)
def test_resume_world_sizes_that_may_go_on(
    recorded: dict[str, Any] | None, now: int | None, allow: bool, expected: dict[str, int] | None
) -> None:
    """The same world size goes on; an allowed change is returned to be recorded; the world size
    a run trains at after a recorded change is the changed one."""
    section = _section(recorded)
    assert check_resume_world(section, now, allow_change=allow, run_dir="runs/A") == expected


def _section(recorded: dict[str, Any] | None) -> DistributedRecord | None:
    """A record's ``distributed`` section as a record read from disk holds it (typed)."""
    return DistributedRecord.model_validate(recorded) if recorded is not None else None


@pytest.mark.parametrize(
    ("recorded", "now", "words"),
    [
        ({"world_size": 2}, 1, "--allow-world-size-change"),
        ({"world_size": 2}, None, "torchrun --nproc_per_node 2 -m reprotune resume runs/A"),
        (None, 2, "reprotune resume runs/A"),
        # on 2 nodes: each runs its share (before: --nproc_per_node 8, the whole world on one node)
        (
            {"world_size": 8, "nodes": 2},
            None,
            "torchrun --nnodes 2 --nproc_per_node 4 -m reprotune resume runs/A",
        ),
    ],
    ids=["other-world", "torchrun-run-resumed-plainly", "plain-run-resumed-under-torchrun", "two-nodes"],
)
def test_resume_world_sizes_that_are_refused(
    recorded: dict[str, Any] | None, now: int | None, words: str
) -> None:
    """Another world size without the flag, and a change of launcher even with it: refused with
    the command that resumes the run as it ran."""
    with pytest.raises(InputError) as caught:
        check_resume_world(_section(recorded), now, allow_change=False, run_dir="runs/A")
    assert words in str(caught.value)
    if recorded is None or now is None:
        with pytest.raises(InputError):
            check_resume_world(_section(recorded), now, allow_change=True, run_dir="runs/A")


def test_an_unfinished_torchrun_run_is_told_to_resume_under_torchrun(tmp_path: Path) -> None:
    """``run`` into a directory holding an interrupted torchrun run: the fix is the torchrun
    resume at its world size (a plain ``reprotune resume`` would be refused); a one-process run's
    fix stays the plain resume."""
    from reprotune._run.claim import check_run_dir_free
    from reprotune._run.record import write_record

    base = {"run_id": "x", "status": "interrupted", "config": {}, "config_sha256": "0" * 64, "seeds": {}}
    base["timings"] = {"started_at": "2026-12-03T00:00:00Z"}
    for name, extra, words in (
        ("dist", {"distributed": {"world_size": 2}}, "`torchrun --nproc_per_node 2 -m reprotune resume "),
        ("plain", {}, "continue it with `reprotune resume "),
    ):
        (tmp_path / name).mkdir()
        write_record(tmp_path / name / "record.json", {**base, **extra})
        with pytest.raises(InputError) as refused:
            check_run_dir_free(tmp_path / name)
        assert words + f"{tmp_path / name}`" in str(refused.value)


# --- a resume's world size, against its checkpoint's -----------------------------------------------


def _checkpoint(run_dir: Path, step: int, world_size: int) -> None:
    """A checkpoint of ``step`` that verifies, saved at ``world_size`` (its files' bytes stand in
    for the states: the check reads ``state.json`` alone)."""
    path = checkpoint_dir(run_dir / "checkpoints", step)
    path.mkdir(parents=True)
    for name in DATA_FILES:
        (path / name).write_bytes(name.encode())
    state: dict[str, Any] = {
        "schema": "reprotune/checkpoint",
        "schema_version": 2,
        "step": step,
        "epoch": 0,
        "position": [0, 8 * step],
        "files": {name: sha256_file(path / name) for name in DATA_FILES},
        "distributed": {"world_size": world_size, "backend": "gloo", "strategy": "ddp"},
    }
    state["state_sha256"] = _state_sha256(state)
    write_json_atomic(path / STATE_FILE, state)
    assert verify_checkpoint(path) is None


def _record(distributed: dict[str, Any]) -> RunRecord:
    """A stopped run's record (4 micro-batches a step) with this ``distributed`` section."""
    config = {"train": {"grad_accum_steps": 4}}
    base = {"run_id": "r", "status": "stopped", "config": config, "config_sha256": "0" * 64, "seeds": {}}
    return typed_record(
        {**base, "timings": {"started_at": "2026-12-06T00:00:00Z"}, "distributed": distributed}
    )


#: Started at world size 2, resumed at 1 from step 4 by an attempt that saved no checkpoint.
_CHANGED = {"world_size": 2, "world_size_changes": [{"from": 2, "to": 1, "at_step": 4, "attempt": 2}]}


@pytest.mark.parametrize(
    ("checkpoint", "now", "allow", "expected"),
    [
        (2, 2, False, None),
        (2, 1, True, {"from": 2, "to": 1}),
        (2, 2, True, {"from": 2, "to": 2}),
        (None, 2, False, None),
    ],
    ids=["back-at-the-checkpoints", "allowed-change", "allowed-none-needed", "no-checkpoint-starts-over"],
)
def test_a_resume_is_checked_against_the_world_size_its_checkpoint_was_saved_at(
    tmp_path: Path, checkpoint: int | None, now: int, allow: bool, expected: dict[str, int] | None
) -> None:
    """The step-4 checkpoint was saved at 2: a resume at 2 changes nothing, whatever the attempt
    that trained at 1 and left no checkpoint recorded (before: refused, "trains at world size 1");
    allowed, the change returned is measured from the checkpoint's world size; with no checkpoint
    left the run starts over, at the world size it started at."""
    if checkpoint is not None:
        _checkpoint(tmp_path, 4, checkpoint)
    assert resume_world_change(_record(_CHANGED), now, allow_change=allow, run_dir=tmp_path) == expected


def test_a_resume_at_another_world_size_than_its_checkpoints_is_refused_naming_the_checkpoint(
    tmp_path: Path,
) -> None:
    _checkpoint(tmp_path, 4, 2)
    _checkpoint(tmp_path, 8, 1)  # saved by the attempt at world size 1
    with pytest.raises(InputError) as refused:
        resume_world_change(_record(_CHANGED), 2, allow_change=False, run_dir=tmp_path)
    assert str(refused.value) == (
        f"{tmp_path}/checkpoints/step-00000008/state.json (key distributed.world_size): the run in "
        f"{tmp_path} resumes from its checkpoint step-00000008, saved at world size 1; this resume runs "
        "at world size 2, which sums the gradients in another order, so the result would not be bitwise "
        "what an uninterrupted run gives\n"
        "fix: launch 1 processes in all (torchrun --nproc_per_node / --nnodes), or pass "
        "--allow-world-size-change to go on anyway (the change is recorded and compare names it)"
    )


@pytest.mark.parametrize("allow", [False, True], ids=["plain", "allowed"])
def test_a_resume_at_a_world_size_that_does_not_divide_the_micro_batches_names_those_that_do(
    tmp_path: Path, allow: bool
) -> None:
    """A resume keeps the run's config: the fix is a world size, not a --set (which resume lacks);
    and those world sizes only once another is allowed (before, a plain resume at 3 was told 1, 2
    or 4, and at 4 then refused: launch 2 processes)."""
    _checkpoint(tmp_path, 4, 2)
    with pytest.raises(InputError) as refused:
        resume_world_change(_record({"world_size": 2}), 3, allow_change=allow, run_dir=tmp_path)
    said = str(refused.value)
    if allow:
        assert said == (
            f"{tmp_path}/record.json (key config.train.grad_accum_steps): train.grad_accum_steps 4 is not a "
            "multiple of the world size 3: each rank must train the same number of the step's micro-batches\n"
            "fix: resume at a world size that divides 4: 1, 2 or 4 (a resume keeps the run's config)"
        )
    else:
        assert "fix: launch 2 processes in all" in said and "divides 4" not in said


def test_each_ranks_environment_is_compared_with_its_own_at_the_start() -> None:
    """Rank 1 differed from rank 0 at the start and still does: nothing to say. Rank 2 moved to
    ATen's kernels without vector instructions: said, with its value then and now. A rank the run
    did not have (3) has nothing to compare to; rank 0's move is the attempt's environment_drift."""
    start = {"python": {"version": "3.11.9"}, "kernels": {"cpu": {"aten_capability": "AVX512"}}}
    avx2 = copy.deepcopy(start)
    avx2["kernels"]["cpu"]["aten_capability"] = "AVX2"
    plain = copy.deepcopy(start)
    plain["kernels"]["cpu"]["aten_capability"] = "DEFAULT"
    recorded = ranks_section([{"rank": r, "environment": e} for r, e in enumerate((start, avx2, start))])
    now = [{"rank": r, "environment": e} for r, e in enumerate((avx2, avx2, plain, plain))]
    assert rank_environment_drift(recorded, start, now) == [
        "distributed.ranks[2].environment.kernels.cpu.aten_capability: recorded 'AVX512', now 'DEFAULT'"
    ]
    now[1] = {"rank": 1, "environment": start}  # rank 1 back on rank 0's kernels
    assert rank_environment_drift(recorded, start, now)[0] == (
        "distributed.ranks[1].environment.kernels.cpu.aten_capability: recorded 'AVX2', now 'AVX512'"
    )


def test_a_section_a_rank_lost_since_the_start_is_said_too() -> None:
    """A whole section of rank 1's environment gone (its kernel facts) and a thread count moved:
    both said (the section went unsaid: it has no leaf on one side to compare)."""
    from reprotune._jsonio import canonical_sha256

    start = {"threads": {"torch": 4}, "kernels": {"cpu": {"aten_capability": "AVX512"}}}
    recorded = [
        {"rank": 0},
        {"rank": 1, "environment_sha256": canonical_sha256(start), "environment_differs": []},
    ]
    now = [{"rank": 0, "environment": start}, {"rank": 1, "environment": {"threads": {"torch": 8}}}]
    assert rank_environment_drift(recorded, start, now) == [
        "distributed.ranks[1].environment.kernels: recorded {'cpu': {'aten_capability': 'AVX512'}}, now None",
        "distributed.ranks[1].environment.threads.torch: recorded 4, now 8",
    ]

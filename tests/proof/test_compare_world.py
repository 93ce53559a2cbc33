"""What ``compare`` gives as the cause of two torchrun runs' divergence in the cases a review found
told wrongly: Trainer-made runs at two world sizes, a rank launched in another environment, a
resume that restored no RNG state, and a gradient norm another strategy reduced otherwise."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from test_compare_causes import KERNELS, _edit_record

from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import Difference, Verdict
from rundirs import RunSpec, edit_ledger, write_run_dir

TRAINER = {"trainer": {"class": "transformers.trainer.Trainer", "args": {"seed": 42}}}
NOTHING_RECORDED = (
    "numbers differ from step 1 with identical data order, yet nothing recorded differs (config, seeds, "
    "code, data, environment, kernel facts): the cause is nondeterminism, or a kernel choice no "
    "recorded fact shows"
)
RANK_1_KERNELS = [
    "environment.kernels.cpu.aten_capability: recorded 'AVX512', now 'DEFAULT'",
    "environment.kernels.steering_env.ATEN_CPU_CAPABILITY: recorded None, now 'default'",
]
RANK_1_KERNELS_SAID = (
    "rank 1 ran with other CPU kernels: CPU capability DEFAULT vs AVX512; kernel environment variables "
    "ATEN_CPU_CAPABILITY=default vs ATEN_CPU_CAPABILITY=unset: what one rank computes with changes its "
    "gradients, and through their sum every rank's update; start every rank in the same environment"
)
SUMMED = (
    "world size 2 vs 1: the gradients and losses of a step are summed in another order (another "
    "reduction tree), so the last bits differ"
)


def _launched(run: Path, world: int, **section: Any) -> None:
    """Give ``run`` the ``distributed`` section a torchrun launch at ``world`` ranks records
    (docs/distributed.md), each rank in rank 0's environment; ``section`` overrides its keys."""
    ranks = [
        {
            "rank": rank,
            "local_rank": rank,
            "host": "vm",
            "device": "cpu",
            "device_name": "AMD EPYC",
            "environment_sha256": "3ef8" * 16,
            "environment_differs": [],
        }
        for rank in range(world)
    ]
    distributed = {
        "world_size": world,
        "backend": "gloo",
        "strategy": "ddp",
        "launcher": "torchrun",
        "dropout_seeding": "per global micro-batch: reprotune/dist-seed/v1/<seeds.dropout>/<step>/<k>",
        "reductions": {"grad_norm": "float64 sum of squares of the summed gradients"},
        "ranks": ranks,
        **section,
    }
    _edit_record(run, lambda record: record.update(distributed=distributed))


def _rank_ran_with(run: Path, rank: int, lines: list[str], **entry: Any) -> None:
    """Record that ``rank`` of ``run`` ran in another environment than rank 0 (``lines``, as
    ``_run.ranks.ranks_section`` writes them), its entry's other fields updated with ``entry``."""

    def change(record: dict[str, Any]) -> None:
        record["distributed"]["ranks"][rank].update(
            environment_differs=lines, environment_sha256="4a8e" * 16, **entry
        )

    _edit_record(run, change)


def _trainer_ranks(run: Path, world: int) -> None:
    """The ``trainer`` section a ReprotuneCallback writes under torchrun at ``world`` ranks."""
    ranks = [{"rank": r, "local_rank": r, "host": "vm", "device": "cpu"} for r in range(world)]
    _edit_record(run, lambda record: record.update(trainer={"ranks": ranks, "steps_per_epoch": 16 // world}))


def test_trainer_runs_at_two_world_sizes_part_at_the_world_size(tmp_path: Path) -> None:
    """Two Trainer-made runs at world sizes 2 and 1: their records have no ``distributed`` section,
    only the ranks the callback saw; compare said nothing recorded differs (nondeterminism). The
    world size is the cause, ranked where reprotune's own runs' is: before the environment."""
    two = write_run_dir(tmp_path / "w2", RunSpec(config=TRAINER, environment=KERNELS))
    one = write_run_dir(tmp_path / "w1", RunSpec(config=TRAINER, environment=KERNELS, noise_from_step=1))
    _trainer_ranks(two, 2)
    _trainer_ranks(one, 1)
    world = (
        "numbers differ from step 1 with identical data order: world size 2 vs 1: the global batch and "
        "the sampler's sharding differ: each rank trains a batch of its own at every step, the sampler "
        "deals the rows among the ranks and the gradients are averaged over them, so the steps train on "
        "other rows; a Trainer script reproduces at its own world size (launch both with the same "
        "torchrun --nproc_per_node)"
    )
    result = compare_runs(two, one)
    assert result.verdict is Verdict.DIVERGED
    assert result.differences == (Difference("distributed", "trainer.world_size", 2, 1, "changed"),)
    assert result.causes == (world,)
    assert "    trainer.world_size: 2 -> 1\n" in result.format()

    threads = write_run_dir(
        tmp_path / "threads",
        RunSpec(config=TRAINER, environment={**KERNELS, "threads": {"torch_intra_op": 4}}, noise_from_step=1),
    )
    _trainer_ranks(threads, 1)
    assert compare_runs(two, threads).causes == (
        world,
        "numbers differ from step 1 with identical data order: threads.torch_intra_op (absent) vs 4",
    )


def test_a_trainer_record_without_its_ranks_has_no_world_size_to_compare(tmp_path: Path) -> None:
    """A callback that did not list its ranks (an older record) ran at an unknown world size, not
    at one rank: no world size is compared."""
    # neither computed on a GPU (the older record cannot say which device it ran on)
    cpu = {"kernels": {**KERNELS["kernels"], "cuda": None}}
    two = write_run_dir(tmp_path / "w2", RunSpec(config=TRAINER, environment=cpu))
    older = write_run_dir(tmp_path / "older", RunSpec(config=TRAINER, environment=cpu, noise_from_step=1))
    _trainer_ranks(two, 2)
    result = compare_runs(two, older)
    assert (result.differences, result.causes) == ((), (NOTHING_RECORDED,))


def test_a_rank_launched_in_another_kernel_environment_is_the_cause_named_with_its_rank(
    tmp_path: Path,
) -> None:
    """Rank 1 launched with ATEN_CPU_CAPABILITY=default: its record says so in its
    ``environment_differs``, which compare listed as unable to change the numbers (the whole
    ``distributed.ranks``) before saying nothing recorded differs. It is the cause, named with the
    rank; the rank's host and the sha256 of its environment stay inert."""
    het = write_run_dir(tmp_path / "het", RunSpec(environment=KERNELS, noise_from_step=1))
    twin = write_run_dir(tmp_path / "twin", RunSpec(environment=KERNELS))
    _launched(het, 2)
    _launched(twin, 2)
    _rank_ran_with(het, 1, RANK_1_KERNELS, host="node-b")
    result = compare_runs(het, twin)
    assert result.causes == (f"numbers differ from step 1 with identical data order: {RANK_1_KERNELS_SAID}",)
    assert [(d.key, d.a, d.b, d.inert) for d in result.differences] == [
        ("distributed.ranks[1].environment.kernels.cpu.aten_capability", "DEFAULT", "AVX512", False),
        ("distributed.ranks[1].environment.kernels.steering_env.ATEN_CPU_CAPABILITY", "default", None, False),
        ("distributed.ranks[1].environment_sha256", "4a8e" * 16, "3ef8" * 16, True),
        ("distributed.ranks[1].host", "node-b", "vm", True),
    ]
    assert result.next_steps == ()  # no trace replays a rank of a torchrun launch

    _rank_ran_with(twin, 1, RANK_1_KERNELS)  # both runs' rank 1 ran so: no difference between them
    alike = compare_runs(het, twin)
    assert (alike.causes, [d.key for d in alike.differences]) == (
        (NOTHING_RECORDED,),
        ["distributed.ranks[1].host"],
    )


def test_a_rank_s_threads_and_libraries_are_causes_and_its_interpreter_path_is_not(tmp_path: Path) -> None:
    """What else a rank ran with that can change the numbers (threads, a library) is said as its
    environment; what cannot (the interpreter's path, a tracker variable) is listed and inert."""
    environment = {**KERNELS, "distributions": {"torch": "2.13.0"}, "threads": {"torch_intra_op": 1}}
    het = write_run_dir(tmp_path / "het", RunSpec(environment=environment, noise_from_step=1))
    twin = write_run_dir(tmp_path / "twin", RunSpec(environment=environment))
    _launched(het, 2)
    _launched(twin, 2)
    lines = [
        "environment.threads.torch_intra_op: recorded 1, now 2",
        "environment.distributions.torch: recorded '2.13.0', now '2.14.1'",
        "environment.python.executable: recorded '/a/bin/python', now '/b/bin/python'",
        "environment.env.WANDB_NOTES: recorded None, now 'x'",
    ]
    _rank_ran_with(het, 1, lines)
    result = compare_runs(het, twin)
    assert result.causes == (
        "numbers differ from step 1 with identical data order: rank 1 ran with another environment: "
        "torch 2.14.1 vs 2.13.0; threads.torch_intra_op 2 vs 1: what one rank computes with changes its "
        "gradients, and through their sum every rank's update; start every rank in the same environment",
    )
    assert {d.key: d.inert for d in result.differences} == {
        "distributed.ranks[1].environment.distributions.torch": False,
        "distributed.ranks[1].environment.env.WANDB_NOTES": True,
        "distributed.ranks[1].environment.python.executable": True,
        "distributed.ranks[1].environment.threads.torch_intra_op": False,
        "distributed.ranks[1].environment_sha256": True,
    }


def test_a_torchrun_resume_without_the_rng_states_is_no_cause(tmp_path: Path) -> None:
    """Run A trained at world size 1 under torchrun and was resumed at step 4 at world size 2,
    which restores no RNG state; run B trained at 1 throughout. A torchrun run seeds every
    micro-batch's dropout anew (a resume with REPROTUNE_SKIP_RNG_RESTORE=1 gives the same bytes):
    the world size the resume changed is the cause, said once, and the missing RNG restore none (it
    was ranked first). A plain run's resume without its RNG states still is the first cause."""
    resized = write_run_dir(tmp_path / "resized", RunSpec(environment=KERNELS, noise_from_step=5))
    one = write_run_dir(tmp_path / "w1", RunSpec(environment=KERNELS))
    _launched(resized, 1, world_size_changes=[{"at_step": 4, "attempt": 2, "from": 1, "to": 2}])
    _launched(one, 1)
    attempt = {
        "resumed": True,
        "from_step": 4,
        "rng_restored": False,
        "distributed_drift": ["distributed.world_size: recorded 1, now 2"],
    }
    _edit_record(resized, lambda record: record.update(attempts=[{"resumed": False}, attempt]))
    assert compare_runs(resized, one).causes == (
        "numbers differ from step 5 with identical data order: run A was resumed from its step-4 "
        "checkpoint with other distributed setup than it started with (noted on that attempt): "
        f"{SUMMED}; runs at different world sizes agree within a tolerance, not bit for bit (compare "
        "with --tolerance)",
    )

    plain = write_run_dir(tmp_path / "plain", RunSpec(environment=KERNELS, noise_from_step=5))
    _edit_record(
        plain,
        lambda record: record.update(attempts=[{"resumed": False}, {**attempt, "distributed_drift": []}]),
    )
    assert compare_runs(plain, write_run_dir(tmp_path / "ref", RunSpec(environment=KERNELS))).causes == (
        "numbers differ from step 5 with identical data order: run A was resumed from its step-4 "
        "checkpoint without restoring the RNG states: every random draw after it (dropout) differs",
    )


def test_a_torchrun_resume_without_rng_states_is_no_cause_beside_the_same_launch(tmp_path: Path) -> None:
    """Both runs trained under torchrun at world size 2 on the same hosts and devices (nothing in
    their ``distributed`` sections differs); run A was resumed at step 4 without its RNG states.
    Its dropout is seeded per micro-batch, so that resume is no cause (it was ranked first, where
    only runs whose distributed facts differed were known to be torchrun runs)."""
    resumed = write_run_dir(tmp_path / "resumed", RunSpec(environment=KERNELS, noise_from_step=5))
    whole = write_run_dir(tmp_path / "whole", RunSpec(environment=KERNELS))
    _launched(resumed, 2)
    _launched(whole, 2)
    attempt = {"resumed": True, "from_step": 4, "rng_restored": False, "distributed_drift": []}
    _edit_record(resumed, lambda record: record.update(attempts=[{"resumed": False}, attempt]))
    causes = compare_runs(resumed, whole).causes
    assert not any("RNG" in cause for cause in causes), causes
    assert len(causes) == 1 and "nothing recorded differs" in causes[0], causes


def test_a_lone_gradient_norm_beside_another_strategy_is_the_strategy_not_an_edit(tmp_path: Path) -> None:
    """DDP against FSDP at world size 2: only step 1's grad_norm differs, by one ulp, and the
    adapters agree. The strategy reduces the gradient norm in another order; compare said first
    that the ledger looks edited. Between two runs of one strategy the same lone line still does."""
    fsdp_reductions = {"grad_norm": "float64 sum of squares of each rank's gradient shards, gathered"}
    ddp = write_run_dir(
        tmp_path / "ddp", RunSpec(environment=KERNELS, config={"distributed": {"strategy": "ddp"}})
    )
    fsdp = write_run_dir(
        tmp_path / "fsdp", RunSpec(environment=KERNELS, config={"distributed": {"strategy": "fsdp"}})
    )
    _launched(ddp, 2)
    _launched(fsdp, 2, strategy="fsdp", reductions=fsdp_reductions)
    line = json.loads((fsdp / "ledger.jsonl").read_text().splitlines()[1])
    one_ulp = math.nextafter(float.fromhex(line["grad_norm"]), math.inf).hex()
    edit_ledger(fsdp, 1, "grad_norm", one_ulp, as_written=True)
    result = compare_runs(ddp, fsdp)
    assert (result.where.lines_differing, result.where.other_fields) == (1, ("grad_norm",))
    assert result.adapter is not None and result.adapter.identical
    assert result.causes == (
        "numbers differ from step 1 with identical data order: strategy ddp vs fsdp: the gradients are "
        "reduced another way and the gradient norm is summed in another order (distributed.reductions), "
        "so their last bits can differ; runs of two strategies agree within a tolerance, not bit for bit "
        "(compare with --tolerance)",
    )

    twin = write_run_dir(
        tmp_path / "twin", RunSpec(environment=KERNELS, config={"distributed": {"strategy": "fsdp"}})
    )
    _launched(twin, 2, strategy="fsdp", reductions=fsdp_reductions)
    assert compare_runs(twin, fsdp).causes == (
        "only the ledger line of step 1 differs (grad_norm) and every later step agrees: the ledger "
        "looks edited or corrupted, not trained differently",
    )


def test_a_rank_a_resume_started_in_another_kernel_environment_is_the_cause_with_the_resume(
    tmp_path: Path,
) -> None:
    """A resume whose rank 1 ran with ATEN_CPU_CAPABILITY=default notes that rank's environment
    as it moved (``distributed.ranks[1].environment...: recorded X, now Y``): the run is compared
    as it computed the steps after, the rank named, said once, with the resume."""
    resumed = write_run_dir(tmp_path / "resumed", RunSpec(environment=KERNELS, noise_from_step=5))
    twin = write_run_dir(tmp_path / "twin", RunSpec(environment=KERNELS))
    _launched(resumed, 2)
    _launched(twin, 2)
    moved = [f"distributed.ranks[1].{line}" for line in RANK_1_KERNELS]
    attempt = {"resumed": True, "from_step": 4, "rng_restored": True, "distributed_drift": moved}
    _edit_record(resumed, lambda record: record.update(attempts=[{"resumed": False}, attempt]))
    result = compare_runs(resumed, twin)
    assert result.differences == ()  # the records agree: the resume ran otherwise
    assert result.causes == (
        "numbers differ from step 5 with identical data order: run A was resumed from its step-4 "
        f"checkpoint with other rank environments than it started with (noted on that attempt): "
        f"{RANK_1_KERNELS_SAID}",
    )

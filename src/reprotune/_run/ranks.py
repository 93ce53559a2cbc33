"""The ranks of a distributed run, as the record keeps them, and what must agree between them.

Each rank of a ``torchrun`` launch reports who it is (host, device), its environment fingerprint
and the hashes of what it loaded (base model, tokenizer, data, split, LoRA init). Rank 0 refuses
to train when two ranks have different package sets or loaded different inputs
(:func:`check_ranks_agree`), and keeps one entry per rank in the record's ``distributed`` section
(:func:`ranks_section`); a resume notes each rank whose environment moved since
(:func:`rank_environment_drift`). :func:`check_resume_world` decides whether a run may be resumed
at the world size it is resumed at: the world size its checkpoint was saved at
(:func:`checkpoint_world`), not the one a resume before it tried. Pure functions of the record's
data (JSON, or its typed sections) and of checkpoints' ``state.json``: never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reprotune._errors import InputError
from reprotune._jsonio import canonical_sha256, flattened
from reprotune._run.checkpoint_files import list_checkpoints, read_state_file, verify_checkpoint
from reprotune._run.drift import leaf_changes, section_drift
from reprotune._run.layout import RunLayout
from reprotune._run.record_sections import DistributedRecord

if TYPE_CHECKING:
    from reprotune._run.record import RunRecord

#: What each rank loaded, as it reports it: key -> what it is, for messages.
INPUT_KEYS: dict[str, str] = {
    "model_weights_sha256": "base model weights",
    "tokenizer_sha256": "tokenizer files",
    "data_sha256": "data",
    "split_sha256": "split",
    "lora_init_sha256": "LoRA init",
}
_SAME_PACKAGES_FIX = (
    "install the same packages at the same versions on every node (`pip freeze` on rank 0's host, "
    "`pip install -r` of that list on the others), then launch again"
)


def _who(identity: Mapping[str, Any]) -> str:
    return f"rank {identity.get('rank')} (host {identity.get('host')})"


def _package_problems(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    env0, env = first.get("environment") or {}, other.get("environment") or {}
    problems = []
    py0, py = (env0.get("python") or {}).get("version"), (env.get("python") or {}).get("version")
    if py0 != py:
        problems.append(f"Python {py} (rank 0: {py0})")
    dists0, dists = env0.get("distributions") or {}, env.get("distributions") or {}
    for name in sorted(set(dists0) | set(dists)):
        if dists0.get(name) != dists.get(name):
            here, there = dists.get(name, "not installed"), dists0.get(name, "not installed")
            problems.append(f"{name} {here} (rank 0: {there})")
    return problems


def check_ranks_agree(identities: Sequence[Mapping[str, Any]]) -> None:
    """Refuse ranks that would not compute the same run: other packages or other inputs than rank 0.

    Args:
        identities: every rank's report, in rank order (``rank``, ``host``, ``environment``,
            ``inputs``: the hashes of :data:`INPUT_KEYS`).

    Raises:
        InputError: naming each rank, its host, and every package or input that differs.
    """
    first = identities[0]
    package_lines, input_lines = [], []
    for identity in identities[1:]:
        problems = _package_problems(first, identity)
        if problems:
            shown = "; ".join(problems[:12]) + (
                f"; and {len(problems) - 12} more" if len(problems) > 12 else ""
            )
            package_lines.append(f"{_who(identity)}: {shown}")
        inputs0, inputs = first.get("inputs") or {}, identity.get("inputs") or {}
        for key, what in INPUT_KEYS.items():
            if inputs0.get(key) != inputs.get(key):
                input_lines.append(
                    f"{_who(identity)} loaded other {what} than rank 0 ({key} "
                    f"{str(inputs.get(key))[:12]}... vs {str(inputs0.get(key))[:12]}...)"
                )
    if package_lines:
        raise InputError(
            "the ranks run different package sets, so they would not compute the same numbers:\n  "
            + "\n  ".join(package_lines),
            source="torchrun ranks (each rank's installed distributions)",
            fix=_SAME_PACKAGES_FIX,
        )
    if input_lines:
        raise InputError(
            "the ranks did not load the same inputs:\n  " + "\n  ".join(input_lines),
            source="torchrun ranks (the config's model.name, data.path and split)",
            fix="give every node the same model directory, data file and split manifest (e.g. on a "
            "shared filesystem), and the same config",
        )


def ranks_section(identities: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The record's entry per rank: who and where, its environment's sha256 and how it differs
    from rank 0's (rank 0's whole fingerprint is the record's ``environment``)."""
    env0 = identities[0].get("environment") or {}
    out = []
    for identity in identities:
        env = identity.get("environment") or {}
        out.append(
            {
                "rank": identity.get("rank"),
                "local_rank": identity.get("local_rank"),
                "host": identity.get("host"),
                "device": identity.get("device"),
                "device_name": identity.get("device_name"),
                "environment_sha256": canonical_sha256(env),
                "environment_differs": section_drift(env0, env, prefix="environment"),
            }
        )
    return out


def rank_environment_drift(
    recorded_ranks: Sequence[Mapping[str, Any]],
    start_environment: Mapping[str, Any],
    identities: Sequence[Mapping[str, Any]],
) -> list[str]:
    """How the environment of each rank but 0 moved since the run started, one line per key, as
    ``distributed.ranks[R].environment.KEY: recorded X, now Y`` (rank 0's own moves are the
    attempt's ``environment_drift``).

    The record keeps of a rank only its environment's hash and how it differed from rank 0's at
    the start (``environment_differs``, against ``start_environment``, rank 0's whole fingerprint
    then): a rank's value of a key at the start was rank 0's unless that list names the key. A
    rank the run did not have (a resume at a larger world size) has nothing to compare to.

    Args:
        recorded_ranks: the record's ``distributed.ranks`` (the run's start).
        start_environment: the record's ``environment``.
        identities: every rank's report now (``rank``, ``environment``), in rank order.
    """
    start = flattened(start_environment, "environment")
    drift: list[str] = []
    for identity in identities[1:]:
        rank, environment = identity.get("rank"), identity.get("environment") or {}
        entry = next((e for e in recorded_ranks if e.get("rank") == rank), None)
        sha256 = canonical_sha256(environment)
        if entry is None or entry.get("environment_sha256") == sha256:
            continue
        was = {line.partition(": recorded ")[0]: line for line in entry.get("environment_differs") or []}
        now = flattened(environment, "environment")
        # a whole section one side lacks is one change, keyed where it is (no leaf under it)
        changes = {
            k: (a, b) for k, a, b in leaf_changes(start_environment, environment, prefix="environment")
        }
        lines = []
        for key in sorted(set(was) | set(changes)):
            zero = repr(start[key] if key in start else changes.get(key, (None, None))[0])
            value = now[key] if key in now else changes.get(key, (None, None))[1]
            before = was[key].removeprefix(f"{key}: recorded {zero}, now ") if key in was else zero
            if before != repr(value):
                lines.append(f"distributed.ranks[{rank}].{key}: recorded {before}, now {value!r}")
        if not lines:  # it moved where no key says (a section of another shape): its hash
            key, recorded = f"distributed.ranks[{rank}].environment_sha256", entry.get("environment_sha256")
            lines.append(f"{key}: recorded {recorded!r}, now {sha256!r}")
        drift += lines
    return drift


def resume_command(run_dir: str, world_size: int | None, nodes: int | None = 1) -> str:
    """The command that resumes the run in ``run_dir``: under torchrun at its world size (None:
    a one-process run) over ``nodes`` nodes (None: not known), for messages."""
    if world_size is None:
        return f"`reprotune resume {run_dir}`"
    if nodes is None or nodes < 1 or world_size % nodes:
        return (
            f"`torchrun --nproc_per_node {world_size} -m reprotune resume {run_dir}` (on several nodes: "
            "the run's --nnodes, that many processes in all, and its rendezvous)"
        )
    if nodes == 1:
        return f"`torchrun --nproc_per_node {world_size} -m reprotune resume {run_dir}`"
    return (
        f"`torchrun --nnodes {nodes} --nproc_per_node {world_size // nodes} -m reprotune resume {run_dir}` "
        "on every node, with the run's rendezvous"
    )


def _nodes(distributed: DistributedRecord | None) -> int | None:
    """How many nodes the run trained on, as its record says (None: not recorded)."""
    return distributed.nodes if distributed is not None else None


def current_world(distributed: DistributedRecord | None) -> int | None:
    """The world size a run trains at now: its last recorded change, else where it started;
    None for a run made without torchrun."""
    if distributed is None:
        return None
    changes = distributed.world_size_changes
    return changes[-1].to if changes else distributed.world_size


def checkpoint_world(checkpoints: Path) -> tuple[str, int] | None:
    """The checkpoint a resume restores, as far as it can be told before the restore: the newest
    in ``checkpoints`` whose files match their hashes (the restore's first pick); its name and the
    world size its ``state.json`` says it was saved at. None when none verifies (the resume starts
    from step 0), or the newest names no world size."""
    for path in reversed(list_checkpoints(checkpoints)):
        if verify_checkpoint(path) is not None:
            continue
        world = (read_state_file(path).distributed or {}).get("world_size")
        return (path.name, world) if isinstance(world, int) else None
    return None


def check_resume_world(
    recorded: DistributedRecord | None,
    world_size: int | None,
    *,
    allow_change: bool,
    run_dir: str,
    saved_at: tuple[str | None, int] | None = None,
) -> dict[str, int] | None:
    """Whether a run may resume at ``world_size``; the change the restore may record.

    Args:
        recorded: the record's ``distributed`` section (None: the run was made without torchrun).
        world_size: the world size of this resume (None: without torchrun).
        allow_change: ``--allow-world-size-change`` (or a world-size invariant run).
        run_dir: the run directory, for messages.
        saved_at: the checkpoint the resume restores and the world size it was saved at
            (:func:`checkpoint_world`; the name None: none is left, the run starts over, and the
            world size is the one it started at); None: the world size the run trains at as its
            record says (:func:`current_world`). A resume before this one that trained at another
            world size and left no checkpoint changed nothing this resume goes on from.

    Returns:
        None when the world size may not change and need not; else ``{"from": the checkpoint's
        world size, "to": world_size}``: an allowed change, which the restore records when the
        checkpoint it restores was saved at another world size than ``to`` (``from`` equals ``to``
        when the one expected was saved at this world size).

    Raises:
        InputError: a run made under torchrun resumed without it, or the reverse (never allowed:
            the data placement and the dropout seeding differ); another world size without
            ``allow_change``.
    """
    before = saved_at[1] if saved_at is not None else current_world(recorded)
    if before is None and world_size is None:
        return None
    if before is None:
        raise InputError(
            f"the run in {run_dir} was made in one process without torchrun; this resume runs under "
            f"torchrun (world size {world_size})",
            source=f"{run_dir}/record.json (no distributed section)",
            fix=f"resume it the way it ran: `reprotune resume {run_dir}`",
        )
    if world_size is None:
        raise InputError(
            f"the run in {run_dir} was made under torchrun at world size {before}; this resume runs "
            "without torchrun",
            source=f"{run_dir}/record.json (key distributed.world_size)",
            fix=f"resume it under torchrun: {resume_command(run_dir, before, _nodes(recorded))}",
        )
    if allow_change:
        return {"from": before, "to": world_size}
    if before == world_size:
        return None
    if saved_at is None:
        where, key = f"trains at world size {before}", f"{run_dir}/record.json (key distributed.world_size)"
    elif saved_at[0] is None:
        where = f"starts over from step 0 (no checkpoint is left), and it started at world size {before}"
        key = f"{run_dir}/record.json (key distributed.world_size)"
    else:
        where = f"resumes from its checkpoint {saved_at[0]}, saved at world size {before}"
        key = f"{run_dir}/checkpoints/{saved_at[0]}/state.json (key distributed.world_size)"
    raise InputError(
        f"the run in {run_dir} {where}; this resume runs at world size {world_size}, which sums the "
        "gradients in another order, so the result would not be bitwise what an uninterrupted run gives",
        source=key,
        fix=f"launch {before} processes in all (torchrun --nproc_per_node / --nnodes), or pass "
        "--allow-world-size-change to go on anyway (the change is recorded and compare names it)",
    )


def check_resume_placement(grad_accum_steps: int, world_size: int | None, run_dir: str) -> None:
    """Refuse a resume at a world size that does not divide the run's ``grad_accum_steps``: each
    rank trains the same number of a step's micro-batches. A resume keeps the run's config, so
    the fix is the world size (a new run would change the config instead: ``check_placement``).

    Raises:
        InputError: naming the world sizes that divide it.
    """
    if world_size is None or grad_accum_steps % world_size == 0:
        return
    sizes = [str(n) for n in range(1, grad_accum_steps + 1) if grad_accum_steps % n == 0]
    listed = sizes[0] if len(sizes) == 1 else f"{', '.join(sizes[:-1])} or {sizes[-1]}"
    raise InputError(
        f"train.grad_accum_steps {grad_accum_steps} is not a multiple of the world size {world_size}: "
        "each rank must train the same number of the step's micro-batches",
        source=f"{run_dir}/record.json (key config.train.grad_accum_steps)",
        fix=f"resume at a world size that divides {grad_accum_steps}: {listed} (a resume keeps the "
        "run's config)",
    )


def resume_world_change(
    record: RunRecord, world_size: int | None, *, allow_change: bool, run_dir: Path
) -> dict[str, int] | None:
    """:func:`check_resume_world` for a resume of the run ``record`` holds at ``world_size`` ranks
    (None: a plain process), against the world size of the checkpoint it restores (the run's
    start's when none is left: it starts over), then, for an allowed change,
    :func:`check_resume_placement`: checked before anything is written. A run in the world-size
    invariant mode may change its world size without being told: the result is bitwise what the
    uninterrupted run gives (the change is recorded all the same)."""
    train = record.config.get("train") or {}
    recorded = record.distributed
    saved_at: tuple[str | None, int] | None = None
    if recorded is not None:
        saved_at = checkpoint_world(RunLayout(run_dir).checkpoints) or (None, recorded.world_size)
    change = check_resume_world(
        recorded,
        world_size,
        allow_change=allow_change or train.get("world_size_invariant") is True,
        run_dir=str(run_dir),
        saved_at=saved_at,
    )
    # once another world size is allowed (a refusal of it names the run's own first): can it place
    # the micro-batches?
    if change is not None and isinstance(train.get("grad_accum_steps"), int):
        check_resume_placement(train["grad_accum_steps"], world_size, str(run_dir))
    return change

"""Whether ``reprotune rerun`` is launched the way its run was: under torchrun or not, at the world
size it trained at, or, for a run whose world size changed when it resumed, compared within a
tolerance. Checked before anything trains (``_proof.rerun``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reprotune._errors import InputError
from reprotune._proof.world import same_launch
from reprotune._train.distributed import launch_variables
from reprotune._train.strategy import under_torchrun


def _launched_world_size() -> int | None:
    """The world size of this process's torchrun launch; None outside torchrun."""
    return launch_variables("rerun")[1] if under_torchrun() else None  # a stale TORCHELASTIC_RUN_ID: refused


def refuse_another_launch(
    record: Mapping[str, Any], *, rerun_args: str, source: str, tolerance: float | None = None
) -> None:
    """Refuse a rerun launched otherwise than its run (under torchrun or not, at another world
    size), as ``resume`` and ``verify --spot`` do: dropout is seeded per micro-batch under torchrun
    and from one stream outside it, and the gradients add up in another order at another world
    size, so it would train the whole run to report a difference that is no change. A run in the
    world-size invariant mode reruns under torchrun at any world size (docs/distributed.md). A run
    whose world size changed when it resumed (``distributed.world_size_changes``) trained at two,
    so no launch reruns it bit for bit: refused unless compared within a ``tolerance``, at the
    world size it started at. ``rerun_args``: what follows ``reprotune rerun`` in the command the
    fix names.

    Raises:
        InputError: naming both launches and the command that reruns the run the way it ran.
    """
    distributed = record.get("distributed") or {}
    recorded, launched = distributed.get("world_size"), _launched_world_size()
    invariant = ((record.get("config") or {}).get("train") or {}).get("world_size_invariant") is True
    changes = distributed.get("world_size_changes") or []
    if changes and not invariant and tolerance is None:
        sizes = " and ".join(f"{c.get('from')} -> {c.get('to')} at step {c.get('at_step')}" for c in changes)
        raise InputError(
            f"the run changed its world size when it resumed ({sizes}): its gradients were summed "
            "in the order of each world size in turn, so a rerun at any one world size would train "
            "the whole run to report a difference that is no change",
            source=f"{source} (key distributed.world_size_changes)",
            fix=f"compare within a tolerance instead: `{_rerun_command(distributed, rerun_args)} "
            "--tolerance 1e-6` (it reruns at the world size the run started at), or "
            "`reprotune compare RUN_A RUN_B --tolerance 1e-6` with a run of your own (docs/distributed.md)",
        )
    if same_launch(recorded, launched, invariant=invariant):
        return
    now = "in one process" if launched is None else f"under torchrun at world size {launched}"
    if recorded is None:
        raise InputError(
            f"the run was made in one process without torchrun; this rerun runs {now}, which seeds "
            "dropout another way: it would train the whole run to report a difference that is no change",
            source=f"{source} (no distributed section)",
            fix=f"rerun it the way it ran, without torchrun: `reprotune rerun {rerun_args}`",
        )
    rendezvous = " on every node, with the run's rendezvous" if (distributed.get("nodes") or 1) != 1 else ""
    raise InputError(
        f"the run was made under torchrun at world size {recorded}; this rerun runs {now}, which "
        "seeds dropout or adds the gradients another way: it would train the whole run to report a "
        "difference that is no change",
        source=f"{source} (key distributed.world_size)",
        fix=f"rerun it under torchrun at world size {recorded}: `{_rerun_command(distributed, rerun_args)}`"
        f"{rendezvous}",
    )


def _rerun_command(distributed: Mapping[str, Any], rerun_args: str) -> str:
    """The torchrun command that reruns a run made under torchrun (its ``distributed`` section)
    the way it started: its world size over its nodes."""
    recorded, nodes = distributed.get("world_size"), distributed.get("nodes") or 1
    per_node = (
        recorded // nodes
        if isinstance(recorded, int) and isinstance(nodes, int) and nodes > 0 and recorded % nodes == 0
        else recorded
    )
    several = f" --nnodes {nodes}" if nodes != 1 else " --standalone"
    return f"torchrun{several} --nproc_per_node {per_node} -m reprotune rerun {rerun_args}"

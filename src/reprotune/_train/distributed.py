"""Distributed runs under ``torchrun``: the process group, this rank, where rows go, and the
reductions reprotune does itself, in a fixed order.

``torchrun --nproc_per_node N -m reprotune run CONFIG`` starts N processes (ranks). Each builds the
same setup; rank 0 alone writes the run directory. Outside torchrun nothing here runs: a plain
``reprotune run`` has no process group and is unchanged.

- **Placement.** An optimizer step's rows are the same for every world size: ``train.batch_size``
  x ``train.grad_accum_steps`` rows from the data order, cut into ``grad_accum_steps`` global
  micro-batches. Rank ``r`` of ``W`` trains micro-batches ``r*K/W ... (r+1)*K/W - 1``
  (:func:`rank_micro_batches`): a pure function of (seed, epoch, position, rank, world size).
- **Dropout.** Before micro-batch ``k`` of step ``s``, torch's generator is seeded with
  :func:`micro_batch_seed` (``dropout`` seed, s, k): the masks depend on the micro-batch, not on
  which rank trains it, so world sizes 1 and 2 draw the same masks.
- **Reductions.** The loss, the gradient norm and the validation loss are gathered as float64
  vectors from every rank and added in rank order, then in micro-batch order
  (:func:`gather_f64`): the same bits on every rank and in every rerun. The gradients themselves
  are summed by the backend (DDP's all-reduce, FSDP's reduce-scatter); docs/distributed.md says
  what that guarantees.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from reprotune._config.schema import ExperimentConfig
from reprotune._determinism.device import resolve_device
from reprotune._determinism.seeds import mixed_seed
from reprotune._errors import InputError, RunFailedError
from reprotune._train.strategy import under_torchrun

Strategy = Literal["ddp", "fsdp"]
T = TypeVar("T")

#: The derivation of per-micro-batch and per-rank seeds (version 1: records depend on it).
SEED_PREFIX = "reprotune/dist-seed/v1"


@dataclass(frozen=True)
class DistContext:
    """This process's place in a distributed run.

    Attributes:
        rank: this process's rank, 0 ... world_size - 1.
        world_size: how many processes train.
        local_rank: the rank on this node (picks the GPU).
        strategy: ``ddp`` (replicated model) or ``fsdp`` (FSDP2, sharded decoder layers).
        backend: the process group's backend for the training tensors: ``gloo`` or ``nccl``.
        device: this rank's compute device.
        timeout_s: how long a collective waits for the other ranks before failing.
        world_size_invariant: ``train.world_size_invariant``: the gradients are summed by
            reprotune in global micro-batch order, and the trainable weights are whole on every
            rank (DDP does not wrap the model; FSDP2 shards only the frozen weights).
    """

    rank: int
    world_size: int
    local_rank: int
    strategy: Strategy
    backend: str
    device: torch.device
    timeout_s: float
    world_size_invariant: bool = False

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes the run directory."""
        return self.rank == 0

    @property
    def trainable_sharded(self) -> bool:
        """Whether each rank holds only a shard of the trainable weights (FSDP2, not invariant)."""
        return self.strategy == "fsdp" and not self.world_size_invariant

    def describe(self) -> dict[str, Any]:
        """World size, backend and strategy (the record's and the checkpoint's ``distributed``)."""
        return {"world_size": self.world_size, "backend": self.backend, "strategy": self.strategy}


def launch_variables(command: str = "...") -> tuple[int, int, int]:
    """torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (0 when unset) for this process.

    Raises:
        InputError: ``TORCHELASTIC_RUN_ID`` is set (as under torchrun) but they are not whole
            numbers: a variable left in a shell or a container's environment, no torchrun launch.
    """
    launch = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if (
        not all((launch[name] or "").isdigit() for name in ("RANK", "WORLD_SIZE"))
        or not (launch["LOCAL_RANK"] or "0").isdigit()
    ):
        shown = ", ".join(f"{k}={v}" if v is not None else f"{k} unset" for k, v in launch.items())
        raise InputError(
            f"TORCHELASTIC_RUN_ID is set, as under torchrun, but the launch's variables are not ({shown})",
            source="TORCHELASTIC_RUN_ID",
            fix=f"unset TORCHELASTIC_RUN_ID outside torchrun, or start it under torchrun "
            f"(`torchrun ... -m reprotune {command}`)",
        )
    return int(launch["RANK"] or 0), int(launch["WORLD_SIZE"] or 1), int(launch["LOCAL_RANK"] or 0)


def start_process_group(cfg: ExperimentConfig) -> DistContext | None:
    """Join the process group ``torchrun`` set up; None outside torchrun (a plain run).

    The compute device is ``determinism.device``; on CUDA each rank takes GPU ``LOCAL_RANK``.
    Backend ``auto`` is ``nccl`` on CUDA and ``gloo`` on CPU. Object collectives (the record's
    fingerprints, checkpoint metadata) go through gloo either way.

    Raises:
        InputError: ``nccl`` asked for on CPU, fewer GPUs on this node than ranks on it, or
            ``TORCHELASTIC_RUN_ID`` set outside a torchrun launch.
    """
    if not under_torchrun():
        return None
    settings = cfg.distributed
    rank, world, local_rank = launch_variables()
    device = _rank_device(resolve_device(cfg.determinism.device), local_rank)
    backend = settings.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise InputError(
            f"distributed.backend is 'nccl' but the device is {device.type}",
            source="distributed.backend",
            fix="use backend gloo (or auto) on CPU, or determinism.device cuda",
        )
    if not dist.is_initialized():
        spec = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
        dist.init_process_group(
            backend=spec,
            timeout=datetime.timedelta(seconds=settings.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return DistContext(
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        strategy=settings.strategy,
        backend=backend,
        device=device,
        timeout_s=settings.timeout_s,
        world_size_invariant=cfg.train.world_size_invariant,
    )


def _rank_device(device: torch.device, local_rank: int) -> torch.device:
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise InputError(
            f"local rank {local_rank} needs GPU {local_rank}, but this node has {count}",
            source="torchrun --nproc_per_node",
            fix=f"start at most {count} processes per node",
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


@contextlib.contextmanager
def process_group(cfg: ExperimentConfig | None) -> Iterator[DistContext | None]:
    """:func:`start_process_group` for the block, and leave the group after it (None: no torchrun,
    or no ``cfg``). A group the caller started already is used and left to it."""
    ours = not dist.is_initialized()
    ctx = start_process_group(cfg) if cfg is not None else None
    try:
        yield ctx
    except BaseException as exc:
        if ctx is not None and ours:
            _drop_locals(exc)  # the frames it passed through hold the DDP model: let it go
        raise
    finally:
        if ctx is not None and ours and dist.is_initialized():
            leave_process_group()


def _drop_locals(exc: BaseException) -> None:
    """Clear the locals of the finished frames of ``exc``'s traceback and of the exceptions it was
    raised from or during, so that what only they hold can be collected now (the messages and
    line numbers stay)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # frames still running are left as they are
        todo += [current.__cause__, current.__context__]


def leave_process_group() -> None:
    """``destroy_process_group``, after the objects that hold the group from C++ are gone.

    A gloo group's destructor takes its work queue's lock, which a worker thread holds while it
    drops a finished collective's tensors, for which it needs the GIL. The group's Python object
    releases the GIL before it destroys the group; DDP's reducer, which holds the group too, does
    not. A DDP model left to the garbage collector can so hold the last reference, and a rank
    whose collection comes within milliseconds of its last collective hangs for good (seen at
    exit in 1 of 14 two-rank DDP launches here). So the unreachable DDP model is collected first,
    while ``group`` keeps the group alive: the last reference is then this Python one. (A run makes
    no other group: FSDP2's mesh is built on this one, ``sharding._fully_shard``; after an error,
    ``process_group`` first clears the locals of the frames the exception passed through.)
    """
    group = dist.group.WORLD
    gc.collect()
    dist.destroy_process_group()
    del group  # the last reference: the group is destroyed here, with the GIL released


# --- where rows go, and the seeds of each micro-batch --------------------------------------------


def check_placement(grad_accum_steps: int, world_size: int, batch_size: int) -> None:
    """Refuse a world size that does not divide the step's micro-batches.

    Raises:
        InputError: ``grad_accum_steps`` is not a multiple of ``world_size``; the fix keeps the
            step's rows (``batch_size`` x ``grad_accum_steps``) where another split of them can.
    """
    if grad_accum_steps % world_size:
        rows = batch_size * grad_accum_steps
        splits = [k for k in range(world_size, rows + 1, world_size) if rows % k == 0]
        if splits:
            k = min(splits, key=lambda k: abs(k - grad_accum_steps))
            fix = (
                f"keep the step's {rows} rows in {k} micro-batches: --set train.grad_accum_steps={k} "
                f"--set train.batch_size={rows // k}"
            )
        else:
            fix = (
                f"set train.grad_accum_steps to a multiple of {world_size} (e.g. --set "
                f"train.grad_accum_steps={world_size * max(1, grad_accum_steps // world_size)}), which "
                "changes the step's rows"
            )
        raise InputError(
            f"train.grad_accum_steps {grad_accum_steps} is not a multiple of the world size "
            f"{world_size}: each rank must train the same number of the step's micro-batches",
            source="train.grad_accum_steps",
            fix=fix,
        )


def rank_micro_batches(n_micro: int, rank: int, world_size: int) -> range:
    """The global micro-batches rank ``rank`` trains: a contiguous block of ``n_micro / world_size``."""
    per_rank = n_micro // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def shard_rows(rows: Sequence[int], batch_size: int, world_size: int) -> list[list[int]]:
    """Each rank's rows of one optimizer step (``rows``), by rank, as :func:`rank_micro_batches` says."""
    chunks = [list(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]
    return [
        [row for k in rank_micro_batches(len(chunks), r, world_size) for row in chunks[k]]
        for r in range(world_size)
    ]


def micro_batch_seed(dropout_seed: int, step: int, micro_batch: int) -> int:
    """The seed torch's generator gets before global micro-batch ``micro_batch`` of ``step``.

    ``sha256("reprotune/dist-seed/v1/<dropout seed>/<step>/<micro-batch>")``, first 8 bytes,
    big-endian, masked to 63 bits: independent of the rank that trains it.
    """
    return mixed_seed(SEED_PREFIX, dropout_seed, step, micro_batch)


def rank_seed(dropout_seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s global generator at the start of a run (anything else it draws)."""
    return mixed_seed(SEED_PREFIX, dropout_seed, "rank", rank)


# --- collectives -----------------------------------------------------------------------------------


def _comm_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


def gather_f64(ctx: DistContext, values: Sequence[float]) -> list[list[float]]:
    """Every rank's ``values`` (float64, equal lengths), in rank order, on every rank."""
    local = torch.tensor(list(values), dtype=torch.float64, device=_comm_device(ctx))
    parts = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(parts, local)
    return [part.tolist() for part in parts]


def broadcast_object(ctx: DistContext, obj: T | None) -> T:
    """Rank 0's ``obj`` on every rank (pickled between reprotune's own processes)."""
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[return-value]


def gather_objects(ctx: DistContext, obj: Any) -> list[Any] | None:
    """Every rank's ``obj`` on rank 0, in rank order; None on the other ranks."""
    out: list[Any] | None = [None] * ctx.world_size if ctx.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def scatter_objects(ctx: DistContext, objs: Sequence[Any] | None) -> Any:
    """Rank 0 hands ``objs[r]`` to rank ``r``; each rank returns its own."""
    got: list[Any] = [None]
    dist.scatter_object_list(got, list(objs) if ctx.is_main and objs is not None else None, src=0)
    return got[0]


def decided_by_main(ctx: DistContext, decide: Callable[[], T]) -> T:
    """Run ``decide`` on rank 0 and give every rank its result, or raise its InputError everywhere.

    For the decisions only rank 0 can take (it alone reads the run directory): every rank then
    goes on, or stops with the same message, instead of waiting for a rank that left.
    """
    outcome: tuple[str, Any] | None = None
    if ctx.is_main:
        try:
            outcome = ("ok", decide())
        except InputError as exc:
            outcome = ("error", (exc.message, exc.source, exc.fix))
            broadcast_object(ctx, outcome)
            raise
    kind, payload = broadcast_object(ctx, outcome)
    if kind == "error":
        message, source, fix = payload
        raise InputError(f"rank 0 refused: {message}", source=source, fix=fix)
    result: T = payload
    return result


def is_transport_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer went away (or timed out), as
    torch reports it: a ``DistError``, or the RuntimeError gloo and NCCL raise from inside a
    backward pass or a collective."""
    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        mark in text
        for mark in ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "NCCL")
    )


def lost_rank_error(ctx: DistContext, exc: BaseException) -> RunFailedError:
    """The error of a rank whose collective failed because another rank stopped."""
    return RunFailedError(
        f"rank {ctx.rank} of {ctx.world_size} stopped: another rank left the run "
        f"({type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''})",
        fix="see the first rank's message above (torchrun's summary names it); "
        "`reprotune resume RUN_DIR` under the same torchrun command continues from the last checkpoint",
    )

"""The model across ranks: wrapped for DDP or sharded with FSDP2, and its full state gathered back.

- ``ddp``: ``DistributedDataParallel`` over the PEFT model, with a comm hook that *sums* the
  gradients (no division by the world size): each rank's backward is already scaled by the
  step's global token count, exactly as a single process scales it.
- ``fsdp``: FSDP2 ``fully_shard`` on every decoder layer (the classes the model names in
  ``_no_split_modules``), then on the PEFT model itself; the LoRA weights inside a layer are
  sharded with it. Gradients are reduce-scattered as a sum (``set_gradient_divide_factor(1)``
  with sum-only collectives).

The full trainable state (the ledger's weights hash, checkpoints, the adapter) and the full
optimizer state are gathered with ``torch.distributed.checkpoint.state_dict``; they are plain CPU
tensors keyed by parameter name, the same for both strategies and every world size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from reprotune._compat import ddp_no_buffer_sync
from reprotune._errors import InputError
from reprotune._model.lora import WeightsHasher, tensors_sha256, trainable_tensors
from reprotune._train.distributed import DistContext
from reprotune._train.setup import Setup

_FULL_TRAINABLE = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)
_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)


def wrap_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """The module the training forward goes through: DDP over ``model``, or ``model`` sharded.

    Every rank must have built ``model`` identically (the record checks the LoRA init's hash on
    every rank): neither strategy broadcasts rank 0's weights here.

    Raises:
        InputError: FSDP on a model whose decoder layers cannot be found.
    """
    if ctx.strategy == "ddp" and ctx.world_size_invariant:
        return model  # the gradients are gathered and summed by reprotune (add_in_global_order)
    if ctx.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(
            model,
            device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
            # No broadcasts of rank 0's parameters or buffers: every rank built the same ones, and
            # the record checks the LoRA init's hash on every rank instead of overwriting it.
            init_sync=False,
            **ddp_no_buffer_sync(),
        )
        ddp.register_comm_hook(None, _sum_hook)
        return ddp
    return _fully_shard(model, ctx)


def _sum_hook(state: object, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP's all-reduce as a plain sum (DDP's default hook divides by the world size)."""
    work: Any = dist.all_reduce(bucket.buffer(), async_op=True)
    fut: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    return fut.then(lambda done: done.value()[0])


# DDP checks a hook's annotations as objects; this module's are strings (postponed evaluation).
_sum_hook.__annotations__ = {
    "state": object,
    "bucket": dist.GradBucket,  # type: ignore[attr-defined]  # torch exports it, without __all__
    "return": torch.futures.Future[torch.Tensor],
}


def _world_group() -> dist.ProcessGroup:
    world = dist.group.WORLD
    if world is None:
        raise RuntimeError("FSDP2 needs the process group torchrun started; none is joined")
    return world


def _fully_shard(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    layer_names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in layer_names]
    if not layers:
        raise InputError(
            f"FSDP cannot find the decoder layers of {type(base).__name__} (its _no_split_modules "
            f"is {sorted(layer_names)})",
            source="distributed.strategy",
            fix="use distributed.strategy: ddp for this model",
        )
    # The world's own group, never a second one (init_device_mesh makes one for CPU training on
    # a host with CUDA): leave_process_group holds the world's group alone while it ends.
    mesh = DeviceMesh.from_group(_world_group(), ctx.device.type)
    # Invariant mode: the trainable (LoRA) weights stay whole on every rank, out of FSDP2's hands,
    # so that reprotune sums their gradients in global micro-batch order; the frozen base is sharded.
    ignored = {p for p in model.parameters() if p.requires_grad} if ctx.world_size_invariant else None
    for layer in layers:
        fully_shard(layer, mesh=mesh, ignored_params=ignored)
    fully_shard(model, mesh=mesh, ignored_params=ignored)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    return model


@contextlib.contextmanager
def gradient_sync(train_module: torch.nn.Module, ctx: DistContext, *, sync: bool) -> Iterator[None]:
    """Within the block, a backward reduces the gradients across ranks only when ``sync``.

    A rank's micro-batches accumulate locally; the last one's backward reduces the sum. In the
    world-size invariant mode nothing is reduced by the backend (:func:`add_in_global_order` sums).
    """
    if ctx.world_size_invariant:  # DDP does not wrap the model; FSDP2 does not hold the LoRA weights
        yield
        return
    if ctx.strategy == "ddp":
        with contextlib.nullcontext() if sync else train_module.no_sync():  # type: ignore[operator]
            yield
        return
    train_module.set_requires_gradient_sync(sync)  # type: ignore[operator]
    yield


def local_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    """This rank's part of ``param``'s gradient (the whole gradient under DDP, a shard under FSDP)."""
    grad = param.grad
    if grad is None:
        return None
    to_local = getattr(grad, "to_local", None)
    return to_local() if callable(to_local) else grad


def take_gradients(trainable: list[torch.nn.Parameter]) -> torch.Tensor:
    """This micro-batch's gradients of ``trainable``, flat in parameter order (zeros for one that
    got none), on the collectives' device; the parameters' gradients are cleared for the next."""
    flat = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).detach().reshape(-1) for p in trainable]
    )
    for param in trainable:
        param.grad = None
    return flat


def add_in_global_order(
    ctx: DistContext, trainable: list[torch.nn.Parameter], kept: list[torch.Tensor]
) -> None:
    """Every rank's micro-batch gradients (``kept``: this rank's, by its micro-batches in order)
    all-gathered and added one after another in global micro-batch order, into ``trainable``'s
    gradients on every rank. Rank r holds the block of micro-batches r*K/W ... (r+1)*K/W-1, so the
    ranks' blocks in rank order are the global order; the left fold from the first is what a
    single process's backward accumulates (``grad = g0``, then ``grad += g1``, ...).

    Raises:
        ValueError: the trainable parameters are of mixed dtypes (one flat buffer holds them).
    """
    if len({p.dtype for p in trainable}) > 1:
        raise ValueError("world_size_invariant needs the trainable parameters in one dtype")
    device = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    local = torch.stack(kept).to(device)
    parts = [torch.empty_like(local) for _ in range(ctx.world_size)]
    dist.all_gather(parts, local)
    every = torch.cat(parts)
    total = every[0].clone()
    for k in range(1, every.shape[0]):
        total.add_(every[k])
    total = total.to(trainable[0].device)
    offset = 0
    for param in trainable:
        n = param.numel()
        param.grad = total[offset : offset + n].view_as(param)
        offset += n


def grad_square_sum(trainable: list[torch.nn.Parameter]) -> float:
    """Sum of the squared local gradient elements, in float64, parameter by parameter in order."""
    total = torch.zeros((), dtype=torch.float64)
    for param in trainable:
        grad = local_grad(param)
        if grad is not None:
            total = total + grad.detach().double().pow(2).sum().cpu()
    return float(total)


def scale_grads(trainable: list[torch.nn.Parameter], factor: float) -> None:
    """Multiply every local gradient (or gradient shard) by ``factor``, in place."""
    for param in trainable:
        grad = local_grad(param)
        if grad is not None:
            grad.mul_(factor)


def full_trainable_state(model: torch.nn.Module, ctx: DistContext) -> dict[str, torch.Tensor]:
    """The trainable weights, whole, by parameter name (CPU tensors).

    DDP: this rank's own (every rank holds them whole). FSDP: gathered, a collective every rank
    must call; rank 0 gets the tensors, the others an empty dict.
    """
    if not ctx.trainable_sharded:
        return trainable_tensors(model)
    state: dict[str, Any] = get_model_state_dict(model, options=_FULL_TRAINABLE)
    return state


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's whole state keyed by parameter name (a collective: every rank calls it)."""
    state: dict[str, Any] = get_optimizer_state_dict(model, optimizer, options=_FULL)
    return state


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    weights: dict[str, torch.Tensor] | None,
    optimizer_state: dict[str, Any] | None,
) -> None:
    """Load rank 0's whole trainable weights and optimizer state into every rank (a collective).

    Rank 0 passes what it read from the checkpoint; the others pass None and receive it.
    """
    set_model_state_dict(model, dict(weights or {}), options=_FROM_RANK0)
    set_optimizer_state_dict(model, optimizer, optimizer_state or {}, options=_FROM_RANK0)


def weights_hasher(setup: Setup, ctx: DistContext) -> Callable[[], str]:
    """What a rank's ledger hook hashes after each step: the whole trainable weights'
    :func:`tensors_sha256`. Under DDP rank 0 hashes its own tensors in place (the other ranks hash
    nothing); FSDP gathers them first, a collective every rank calls (rank 0 gets the digest, the
    others "")."""
    if not ctx.trainable_sharded and ctx.is_main:
        return WeightsHasher(trainable_tensors(setup.model))
    if not ctx.trainable_sharded:
        return lambda: ""

    gather = ShardGatherer([(name, p) for name, p in setup.model.named_parameters() if p.requires_grad], ctx)

    def gathered() -> str:
        state = gather()
        return tensors_sha256(state) if ctx.is_main else ""

    return gathered


class ShardGatherer:
    """The whole tensors of FSDP2 parameters sharded on dim 0, gathered with one all-gather.

    Per step this replaces a ``full_tensor()`` per parameter (DTensor dispatch and one collective
    each: about 40 ms a step for the tiny model's 8 LoRA tensors on 2 ranks) or
    ``get_model_state_dict`` (a walk of the whole model: about 100 ms). Every rank's shard sizes are
    exchanged once; each call packs this rank's shards into one flat buffer (padded to the largest
    rank's), all-gathers it, and cuts the whole tensors out in rank order: the same bytes as
    ``full_tensor()``. Parameters of mixed dtypes, or not sharded on dim 0, fall back to
    ``full_tensor()``.
    """

    def __init__(self, named: list[tuple[str, torch.nn.Parameter]], ctx: DistContext) -> None:
        from torch.distributed.tensor import Shard

        self._named, self._ctx = named, ctx
        dtypes = {p.dtype for _, p in named}
        placements_ok = all(tuple(getattr(p, "placements", ())) == (Shard(0),) for _, p in named)
        self._flat = len(dtypes) == 1 and placements_ok and bool(named)
        if not self._flat:
            return
        device = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
        mine = torch.tensor([p.to_local().numel() for _, p in named], dtype=torch.int64, device=device)  # type: ignore[attr-defined]
        sizes = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        dist.all_gather(sizes, mine)
        self._sizes = [size.tolist() for size in sizes]
        self._width = max(sum(size) for size in self._sizes)
        self._dtype, self._device = dtypes.pop(), device

    def __call__(self) -> dict[str, torch.Tensor]:
        """Every parameter's whole tensor, by name, on every rank (a collective)."""
        if not self._flat:
            return {name: p.full_tensor().cpu() for name, p in self._named}  # type: ignore[attr-defined]
        local = [p.to_local().detach().reshape(-1).to(self._device) for _, p in self._named]  # type: ignore[attr-defined]
        flat = torch.zeros(self._width, dtype=self._dtype, device=self._device)
        torch.cat(local, out=flat[: sum(t.numel() for t in local)])
        parts = [torch.empty_like(flat) for _ in range(self._ctx.world_size)]
        dist.all_gather(parts, flat)
        parts = [part.cpu() for part in parts]
        offsets = [0] * self._ctx.world_size
        out = {}
        for i, (name, param) in enumerate(self._named):
            pieces = []
            for rank, part in enumerate(parts):
                n = self._sizes[rank][i]
                pieces.append(part[offsets[rank] : offsets[rank] + n])
                offsets[rank] += n
            out[name] = torch.cat(pieces).reshape(param.shape)
        return out


def adapter_state(setup: Setup) -> dict[str, torch.Tensor] | None:
    """The trainable weights to save as the adapter when the model cannot give them itself: under
    FSDP, gathered (a collective every rank calls; rank 0 gets them). None otherwise."""
    if setup.dist is None or not setup.dist.trainable_sharded:
        return None
    state = full_trainable_state(setup.model, setup.dist)
    return state if setup.dist.is_main else None

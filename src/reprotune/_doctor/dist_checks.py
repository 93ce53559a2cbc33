"""The doctor's checks of a distributed setup (docs/distributed.md): NCCL's tuning variables on
CUDA, and, when the doctor itself runs under ``torchrun``, whether every rank has the same packages
and whether the world size divides the step's micro-batches.

``torchrun --nproc_per_node N -m reprotune doctor CONFIG`` checks the ranks of that launch (every
rank prints the report; ``torchrun --local-ranks-filter 0`` shows rank 0's only).
"""

from __future__ import annotations

import datetime
import socket

from reprotune._doctor.findings import Context
from reprotune._errors import InputError
from reprotune._run.findings import Finding
from reprotune._run.fingerprint import environment_fingerprint
from reprotune._run.ranks import check_ranks_agree
from reprotune._train.distributed import launch_variables

#: NCCL variables that choose how a reduction is cut up and ordered.
NCCL_ORDER_VARS = ("NCCL_ALGO", "NCCL_PROTO")
#: Other NCCL tuning variables that change how data is split into chunks and channels.
NCCL_TUNING_VARS = (
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_NTHREADS",
    "NCCL_BUFFSIZE",
    "NCCL_TREE_THRESHOLD",
)


def check_nccl(ctx: Context) -> list[Finding]:
    """On CUDA (a GPU here): NCCL_ALGO and NCCL_PROTO pinned, other tuning variables noted."""
    if ctx.device != "cuda" or not ctx.device_ok or ctx.cfg.distributed.backend == "gloo":
        return []
    found = []
    unset = [name for name in NCCL_ORDER_VARS if not ctx.env.get(name)]
    if unset:
        found.append(
            Finding(
                "nccl-algo-unpinned",
                "warning",
                f"{' and '.join(unset)} not set: NCCL picks its reduction algorithm and protocol itself",
                "NCCL chooses ring or tree (and LL, LL128 or Simple) per message size, GPU topology and "
                "NCCL version; the same machines give the same choice, but another node count, "
                "topology or NCCL version adds the gradients in another order, so the bits differ",
                "export NCCL_ALGO=Ring NCCL_PROTO=Simple on every node (the record keeps them) and use "
                "the same values for every run you compare",
            )
        )
    tuned = {name: ctx.env[name] for name in (*NCCL_ORDER_VARS, *NCCL_TUNING_VARS) if ctx.env.get(name)}
    if tuned:
        shown = ", ".join(f"{k}={v}" for k, v in tuned.items())
        found.append(
            Finding(
                "nccl-env-set",
                "info",
                f"NCCL tuning in the environment: {shown}",
                "these choose how reductions are split and ordered: runs compared bit for bit need the "
                "same values (the record keeps them)",
                "set the same values on every node and for every run you compare",
            )
        )
    return found


def check_ranks(ctx: Context) -> list[Finding]:
    """Under torchrun: the world size divides the micro-batches, and every rank has the same packages."""
    import torch.distributed as dist

    if not dist.is_torchelastic_launched():
        return []
    world = launch_variables("doctor")[1]  # TORCHELASTIC_RUN_ID alone is no torchrun launch: refused
    found = []
    accum = ctx.cfg.train.grad_accum_steps
    if accum % world:
        found.append(
            Finding(
                "distributed-placement",
                "error",
                f"train.grad_accum_steps {accum} is not a multiple of the world size {world}",
                "each rank trains the same number of the step's micro-batches; the run would be refused",
                f"set train.grad_accum_steps to a multiple of {world}",
            )
        )
    identities = _gather_identities(ctx)
    try:
        check_ranks_agree(identities)
    except InputError as exc:
        found.append(
            Finding(
                "distributed-ranks-differ", "error", exc.message, "the run would be refused", exc.fix or ""
            )
        )
        return found
    hosts = len({identity["host"] for identity in identities})
    found.append(
        Finding(
            "distributed-ranks-agree",
            "info",
            f"{world} ranks on {hosts} host(s) have the same Python and packages",
            "ranks with other packages would compute other numbers; reprotune run checks this again, "
            "with the model, data and LoRA init, before training",
            "nothing to do",
        )
    )
    return found


def _gather_identities(ctx: Context) -> list[dict[str, object]]:
    """Every rank's host, Python and packages, on every rank (a gloo group for the doctor alone)."""
    import torch.distributed as dist

    own = dist.is_initialized()
    if not own:
        timeout = datetime.timedelta(seconds=ctx.cfg.distributed.timeout_s)
        dist.init_process_group("gloo", timeout=timeout)
    try:
        env = environment_fingerprint(ctx.env)
        mine = {
            "rank": dist.get_rank(),
            "host": socket.gethostname(),
            "environment": {"python": env["python"], "distributions": env["distributions"]},
        }
        everyone: list[dict[str, object]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(everyone, mine)
        return everyone
    finally:
        if not own:
            dist.destroy_process_group()

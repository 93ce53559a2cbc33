"""How a rank leaves its process group at the end of a run (``_train.distributed.process_group``),
in this process, at world size 1 on gloo: the DDP model the run leaves behind (in a reference
cycle, as a real one is) is collected before the group is destroyed, on success and after an error,
so that the group's last reference is its Python object, which releases the GIL as it destroys the
group. Left to DDP's reducer, the destruction held the GIL a gloo worker thread may wait for: a
rank hung at exit (tests/distributed/test_torchrun.py shows the launches end with no gloo thread).
"""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from reprotune._config.schema import ExperimentConfig
from reprotune._train.distributed import DistContext, process_group
from reprotune._train.sharding import wrap_model


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """One rank, as torchrun's environment names it, at a free port of this host."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {"TORCHELASTIC_RUN_ID": "leave-test", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    for name, value in {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)


def _gloo_threads() -> int:
    """Threads of gloo in this process (named as they start: count them after a collective)."""
    return sum("gloo" in comm.read_text() for comm in Path("/proc/self/task").glob("*/comm"))


def _train_in_a_cycle(ctx: DistContext) -> list[Any]:
    """A DDP model as a run wraps it, after a step, held only by a reference cycle once this returns."""
    model = wrap_model(torch.nn.Linear(2, 2), ctx)
    assert isinstance(model, DistributedDataParallel)
    model(torch.ones(1, 2)).sum().backward()  # the reducer's all-reduce
    parts = [torch.empty(2)]
    dist.all_gather(parts, torch.ones(2))  # the collective a gloo worker may still be finishing
    box: list[Any] = [model]
    box.append(box)
    return box


def _ddp_models_alive() -> int:
    return sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())


def _destroy_spy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """DDP models still alive at each ``destroy_process_group``, which goes on to run."""
    seen: list[int] = []
    real: Callable[..., None] = dist.destroy_process_group

    def spy(*args: Any, **kwargs: Any) -> None:
        seen.append(_ddp_models_alive())
        real(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", spy)
    return seen


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_the_ddp_model_is_collected_before_the_group_is_destroyed(
    torchrun_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a run that returns, no DDP model is alive when the group is destroyed, and the gloo
    threads are gone when ``process_group`` ends."""
    torch.manual_seed(0)
    before, seen = _gloo_threads(), _destroy_spy(monkeypatch)
    with process_group(ExperimentConfig()) as ctx:
        assert ctx is not None
        _train_in_a_cycle(ctx)
        assert _gloo_threads() > before
        assert _ddp_models_alive() == 1  # unreachable, not yet collected
    assert seen == [0]
    assert not dist.is_initialized() and _gloo_threads() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)")
def test_after_an_error_the_frames_it_passed_through_let_the_model_go(
    torchrun_env: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that raises, holding its DDP model in the raising frame and in the exception it was
    raised from: still no DDP model alive when the group is destroyed, and the error goes on with
    its message and its cause."""

    def fails(ctx: DistContext) -> None:
        box = _train_in_a_cycle(ctx)
        try:
            raise RuntimeError("a peer left")
        except RuntimeError as exc:
            raise ValueError(f"rank 0 stopped with {len(box)} objects") from exc

    before, seen = _gloo_threads(), _destroy_spy(monkeypatch)
    with (
        pytest.raises(ValueError, match="rank 0 stopped") as raised,
        process_group(ExperimentConfig()) as ctx,
    ):
        assert ctx is not None
        fails(ctx)
    assert seen == [0]
    assert str(raised.value.__cause__) == "a peer left"
    assert not dist.is_initialized() and _gloo_threads() == before


def _rank_that_leaves(rank: int, port: int, said: Any) -> None:
    """Rank 1 joins and leaves at once; rank 0 then gathers, as before its first step, under
    what rank 0's run and resume run in (dist_run._saying_a_rank_left)."""
    import datetime

    from reprotune._errors import RunFailedError
    from reprotune._train.dist_run import _saying_a_rank_left

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    if rank == 1:
        os._exit(0)
    ctx = DistContext(0, 2, 0, "ddp", "gloo", torch.device("cpu"), 60.0)
    try:
        with _saying_a_rank_left(ctx):
            dist.all_gather_object([None, None], {"host": "here"})
        said.put("no error")
    except RunFailedError as exc:
        said.put(f"{exc.message} | fix: {exc.fix}")
    except BaseException as exc:
        said.put(f"other: {type(exc).__name__}: {exc}")


def test_rank_0_says_another_rank_left_when_it_goes_before_training() -> None:
    """Rank 0 in a collective before the loop (the ranks' identities), rank 1 gone: the real gloo
    error becomes "another rank left" (before, rank 0 printed gloo's traceback as an internal
    error)."""
    import multiprocessing

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    said = spawn.Queue()
    ranks = [spawn.Process(target=_rank_that_leaves, args=(rank, port, said)) for rank in (0, 1)]
    for process in ranks:
        process.start()
    text = said.get(timeout=120)
    for process in ranks:
        process.join(timeout=60)
    assert text.startswith("rank 0 of 2 stopped: another rank left the run"), text
    assert "torchrun" in text

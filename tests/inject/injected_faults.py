"""Faults injected into reprotune from outside, for the tests that prove a recovery or a check can
fail. Nothing of it is in reprotune: it patches a process's reprotune modules when its environment
asks for a fault, and does nothing otherwise.

- ``REPROTUNE_KILL_AT=<point>:<n>``: SIGKILL the process the n-th time (from 1) it passes
  ``<point>`` (the crash tests, tests/train/test_crash.py). The process that reads it takes it out
  of its environment: a crash test arms the process it starts, not the ones that process starts
  (a study's runs, verify's legs), except for a ``rank<r>/`` point, which is for the ranks a
  torchrun launcher starts. Points: ``step-end`` (after a step's
  hooks up to its checkpoint; under torchrun, rank r also passes ``rank<r>/step-end``),
  ``ledger-append`` (half of a ledger line written: the ledger then writes every line at once),
  ``replace:<file name>`` (an atomic write's temporary file written, not yet renamed over the
  file), ``checkpoint-file`` (after trainable.safetensors, after optimizer.pt, after rng.json,
  after state.json, and after the checkpoint's rename).
- ``REPROTUNE_NOISE_AT_STEP=<n>``: after optimizer step n, add noise drawn from ``os.urandom`` to
  the first trainable weight: a stand-in for a nondeterministic kernel, which ``verify`` must blame
  on the rerun.
- ``REPROTUNE_SKIP_RNG_RESTORE=1``: ``reprotune resume`` forgets the RNG states (a broken resume,
  which ``verify`` must blame on the resume).

:func:`install_from_env` puts them in place. ``sitecustomize.py`` beside this file calls it in every
interpreter that starts with this folder on ``PYTHONPATH`` (tests/conftest.py puts it there for the
whole suite, so the processes reprotune starts itself, verify's legs and torchrun's ranks, inherit
it); the warm zygote (tests/warm.py) calls it in each forked child, after the child's environment is
set.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

KILL_ENV = "REPROTUNE_KILL_AT"
NOISE_ENV = "REPROTUNE_NOISE_AT_STEP"
SKIP_RNG_ENV = "REPROTUNE_SKIP_RNG_RESTORE"

_counts: dict[str, int] = {}
_kill_at = ""
_installed = False


def kill_point(name: str) -> None:
    """SIGKILL this process if ``REPROTUNE_KILL_AT`` named this point and occurrence."""
    point, _, nth = _kill_at.rpartition(":")
    if point != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def install_from_env() -> None:
    """Patch what the environment asks for (once per process); nothing when it asks for nothing."""
    global _installed, _kill_at
    kill, noise, skip = (os.environ.get(name) for name in (KILL_ENV, NOISE_ENV, SKIP_RNG_ENV))
    if _installed or not (kill or noise or skip == "1"):
        return
    _installed = True
    if kill:
        _kill_at = kill
        if not kill.startswith("rank"):
            del os.environ[KILL_ENV]
        _kill_points()
    if kill or noise:
        _after_step(int(noise) if noise else None)
    if skip == "1":
        _skip_rng_restore()


class _Proxy:
    """A module with some of its functions replaced, for one module's calls only."""

    def __init__(self, module: Any, **replaced: Any) -> None:
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)


class _HalfLines:
    """A ledger's file handle that dies, when asked, between the two halves of a line."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def write(self, text: str) -> int:
        half = len(text) // 2
        self._handle.write(text[:half])
        self._handle.flush()
        kill_point("ledger-append")
        return self._handle.write(text[half:]) + half

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def _kill_points() -> None:
    import torch

    from reprotune import _jsonio
    from reprotune._run import checkpoint, ledger

    def replace(src: Any, dst: Any) -> None:
        kill_point(f"replace:{Path(dst).name}")
        os.replace(src, dst)

    def rename(src: Any, dst: Any) -> None:  # publishing_dir putting a directory in place
        os.rename(src, dst)
        if Path(dst).name.startswith(checkpoint._PREFIX) and Path(dst).parent.name == "checkpoints":
            kill_point("checkpoint-file")

    _jsonio.os = _Proxy(os, replace=replace, rename=rename)  # type: ignore[assignment]

    ledger_init = ledger.LedgerWriter.__init__

    def ledger_writer(self: Any, path: Path, *, flush_interval_s: float = 0.5) -> None:
        ledger_init(self, path, flush_interval_s=0.0)  # every line written at once
        self._handle = _HalfLines(self._handle)

    ledger.LedgerWriter.__init__ = ledger_writer  # type: ignore[method-assign]

    save_file, write_json = checkpoint.save_file, checkpoint.write_json_atomic

    def saved(after: str, write: Any) -> Any:
        def call(obj: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            result = write(obj, path, *args, **kwargs)
            if Path(path).name == after:
                kill_point("checkpoint-file")
            return result

        return call

    def json_written(path: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        result = write_json(path, data, *args, **kwargs)
        if Path(path).name in ("rng.json", checkpoint.STATE_FILE):
            kill_point("checkpoint-file")
        return result

    checkpoint.save_file = saved("trainable.safetensors", save_file)
    checkpoint.torch = _Proxy(torch, save=saved("optimizer.pt", torch.save))  # type: ignore[assignment]
    checkpoint.write_json_atomic = json_written


def _after_step(noise_step: int | None) -> None:
    """Kill points and noise at the end of a step, after its checkpoint (where the loop's hooks
    put reprotune's crash point before)."""
    import torch

    from reprotune._train.hooks import CheckpointHook

    on_step_end = CheckpointHook.on_step_end

    def after(self: Any, end: Any) -> Any:
        result = on_step_end(self, end)
        kill_point("step-end")
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            kill_point(f"rank{torch.distributed.get_rank()}/step-end")
        if end.step == noise_step:
            weight = self.setup.trainable[0]
            seed = int.from_bytes(os.urandom(8), "little") & (2**63 - 1)
            noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                weight.add_(noise.to(weight.device, weight.dtype), alpha=1e-3)
        return result

    CheckpointHook.on_step_end = after  # type: ignore[method-assign]


def _skip_rng_restore() -> None:
    import dataclasses

    from reprotune._train import run

    resume_run = run.resume_run

    def forgetful(run_dir: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        return resume_run(run_dir, dataclasses.replace(options, restore_rng_on_resume=False), *args, **kwargs)

    run.resume_run = forgetful

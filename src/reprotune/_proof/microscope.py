"""What ``compare`` points at when two runs part at a kernel: the ``reprotune trace`` commands
to run on each machine, and the kernel facts each record holds. No torch."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reprotune._determinism.isa import BASELINES
from reprotune._errors import InputError
from reprotune._proof.cause_texts import hash_differences
from reprotune._proof.causes import is_traceable_cause
from reprotune._proof.differences import Where
from reprotune._proof.world import world_size
from reprotune._run.kernel_compare import ADDED_LATER, comparable, kernel_differences
from reprotune._run.rundir import RunDir
from reprotune._run.stack import COMPUTING_LIBRARIES


def kernels_of(run: RunDir) -> Mapping[str, Any] | None:
    """The record's kernel facts (``environment.kernels``), or None for a record made before
    reprotune recorded them."""
    kernels = run.section("environment").get("kernels")
    return kernels if isinstance(kernels, Mapping) else None


def computed_on_gpu(run: RunDir) -> bool | None:
    """Whether the run computed on a GPU: by its ranks' devices (torchrun, a Trainer script), else
    by ``determinism.device`` (``auto``: a GPU when the machine had one); None when the record
    does not say."""
    ranks = [r for s in ("distributed", "trainer") for r in run.section(s).get("ranks") or []]
    devices = [str(r["device"]) for r in ranks if isinstance(r, Mapping) and r.get("device")]
    if devices:
        return any(device.startswith("cuda") for device in devices)
    device = (run.section("config").get("determinism") or {}).get("device")
    if device == "auto":  # a GPU when the machine had one: as its kernel facts, or torch, say
        kernels = kernels_of(run)
        available = run.section("environment").get("torch", {}).get("cuda_available")
        return (kernels.get("cuda") is not None) if kernels is not None else available
    if isinstance(device, str) and device.startswith("cuda"):
        return True
    return False if device == "cpu" else None


def compared_kernels(run_a: RunDir, run_b: RunDir) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The two records' kernel facts as ``compare`` weighs them (``kernel_compare.comparable``:
    no GPU facts for a run that computed on the CPU, GPUs by model), a section one record lacks
    (written before it) left out of both: unknown, not different. None for a record without them."""
    out: list[dict[str, Any] | None] = []
    on_gpu = [computed_on_gpu(run) for run in (run_a, run_b)]
    for run, gpu in zip((run_a, run_b), on_gpu, strict=True):
        facts = kernels_of(run)
        out.append(None if facts is None else comparable(facts, on_gpu=gpu))
    held = [f for f in out if f is not None]
    for section in ADDED_LATER:
        if any(section not in f for f in held):
            for f in held:
                f.pop(section, None)
    if False in on_gpu:  # cuDNN's flags chose no kernel of a run on the CPU: not weighed on either side
        for f in held:
            if isinstance(f.get("algorithms"), Mapping):
                f["algorithms"] = {k: v for k, v in f["algorithms"].items() if not k.startswith("cudnn_")}
    return out[0], out[1]


def _machine(run: RunDir) -> str:
    """The CPU (and GPU) a run's record names, for people."""
    for cpu in ((kernels_of(run) or {}).get("cpu"), run.section("environment").get("cpu")):
        if isinstance(cpu, Mapping) and cpu.get("model"):
            return str(cpu["model"])
    return "its CPU is not recorded"


def _differing_libraries(run_a: RunDir, run_b: RunDir) -> dict[str, list[tuple[str, str]]]:
    """Label -> (name, version) of each of ``COMPUTING_LIBRARIES`` whose version the two records
    give otherwise (empty when none does); a library one side lacks is "absent" there."""
    installed = {
        label: run.section("environment").get("distributions") or {}
        for label, run in (("A", run_a), ("B", run_b))
    }
    names = [n for n in COMPUTING_LIBRARIES if installed["A"].get(n) != installed["B"].get(n)]
    if not names:
        return {}
    return {label: [(n, str(found.get(n) or "absent")) for n in names] for label, found in installed.items()}


def steering_assignments(
    kernels: Mapping[str, Any] | None, here: Mapping[str, Any] | None = None
) -> list[str]:
    """``VAR=value`` for each kernel-steering variable the record holds set (``here``: only those
    whose value differs there, and ``-u VAR`` for one set there but not in the record), the ones a
    ``determinism.cpu_isa`` mode sets left out: ``reprotune trace`` pins those itself."""
    recorded = (kernels or {}).get("steering_env")
    if not isinstance(recorded, Mapping):
        return []
    mode = BASELINES.get(str(((kernels or {}).get("portable") or {}).get("cpu_isa")))
    pinned = set(mode.env) if mode is not None else set()
    current = (here or {}).get("steering_env") if here is not None else None
    found = []
    for name, value in recorded.items():
        if name in pinned:
            continue
        if isinstance(current, Mapping) and current.get(name) == value:
            continue
        if value is not None:
            found.append(f"{name}={shlex.quote(str(value))}")
        elif isinstance(current, Mapping) and current.get(name) is not None:
            found.append(f"-u {name}")
    return found


def kernels_against_run(run: RunDir, here: Mapping[str, Any]) -> dict[str, list[str]] | None:
    """How this environment's kernel facts differ from those the run recorded (``differences``,
    run's first, as ``kernel_differences`` words them) and the variables to set so that the
    steering ones agree (``assignments``); None for a record without kernel facts."""
    recorded = kernels_of(run)
    if recorded is None:
        return None
    on_gpu = computed_on_gpu(run)  # the replay computes where the run did
    return {
        "differences": kernel_differences(
            comparable(recorded, on_gpu=on_gpu), comparable(here, on_gpu=on_gpu)
        ),
        "assignments": steering_assignments(recorded, here),
    }


#: What identifies a base model's files in a record's ``model`` section, each hashed.
_MODEL_FILES = ("weights_files", "tokenizer_files", "config_files")


def model_against_run(run: RunDir, here: Mapping[str, Any]) -> list[str]:
    """How the base model loaded here (``here``: a ``model`` section, as a record holds it) differs
    from the one the run recorded: each file (``config.json 8e7955e0774d vs f61ad784cafc``, run's
    first) and each buffer (``model.rotary_emb.inv_freq ...``: the same files read otherwise),
    compared where both hold them; empty when they agree."""
    recorded = run.section("model")
    found = []
    for section in (*_MODEL_FILES, "buffers"):
        theirs, ours = recorded.get(section), here.get(section)
        if not isinstance(theirs, Mapping) or not isinstance(ours, Mapping):
            continue
        found += hash_differences(theirs, ours)
    return found


def trace_command(
    run_dir: str,
    step: object,
    assignments: Sequence[str] = (),
    out: str | None = None,
    *,
    command: str | None = None,
) -> str:
    """``[env -u X] VAR=value reprotune trace RUN_DIR --step K [--command CMD] [--out FILE]``,
    quoted for a shell (``command``: the script that made a Trainer-made run)."""
    unset = [a for a in assignments if a.startswith("-u ")]  # env reads its options before any VAR=value
    ordered = [*unset, *(a for a in assignments if not a.startswith("-u "))]
    env = ("env " if unset else "") + "".join(f"{a} " for a in ordered)
    tail = (f" --command {shlex.quote(command)}" if command else "") + (
        f" --out {shlex.quote(out)}" if out else ""
    )
    return f"{env}reprotune trace {shlex.quote(run_dir)} --step {step}{tail}"


def made_by_trainer(run: RunDir) -> bool:
    """Whether a Trainer callback wrote the run (``reprotune trace`` then runs its script)."""
    return "trainer" in run.section("config")


def untraceable(run: RunDir) -> tuple[str, str] | None:
    """Why ``reprotune trace`` cannot trace ``run``, and what to do instead; None when it can."""
    world = world_size(run)
    trainer = made_by_trainer(run)
    if world == 1 and (trainer or not run.section("distributed")):
        return None
    if trainer:
        return (f"it trained on {world} processes; a trace follows one", "run the script on one process")
    how = f"on {world} processes" if world > 1 else "under torchrun (one process)"
    return (
        f"it trained {how}, its dropout seeded per micro-batch; a trace replays a run made without torchrun",
        "run its config in one process without torchrun (`reprotune run CONFIG`) and trace that run's step",
    )


def refuse_untraceable(run: RunDir, step: int, *, command: bool) -> None:
    """Refuse a trace of ``step`` of ``run`` that cannot be made: a Trainer-made run without
    ``--command`` (its script must run) or another run with it, a run on several processes, a step
    the run does not hold (step 0, the LoRA init, only for a run ``reprotune run`` made).

    Raises:
        InputError: naming the run or the step, and what to do instead.
    """
    trainer = made_by_trainer(run)
    quoted = shlex.quote(str(run.path))
    if trainer and not command:
        raise InputError(
            f"{run.path} was written by a Trainer callback: reprotune traces its step by running the "
            "script that made it",
            source=str(run.layout.record),
            fix=f'reprotune trace {quoted} --step {step} --command "python train.py ..." (that command)',
        )
    if command and not trainer:
        raise InputError(
            f"{run.path} was made by `reprotune run`: trace replays it without --command",
            source="--command",
            fix=f"reprotune trace {quoted} --step {step}",
        )
    refused = untraceable(run)
    if refused is not None:
        raise InputError(f"{run.path}: {refused[0]}", source=str(run.layout.record), fix=refused[1])
    steps, first = len(run.ledger.train), 1 if trainer else 0
    if not first <= step <= steps:
        init = (
            "a Trainer script's LoRA init is its own code, before the Trainer, and is not traced"
            if trainer
            else "step 0 is the LoRA init"
        )
        raise InputError(
            f"step {step} is not a step of this run (its ledger holds steps 1 to {steps}; {init})",
            source="--step",
            fix=f"choose a step from {first} to {steps}; `reprotune compare` names the first that differs",
        )


def trace_refusals(run_a: RunDir, run_b: RunDir, step: int) -> list[str]:
    """Why ``reprotune trace`` cannot show step ``step`` of these two runs (empty when it can): a
    run on several processes, or a Trainer-made run's step 0 (its LoRA init is the script's code)."""
    found = [
        f"reprotune trace cannot replay run {label}: {reason[0]}; {reason[1]}"
        for label, run in (("A", run_a), ("B", run_b))
        if (reason := untraceable(run)) is not None
    ]
    if step == 0 and any(made_by_trainer(run) for run in (run_a, run_b)):
        found.append(
            "the runs part at their initial LoRA weights (step 0), which a Trainer script makes in its "
            "own code before the Trainer: reprotune trace follows the Trainer's optimizer steps, not "
            "that code; the kernel facts above are what differs"
        )
    return found


def _first_training_part(run_a: RunDir, run_b: RunDir) -> int | None:
    """The first step whose training line differs between the runs (0: their init lines), or None
    when every line both hold agrees."""
    init_a, init_b = run_a.ledger.init, run_b.ledger.init
    if init_a is not None and init_b is not None and init_a.fields != init_b.fields:
        return 0
    for ea, eb in zip(run_a.ledger.train, run_b.ledger.train, strict=False):
        if ea.fields != eb.fields:
            return ea.step
    return None


def trace_commands(run_a: RunDir, run_b: RunDir, where: Where, causes: Sequence[str]) -> Iterable[str]:
    """The ``reprotune trace`` commands to run on each machine, when the runs part at a step whose
    cause is a kernel, a kernel fact nobody recorded, or nondeterminism (see ``_proof.causes``):
    each under the kernel-steering variables its run was made with, paths quoted for a shell (step
    0, the LoRA init, included). For a run trace cannot replay, why and what to do instead. Where
    the runs part first in a validation pass, which a trace does not replay, it says so, and the
    commands trace the first training step where they part, if any."""
    step = where.first_divergence_step
    if step is None or step < 0 or not causes or not any(is_traceable_cause(c) for c in causes[:1]):
        return
    training = _first_training_part(run_a, run_b)
    if training is None or training > step:
        yield (
            f"the runs part first in the validation after step {step}, their training steps agreeing "
            "through it: `reprotune trace` replays an optimizer step, not a validation pass"
            + (f"; their training parts at step {training}, traced here:" if training is not None else "")
        )
        if training is None:
            return
        step = training
    refusals = trace_refusals(run_a, run_b, step)
    if refusals:
        yield from refusals
        return
    stacks = _differing_libraries(run_a, run_b)
    for label, run in (("A", run_a), ("B", run_b)):
        if stacks:  # two environments, perhaps on one machine: say which libraries trace there
            versions = ", ".join(f"{name} {version}" for name, version in stacks[label])
            yield f"in {label}'s environment ({_machine(run)}; {versions}):"
        else:
            yield f"on {label}'s machine ({_machine(run)}):"
        assignments = steering_assignments(kernels_of(run))
        script = f"<the command that made run {label}>" if made_by_trainer(run) else None
        out = f"{label}-step-{step}.trace.jsonl"
        yield f"  {trace_command(str(run.path), step, assignments, out, command=script)}"
    yield "then, with both files in one place:"
    yield f"  reprotune compare A-step-{step}.trace.jsonl B-step-{step}.trace.jsonl"

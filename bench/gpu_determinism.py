"""On a CUDA machine: are twin runs bitwise identical under determinism strict and off, and what
does strict cost?

One command, under 10 minutes on one GPU:

    .venv/bin/python bench/gpu_determinism.py [--steps 40] [--out DIR]

For each mode (strict, off) it runs the quickstart experiment (SmolLM2-135M-Instruct, LoRA r=8)
twice on CUDA, each in a fresh process, compares the twins with ``reprotune compare`` and reads
each run's median step time from its record (``timings.step_time_s_median``; the mean, which step
1's CUDA set-up and the last step's validation pull up, is kept beside it). The step-time ratios
(``strict_over_off_step_time``, ``nccl.over_plain_strict_step_time``) are of those medians, each
side the mean of its twins' medians (``step_time_ratios_of`` in the JSON says so).

Then (``--nccl``, on by default) the same strict run twice under ``torchrun`` with the NCCL
backend (``NCCL_ALGO=Ring NCCL_PROTO=Simple``), on as many GPUs as there are, up to 2 (1 GPU: one
rank, the distributed code path with NCCL but nothing to reduce across), compared the same way,
and its step time against the plain strict run's. Then the
microscope (docs/microscope.md) on the GPU: ``reprotune trace`` of step 1 of both strict twins
(their traces must be IDENTICAL), and of the first step where the strict run and the off run part,
each traced under its own mode, compared to name the first op that differs.

As each phase ends it prints one line (flushed) and rewrites ``gpu_determinism.json`` (atomically),
so a run stopped by a timeout keeps every phase it finished (SIGTERM or SIGHUP: the command in
flight is killed, ``stopped`` is recorded, exit 128 + the signal). A command that fails (a run, a
trace, a ``compare`` exiting 2 with no JSON report) is recorded as that phase's ``error`` with the
tail of its stderr, and the phases that do not need it go on. At the end it prints the whole JSON
(the traces are beside it). Exit 0 when strict twins (and NCCL twins, and the strict twins'
traces) are IDENTICAL; 1 otherwise; 2 when there is no CUDA device.

``--device cpu`` rehearses the script on a machine without a GPU (the same runs, traces and
comparisons on the CPU; the torchrun twins with gloo at 2 ranks), so that its plumbing is checked
before a GPU is lent. On a CPU strict and off compute alike, so there the off runs also take
``determinism.cpu_isa=avx2-compatible`` (recorded as ``off.cpu_isa``) to part from strict where the
kernels differ; the step-time ratios of a rehearsal mean nothing:

    .venv/bin/python bench/gpu_determinism.py --device cpu --steps 3 --out /tmp/rehearsal

``--random-weights-from DIR`` replaces the base model by one of the same architecture with seeded
random weights, built from ``DIR``'s ``config.json`` and tokenizer files (the converted builtin
model's folder holds both): a machine that cannot be sent the 98 MB GGUF (a device call carries
64 MiB) still runs the same shapes and kernels. The weights change the numbers, not which kernels
compute them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

#: How the step-time ratios are taken, as the JSON says beside them.
RATIO_STATISTIC = (
    "each run's median step time (record timings.step_time_s_median), averaged over the twins; unlike "
    "the mean, the median is not pulled up by step 1 (CUDA set-up) or the last step (validation)"
)


def _in_its_group(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a process group of its own, its output captured; when this script is
    stopped (SIGTERM from ``timeout``, Ctrl-C), the group gets SIGTERM, then SIGKILL 20 s later:
    torchrun passes the SIGTERM on to its ranks, which torch starts in sessions of their own, so
    killing torchrun alone would leave them running on the GPU."""
    proc = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate()
    except BaseException:
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=grace)
                break
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _reprotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    return _in_its_group([sys.executable, "-m", "reprotune", *args], cwd, env)


def _torchrun(nproc: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    return _in_its_group([*command, "-m", "reprotune", *args], cwd, env)


def _failed(what: str, done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """A step that failed, as the JSON records it: its exit status and the tail of its stderr."""
    return {"error": f"{what} failed with exit {done.returncode}", "stderr_tail": done.stderr[-2000:]}


def _compare(a: Path | str, b: Path | str, out: Path) -> dict[str, Any]:
    """``reprotune compare A B --json``: its report (exit 0, identical; 1, they differ), or an
    ``error`` with the tail of its stderr when it exits otherwise or prints no JSON report."""
    done = _reprotune("compare", str(a), str(b), "--json", cwd=out)
    if done.returncode in (0, 1):
        try:
            found = json.loads(done.stdout)
        except ValueError:
            found = None
        if isinstance(found, dict) and "verdict" in found:
            return found
    failure = _failed(f"compare {Path(a).name} {Path(b).name}", done)
    if done.returncode in (0, 1):
        failure["error"] = (
            f"compare {Path(a).name} {Path(b).name} exited {done.returncode} with no JSON report"
        )
    return failure


def _step_times(run_dir: Path) -> dict[str, Any]:
    """The median and mean step time of a finished run, from its record."""
    timings = json.loads((run_dir / "record.json").read_text(encoding="utf-8"))["timings"]
    return {"median": timings["step_time_s_median"], "mean": timings["step_time_s_mean"]}


def _twins(
    out: Path, name: str, launch: Callable[[Path], subprocess.CompletedProcess[str]], what: str
) -> dict[str, Any]:
    """Runs ``NAME-a`` and ``NAME-b`` (``launch(run_dir)`` each), compared: the verdict, the first
    divergent step, and each run's median and mean step time; an ``error`` (with stderr's tail)
    where a launch, a record or the comparison failed, beside what was measured before it."""
    medians: list[float] = []
    means: list[float] = []
    section: dict[str, Any] = {"step_time_s_median": medians, "step_time_s_mean": means}
    for twin in ("a", "b"):
        run_dir = out / f"{name}-{twin}"
        done = launch(run_dir)
        (out / f"{name}-{twin}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr, flush=True)
            return {**section, **_failed(what, done)}
        try:
            times = _step_times(run_dir)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return {**section, "error": f"{run_dir.name}'s record has no step times: {exc!r}"}
        medians.append(times["median"])
        means.append(times["mean"])
    verdict = _compare(out / f"{name}-a", out / f"{name}-b", out)
    if "error" in verdict:
        return {**section, **verdict}
    where = verdict.get("where") or {}
    return {
        **section,
        "verdict": verdict["verdict"],
        "first_divergence_step": where.get("first_divergence_step"),
    }


def mode_twins(out: Path, config: Path, mode: str, common: list[str]) -> dict[str, Any]:
    """Two runs of ``config`` in determinism ``mode``, each in a fresh process, compared; their
    step times."""

    def launch(run_dir: Path) -> subprocess.CompletedProcess[str]:
        return _reprotune(
            "run",
            str(config),
            "--run-dir",
            str(run_dir),
            "--set",
            f"determinism.mode={mode}",
            *common,
            cwd=out,
        )

    return _twins(out, mode, launch, "run")


def nccl_twins(
    out: Path, config: Path, common: list[str], world: int, backend: str = "nccl"
) -> dict[str, Any]:
    """Two strict torchrun launches at ``world`` ranks with ``backend`` (NCCL; gloo in the
    rehearsal on a CPU), compared; their step times."""

    def launch(run_dir: Path) -> subprocess.CompletedProcess[str]:
        return _torchrun(
            world,
            "run",
            str(config),
            "--run-dir",
            str(run_dir),
            "--set",
            "determinism.mode=strict",
            "--set",
            f"distributed.backend={backend}",
            "--set",
            f"train.grad_accum_steps={world}",
            *common,
            cwd=out,
        )

    return {"world_size": world, "backend": backend, **_twins(out, "nccl", launch, "torchrun")}


def _trace(run_dir: Path, step: int, out: Path) -> dict[str, Any]:
    """``reprotune trace`` of one step of a run; its header's verdict and the time it took."""
    target = out / f"{run_dir.name}-step-{step}.trace.jsonl"
    done = _reprotune(
        "trace", str(run_dir), "--step", str(step), "--out", str(target), "--no-progress", cwd=out
    )
    (out / f"trace-{run_dir.name}-{step}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return _failed("trace", done)
    try:
        header = json.loads(target.read_text(encoding="utf-8").split("\n", 1)[0])
        return {"file": str(target), "reproduced": header["reproduced"]["step"], "ops": header["ops"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"error": f"{target.name} has no readable header: {exc!r}"}


def _compare_traces(a: dict[str, Any], b: dict[str, Any], out: Path) -> dict[str, Any]:
    if "error" in a or "error" in b:
        return {"error": a.get("error") or b.get("error")}
    found = _compare(a["file"], b["file"], out)
    if "error" in found:
        return found
    return {
        "verdict": found["verdict"],
        "finding": found.get("finding"),
        "explanation": found.get("explanation"),
    }


def microscope(
    out: Path, results: dict[str, Any], done: Callable[[str, dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Traces of step 1 of the strict twins, and of the first step where strict and off part; each
    part put in ``results["microscope"]`` and handed to ``done`` as it ends."""
    section: dict[str, Any] = results.setdefault("microscope", {})
    made: dict[tuple[str, int], dict[str, Any]] = {}

    def trace(name: str, step: int) -> dict[str, Any]:  # a step traced once (a trace never overwrites)
        if (name, step) not in made:
            made[name, step] = _trace(out / name, step, out)
        return made[name, step]

    def part(name: str, found: dict[str, Any]) -> None:
        section[name] = found
        if done is not None:
            done(f"microscope {name}", found)

    if "verdict" in results.get("strict", {}):
        twins = [trace(f"strict-{t}", 1) for t in ("a", "b")]
        part("strict_twins_step_1", {"traces": twins, **_compare_traces(twins[0], twins[1], out)})
    if "verdict" in results.get("strict", {}) and "verdict" in results.get("off", {}):
        parted = _compare(out / "strict-a", out / "off-a", out)
        step = None if "error" in parted else (parted.get("where") or {}).get("first_divergence_step")
        if "error" in parted:
            part("strict_vs_off", {"step": None, **parted})
        elif step:
            pair = [trace("strict-a", int(step)), trace("off-a", int(step))]
            part("strict_vs_off", {"step": step, "traces": pair, **_compare_traces(pair[0], pair[1], out)})
        else:
            part("strict_vs_off", {"step": None, "note": "strict and off runs did not part"})
    return section


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """``a``'s twins' median step time over ``b``'s (each the twins' mean of their medians); None
    unless both twins of both measured one."""
    ta, tb = a.get("step_time_s_median"), b.get("step_time_s_median")
    if not (isinstance(ta, list) and isinstance(tb, list) and len(ta) == len(tb) == 2):
        return None
    if not all(isinstance(t, int | float) and t > 0 for t in [*ta, *tb]):
        return None
    return (sum(ta) / len(ta)) / (sum(tb) / len(tb))


def write_results(path: Path, results: dict[str, Any]) -> None:
    """``results`` as JSON at ``path``, atomically (a kill between phases leaves the last whole file)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(results, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(partial, path)


def summary(section: dict[str, Any]) -> str:
    """One line on a phase: its verdict (or error) and its median step times."""
    said = [str(section["verdict"])] if "verdict" in section else []
    if "error" in section:
        said.append(f"ERROR {section['error']}")
    if section.get("step") is not None:
        said.append(f"first divergent step {section['step']}")
    if "note" in section:
        said.append(str(section["note"]))
    times = section.get("step_time_s_median")
    if times:
        said.append("median step " + " / ".join(f"{t:.4f} s" for t in times if isinstance(t, int | float)))
    return ", ".join(said) or "done"


class Stopped(Exception):
    """The script was sent a signal to stop (``timeout`` sends SIGTERM)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: FrameType | None) -> None:
    raise Stopped(signum)  # _in_its_group then stops the command's whole process group


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def random_weights_model(files: Path, target: Path) -> Path:
    """A model directory at ``target``: ``files``' config with seeded random weights, and its
    tokenizer files."""
    import shutil

    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(files)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(target)
    for name in TOKENIZER_FILES:
        if (files / name).is_file():
            shutil.copyfile(files / name, target / name)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--no-nccl", dest="nccl", action="store_false", help="skip the torchrun/NCCL twins")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-determinism")))
    parser.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: rehearse the script without a GPU"
    )
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "quickstart.yaml")
    parser.add_argument(
        "--random-weights-from",
        type=Path,
        metavar="DIR",
        help="a model folder (config.json, tokenizer files): run its architecture with seeded random weights",
    )
    args = parser.parse_args()
    config = args.config.resolve()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU machine, or rehearse it with --device cpu", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    common = [
        "--no-progress",
        "--no-tracking",
        "--set",
        f"determinism.device={args.device}",
        "--set",
        f"train.max_steps={args.steps}",
        "--set",
        "train.save_every=0",
        "--set",
        f"train.eval_every={args.steps}",
    ]
    if args.random_weights_from:
        model = random_weights_model(args.random_weights_from.resolve(), args.out.resolve() / "model")
        common += ["--set", f"model.name={model}"]
    results: dict[str, Any] = {"step_time_ratios_of": RATIO_STATISTIC}
    path = args.out / "gpu_determinism.json"
    write_results(path, results)  # none of an earlier run's results left to be taken for this one's
    started = time.perf_counter()

    def done(phase: str, section: dict[str, Any]) -> None:
        """A phase ended: one line said (flushed), and every result so far written."""
        write_results(path, results)
        print(f"[{time.perf_counter() - started:7.1f} s] {phase}: {summary(section)}", flush=True)

    handlers = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        run_phases(args, config, common, results, done)
    except (Stopped, KeyboardInterrupt) as stop:
        name = stop.args[0] if isinstance(stop, Stopped) else "SIGINT"
        results["stopped"] = {"by": name, "after_s": round(time.perf_counter() - started, 1)}
        write_results(path, results)
        print(f"stopped by {name}: the phases done so far are in {path}", file=sys.stderr, flush=True)
        return 128 + (stop.signum if isinstance(stop, Stopped) else signal.SIGINT)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    print(json.dumps(results, indent=1, sort_keys=True, default=str))
    nccl_ok = not args.nccl or results.get("nccl", {}).get("verdict") == "IDENTICAL"
    traces = results["microscope"].get("strict_twins_step_1", {})
    traces_ok = isinstance(traces, dict) and traces.get("verdict") == "IDENTICAL"
    return 0 if results.get("strict", {}).get("verdict") == "IDENTICAL" and nccl_ok and traces_ok else 1


def run_phases(
    args: argparse.Namespace,
    config: Path,
    common: list[str],
    results: dict[str, Any],
    done: Callable[[str, dict[str, Any]], None],
) -> None:
    """The twins per mode, the torchrun twins, the microscope: each phase's result put in
    ``results`` and handed to ``done`` as it ends; a ratio as soon as both its sides are there."""
    import torch

    # On a CPU strict and off compute alike (at 1 thread or 2 too); the rehearsal runs off in the
    # portable CPU mode, other kernels, so that the two part and the branch that traces their first
    # divergent step (each run's trace under its own mode) runs.
    parting = ["--set", "determinism.cpu_isa=avx2-compatible"] if args.device == "cpu" else []
    for mode in ("strict", "off"):
        extra = parting if mode == "off" else []
        results[mode] = mode_twins(args.out, config, mode, [*extra, *common])
        if extra and "verdict" in results[mode]:
            results[mode]["cpu_isa"] = "avx2-compatible"
        if args.device == "cuda" and "verdict" in results[mode]:
            results[mode]["gpu"] = torch.cuda.get_device_name(0)
        done(f"{mode} twins", results[mode])
    ratio = _ratio(results["strict"], results["off"])
    if ratio is not None:
        results["strict_over_off_step_time"] = {"ratio": ratio, "of": "step_time_s_median"}
        write_results(args.out / "gpu_determinism.json", results)
    if args.nccl:
        if args.device == "cuda":
            results["nccl"] = nccl_twins(args.out, config, common, min(2, torch.cuda.device_count()))
        else:
            results["nccl"] = nccl_twins(args.out, config, common, 2, backend="gloo")
        ratio = _ratio(results["nccl"], results["strict"])
        if ratio is not None:
            results["nccl"]["over_plain_strict_step_time"] = ratio
        done(f"torchrun twins ({results['nccl']['backend']})", results["nccl"])
    microscope(args.out, results, done)
    done("all phases", {})


if __name__ == "__main__":
    sys.exit(main())

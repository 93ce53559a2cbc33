"""On a CUDA machine: are twin runs bitwise identical under determinism strict and off, and what
does strict cost?

One command, under 10 minutes on one GPU:

    .venv/bin/python bench/gpu_determinism.py [--steps 40] [--out DIR]

For each mode (strict, off) it runs the quickstart experiment (SmolLM2-135M-Instruct, LoRA r=8)
twice on CUDA, each in a fresh process, compares the twins with ``reprotune compare`` and reads
the mean step time from the records. Then (``--nccl``, on by default) the same strict run twice
under ``torchrun`` with the NCCL backend (``NCCL_ALGO=Ring NCCL_PROTO=Simple``), on as many GPUs as
there are, up to 2 (1 GPU: one rank, the distributed code path with NCCL but nothing to reduce
across), compared the same way, and its step time against the plain strict run's. Then the
microscope (docs/microscope.md) on the GPU: ``reprotune trace`` of step 1 of both strict twins
(their traces must be IDENTICAL), and of the first step where the strict run and the off run part,
each traced under its own mode, compared to name the first op that differs. Prints a table and
writes ``gpu_determinism.json`` (and the traces). Exit 0 when strict twins (and NCCL twins, and
the strict twins' traces) are IDENTICAL; 1 otherwise; 2 when there is no CUDA device.

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
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _reprotune(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "reprotune", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def _torchrun(nproc: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "HF_HUB_OFFLINE": "1",
        "NCCL_ALGO": "Ring",
        "NCCL_PROTO": "Simple",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    return subprocess.run(
        [*command, "-m", "reprotune", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def mode_twins(out: Path, config: Path, mode: str, common: list[str]) -> dict[str, object]:
    """Two runs of ``config`` in determinism ``mode``, each in a fresh process, compared; their
    step times."""
    times = []
    for twin in ("a", "b"):
        run_dir = out / f"{mode}-{twin}"
        done = _reprotune(
            "run",
            str(config),
            "--run-dir",
            str(run_dir),
            "--set",
            f"determinism.mode={mode}",
            *common,
            cwd=out,
        )
        (out / f"{mode}-{twin}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return {"error": f"run failed with exit {done.returncode}"}
        times.append(json.loads((run_dir / "record.json").read_text())["timings"]["step_time_s_mean"])
    cmp = _reprotune("compare", str(out / f"{mode}-a"), str(out / f"{mode}-b"), "--json", cwd=out)
    verdict = json.loads(cmp.stdout)
    return {
        "verdict": verdict["verdict"],
        "first_divergence_step": verdict["where"].get("first_divergence_step"),
        "step_time_s_mean": times,
    }


def nccl_twins(
    out: Path, config: Path, common: list[str], world: int, backend: str = "nccl"
) -> dict[str, object]:
    """Two strict torchrun launches at ``world`` ranks with ``backend`` (NCCL; gloo in the
    rehearsal on a CPU), compared; their step times."""
    times = []
    for twin in ("a", "b"):
        run_dir = out / f"nccl-{twin}"
        done = _torchrun(
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
        (out / f"nccl-{twin}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
            return {
                "error": f"torchrun failed with exit {done.returncode}",
                "world_size": world,
                "backend": backend,
            }
        times.append(json.loads((run_dir / "record.json").read_text())["timings"]["step_time_s_mean"])
    cmp = _reprotune("compare", str(out / "nccl-a"), str(out / "nccl-b"), "--json", cwd=out)
    verdict = json.loads(cmp.stdout)
    return {
        "world_size": world,
        "backend": backend,
        "verdict": verdict["verdict"],
        "first_divergence_step": verdict["where"].get("first_divergence_step"),
        "step_time_s_mean": times,
    }


def _trace(run_dir: Path, step: int, out: Path) -> dict[str, object]:
    """``reprotune trace`` of one step of a run; its header's verdict and the time it took."""
    target = out / f"{run_dir.name}-step-{step}.trace.jsonl"
    done = _reprotune(
        "trace", str(run_dir), "--step", str(step), "--out", str(target), "--no-progress", cwd=out
    )
    (out / f"trace-{run_dir.name}-{step}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"error": f"trace failed with exit {done.returncode}: {done.stderr[-500:]}"}
    header = json.loads(target.read_text(encoding="utf-8").split("\n", 1)[0])
    return {"file": str(target), "reproduced": header["reproduced"]["step"], "ops": header["ops"]}


def _compare_traces(a: dict[str, object], b: dict[str, object], out: Path) -> dict[str, object]:
    if "error" in a or "error" in b:
        return {"error": a.get("error") or b.get("error")}
    cmp = _reprotune("compare", str(a["file"]), str(b["file"]), "--json", cwd=out)
    found = json.loads(cmp.stdout)
    return {"verdict": found["verdict"], "finding": found["finding"], "explanation": found["explanation"]}


def microscope(out: Path, results: dict[str, dict[str, object]]) -> dict[str, object]:
    """Traces of step 1 of the strict twins, and of the first step where strict and off part."""
    section: dict[str, object] = {}
    made: dict[tuple[str, int], dict[str, object]] = {}

    def trace(name: str, step: int) -> dict[str, object]:  # a step traced once (a trace never overwrites)
        if (name, step) not in made:
            made[name, step] = _trace(out / name, step, out)
        return made[name, step]

    if "verdict" in results.get("strict", {}):
        twins = [trace(f"strict-{t}", 1) for t in ("a", "b")]
        section["strict_twins_step_1"] = {"traces": twins, **_compare_traces(*twins, out)}
    if "verdict" in results.get("strict", {}) and "verdict" in results.get("off", {}):
        cmp = _reprotune("compare", str(out / "strict-a"), str(out / "off-a"), "--json", cwd=out)
        step = json.loads(cmp.stdout)["where"].get("first_divergence_step")
        if step:
            pair = [trace("strict-a", int(step)), trace("off-a", int(step))]
            section["strict_vs_off"] = {"step": step, "traces": pair, **_compare_traces(*pair, out)}
        else:
            section["strict_vs_off"] = {"step": None, "note": "strict and off runs did not part"}
    return section


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
    results: dict[str, dict[str, object]] = {}
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
    if args.nccl:
        if args.device == "cuda":
            results["nccl"] = nccl_twins(args.out, config, common, min(2, torch.cuda.device_count()))
        else:
            results["nccl"] = nccl_twins(args.out, config, common, 2, backend="gloo")
        nccl_t, plain_t = (
            results["nccl"].get("step_time_s_mean"),
            results.get("strict", {}).get("step_time_s_mean"),
        )
        if isinstance(nccl_t, list) and isinstance(plain_t, list):
            results["nccl"]["over_plain_strict_step_time"] = (sum(nccl_t) / len(nccl_t)) / (
                sum(plain_t) / len(plain_t)
            )
    results["microscope"] = microscope(args.out, results)
    strict_t = results.get("strict", {}).get("step_time_s_mean")
    off_t = results.get("off", {}).get("step_time_s_mean")
    if isinstance(strict_t, list) and isinstance(off_t, list):
        results["strict_over_off_step_time"] = {
            "ratio": (sum(strict_t) / len(strict_t)) / (sum(off_t) / len(off_t))
        }
    (args.out / "gpu_determinism.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(results, indent=1, sort_keys=True))
    nccl_ok = not args.nccl or results.get("nccl", {}).get("verdict") == "IDENTICAL"
    traces = results["microscope"].get("strict_twins_step_1", {})
    traces_ok = isinstance(traces, dict) and traces.get("verdict") == "IDENTICAL"
    return 0 if results.get("strict", {}).get("verdict") == "IDENTICAL" and nccl_ok and traces_ok else 1


if __name__ == "__main__":
    sys.exit(main())

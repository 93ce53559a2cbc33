"""On a CUDA machine: are twin runs bitwise identical under determinism strict and off, and what
does strict cost?

One command, under 10 minutes on one GPU:

    .venv/bin/python bench/gpu_determinism.py [--steps 40] [--out DIR]

For each mode (strict, off) it runs the quickstart experiment (SmolLM2-135M-Instruct, LoRA r=8)
twice on CUDA, each in a fresh process, compares the twins with ``reprotune compare`` and reads
the mean step time from the records. Then (``--nccl``, on by default) the same strict run twice
under ``torchrun`` with the NCCL backend (``NCCL_ALGO=Ring NCCL_PROTO=Simple``), on as many GPUs as
there are, up to 2 (1 GPU: one rank, the distributed code path with NCCL but nothing to reduce
across), compared the same way, and its step time against the plain strict run's. Prints a table
and writes ``gpu_determinism.json``. Exit 0 when strict twins (and NCCL twins) are IDENTICAL; 1
otherwise; 2 when there is no CUDA device.
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


def nccl_twins(out: Path, common: list[str], world: int) -> dict[str, object]:
    """Two strict NCCL launches at ``world`` ranks, compared; their step times."""
    times = []
    for twin in ("a", "b"):
        run_dir = out / f"nccl-{twin}"
        done = _torchrun(
            world,
            "run",
            str(ROOT / "examples" / "quickstart.yaml"),
            "--run-dir",
            str(run_dir),
            "--set",
            "determinism.mode=strict",
            "--set",
            "distributed.backend=nccl",
            "--set",
            f"train.grad_accum_steps={world}",
            *common,
            cwd=out,
        )
        (out / f"nccl-{twin}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            print(done.stdout[-3000:] + done.stderr[-3000:], file=sys.stderr)
            return {"error": f"torchrun failed with exit {done.returncode}", "world_size": world}
        times.append(json.loads((run_dir / "record.json").read_text())["timings"]["step_time_s_mean"])
    cmp = _reprotune("compare", str(out / "nccl-a"), str(out / "nccl-b"), "--json", cwd=out)
    verdict = json.loads(cmp.stdout)
    return {
        "world_size": world,
        "verdict": verdict["verdict"],
        "first_divergence_step": verdict["where"].get("first_divergence_step"),
        "step_time_s_mean": times,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--no-nccl", dest="nccl", action="store_false", help="skip the torchrun/NCCL twins")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-determinism")))
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU machine", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    common = [
        "--no-progress",
        "--no-tracking",
        "--set",
        "determinism.device=cuda",
        "--set",
        f"train.max_steps={args.steps}",
        "--set",
        "train.save_every=0",
        "--set",
        f"train.eval_every={args.steps}",
    ]
    results: dict[str, dict[str, object]] = {}
    for mode in ("strict", "off"):
        times = []
        for twin in ("a", "b"):
            run_dir = args.out / f"{mode}-{twin}"
            done = _reprotune(
                "run",
                str(ROOT / "examples" / "quickstart.yaml"),
                "--run-dir",
                str(run_dir),
                "--set",
                f"determinism.mode={mode}",
                *common,
                cwd=args.out,
            )
            (args.out / f"{mode}-{twin}.log").write_text(done.stdout + done.stderr)
            if done.returncode != 0:
                print(done.stdout + done.stderr, file=sys.stderr)
                results[mode] = {"error": f"run failed with exit {done.returncode}"}
                break
            record = json.loads((run_dir / "record.json").read_text())
            times.append(record["timings"]["step_time_s_mean"])
        else:
            cmp = _reprotune(
                "compare", str(args.out / f"{mode}-a"), str(args.out / f"{mode}-b"), "--json", cwd=args.out
            )
            verdict = json.loads(cmp.stdout)
            results[mode] = {
                "verdict": verdict["verdict"],
                "first_divergence_step": verdict["where"].get("first_divergence_step"),
                "step_time_s_mean": times,
                "gpu": torch.cuda.get_device_name(0),
            }
    if args.nccl:
        results["nccl"] = nccl_twins(args.out, common, min(2, torch.cuda.device_count()))
        nccl_t, plain_t = (
            results["nccl"].get("step_time_s_mean"),
            results.get("strict", {}).get("step_time_s_mean"),
        )
        if isinstance(nccl_t, list) and isinstance(plain_t, list):
            results["nccl"]["over_plain_strict_step_time"] = (sum(nccl_t) / len(nccl_t)) / (
                sum(plain_t) / len(plain_t)
            )
    strict_t = results.get("strict", {}).get("step_time_s_mean")
    off_t = results.get("off", {}).get("step_time_s_mean")
    if isinstance(strict_t, list) and isinstance(off_t, list):
        results["strict_over_off_step_time"] = {
            "ratio": (sum(strict_t) / len(strict_t)) / (sum(off_t) / len(off_t))
        }
    (args.out / "gpu_determinism.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    print(json.dumps(results, indent=1, sort_keys=True))
    nccl_ok = not args.nccl or results.get("nccl", {}).get("verdict") == "IDENTICAL"
    return 0 if results.get("strict", {}).get("verdict") == "IDENTICAL" and nccl_ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Do the quickstart's bytes travel between machines? The quickstart in each ``determinism.cpu_isa``
mode this CPU can hold, its adapter and ledger sha256 against those recorded on other machines.

    .venv/bin/python bench/portable_bytes.py [--mode MODE ...] [--record LABEL]

For each mode (default: ``native`` and every portable mode this CPU can hold: ``avx2`` and
``avx512`` on Intel, ``avx2-amd`` on AMD, ``avx2-compatible`` on both) it runs
``reprotune run examples/quickstart.yaml --set tracking.mlflow=false --set determinism.cpu_isa=MODE``
in a fresh process and hashes the adapter and ledger. Then, against every machine recorded in
``bench/portable_bytes.json`` with the same torch version (this machine's own earlier rows
included, under its label: a rerun here checks them too): for the same mode, MATCH or DIFFER; for
any mode, which recorded bytes it equals (a portable mode that gives another machine's ``native``
bytes reproduces that machine's run). Rows are judged only against runs of the same AdamW form
(``adamw``: ``fused`` in ``avx2-compatible`` since 2026-12-05, ``for-loop`` elsewhere and in rows
without the field). This is how a bitwise claim across machines is carried from
one machine to the next: run it, read the verdicts, and ``--record LABEL`` to add this machine's
rows (replacing its own earlier ones) to the file, to commit.

Exit 1 when a portable mode's bytes DIFFER from those recorded for the same mode on a machine with
the same torch (the mode's promise broken there, or the quickstart computes something else now:
``native`` on a machine recorded before tells which); 2 when a ``--mode`` asked for cannot be
held by this CPU; 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDED = Path(__file__).with_name("portable_bytes.json")
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def holdable_modes() -> list[str]:
    """``native`` and each portable mode this CPU can hold (it refuses the others before torch)."""
    from reprotune._determinism.isa import BASELINES, set_isa_environment
    from reprotune._errors import InputError

    modes = ["native"]
    for mode in BASELINES:
        try:
            set_isa_environment(mode, {})  # a scratch environment: only the refusal matters
        except InputError:
            continue
        modes.append(mode)
    return modes


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_mode(mode: str, work: Path) -> dict[str, Any]:
    """The quickstart in ``mode`` in a fresh process: its bytes and the machine it ran on."""
    run_dir = work / mode
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "reprotune", "run", str(QUICKSTART), "--set", "tracking.mlflow=false"]
    command += ["--set", f"determinism.cpu_isa={mode}", "--run-dir", str(run_dir), "--no-progress"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"portable_bytes: the quickstart in {mode} failed:\n{done.stderr[-2000:]}")
    environment = json.loads((run_dir / "record.json").read_text())["environment"]
    cpu = environment["kernels"]["cpu"]
    return {
        "mode": mode,
        "adapter_sha256": _sha256(run_dir / "adapter" / "adapter_model.safetensors"),
        "ledger_sha256": _sha256(run_dir / "ledger.jsonl"),
        "torch": str(environment["torch"]["version"]).split("+")[0],
        "adamw": _adamw_form(mode),
        "vendor": cpu.get("vendor"),
        "aten_capability": cpu.get("aten_capability"),
        "cpu": cpu.get("model"),
    }


def _adamw_form(mode: str) -> str:
    from reprotune._determinism.isa import fused_adamw

    return "fused" if fused_adamw(mode) else "for-loop"


def judge(ours: dict[str, Any], recorded: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """Lines saying how ``ours`` stands against each recorded row of the same torch; and whether
    it broke a portable mode's promise (DIFFER from a row of the same portable mode)."""
    lines, broken = [], False
    same_stack = [
        row
        for row in recorded
        if row["torch"] == ours["torch"] and row.get("adamw", "for-loop") == ours["adamw"]
    ]
    for row in same_stack:
        equal = all(row[key] == ours[key] for key in ("adapter_sha256", "ledger_sha256"))
        if row["mode"] == ours["mode"]:
            verdict = "MATCH" if equal else "DIFFER"
            broken |= not equal and ours["mode"] != "native"
            lines.append(f"    {verdict:6} {row['mode']} on {row['machine']}")
        elif equal:
            lines.append(f"    EQUALS {row['mode']} on {row['machine']}")
    if not same_stack:
        lines.append(f"    nothing recorded with torch {ours['torch']}, AdamW {ours['adamw']}: no comparison")
    return lines, broken


def record_rows(label: str, results: list[dict[str, Any]], when: str) -> None:
    """Add this machine's rows (``label``) for the modes run, replacing its own earlier ones."""
    data = json.loads(RECORDED.read_text())
    modes = {r["mode"] for r in results}
    kept = [row for row in data["recorded"] if not (row["machine"] == label and row["mode"] in modes)]
    for ours in results:
        row = {k: ours[k] for k in ("mode", "adapter_sha256", "ledger_sha256", "torch", "vendor", "adamw")}
        kept.append({**row, "machine": label, "when": when})
    data["recorded"] = sorted(kept, key=lambda row: (row["machine"], row["mode"]))
    RECORDED.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--mode", action="append", default=[], help="a mode to run (repeatable)")
    parser.add_argument("--record", metavar="LABEL", help="add this machine's rows under LABEL")
    parser.add_argument("--when", default="", help="with --record: the date, or where it was shown")
    args = parser.parse_args(argv)
    holdable = holdable_modes()
    refused = [mode for mode in args.mode if mode not in holdable]
    if refused:
        print(f"portable_bytes: this CPU cannot hold {', '.join(refused)} (it can: {', '.join(holdable)})")
        return 2
    recorded = json.loads(RECORDED.read_text())["recorded"]
    results, broken = [], False
    with tempfile.TemporaryDirectory(prefix="portable-bytes-") as tmp:
        for mode in args.mode or holdable:
            ours = run_mode(mode, Path(tmp))
            results.append(ours)
            print(f"{mode} on this {ours['cpu']} (ATen {ours['aten_capability']}, torch {ours['torch']})")
            print(f"  adapter {ours['adapter_sha256']}\n  ledger  {ours['ledger_sha256']}", flush=True)
            lines, missed = judge(ours, recorded)
            print("\n".join(lines), flush=True)
            broken |= missed
    if args.record:
        record_rows(args.record, results, args.when)
        print(f"recorded {len(results)} rows for {args.record!r} in {RECORDED.relative_to(ROOT)}")
    print("a portable mode DIFFERS from its bytes on a recorded machine" if broken else "no promise broken")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())

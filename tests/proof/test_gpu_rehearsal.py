"""bench/gpu_determinism.py, the prepared script for a lent GPU, rehearsed on the CPU
(``--device cpu``) on the tiny model: the branches it will take on a GPU run here first (twins per
mode, the strict twins' step-1 traces, and the traces of the first step where strict and off part),
so a device's few minutes are not spent on the script's own faults (this found one: a first
divergence at step 1 asked for a trace already made). On the CPU the rehearsal runs off in the
portable CPU mode, so that strict and off part where the kernels differ. The torchrun twins
(``--no-nccl`` here; gloo standing in for NCCL) cost two launches more and were rehearsed by
hand on the quickstart (docs/microscope.md).

The script runs in this process with its launcher of ``python -m reprotune`` (``_reprotune``)
wrapped: each of its calls is still a process of its own, forked from the tests' warm zygote
(tests/warm.py) where the call allows it; the calls that need a real interpreter (the
portable-mode runs, a trace of one) go through the script's own launcher. About 30 s less than
running the script as a whole in a new interpreter (70.7 s against 40.0 s, one run each, AMD EPYC)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from benchscripts import BENCH, load_bench_script
from tinyrun import TinyProject
from warm import needs_cold_start, run_reprotune

SCRIPT = BENCH / "gpu_determinism.py"


def _script() -> ModuleType:
    return load_bench_script("gpu_determinism")


@pytest.mark.slow
def test_the_gpu_script_rehearsed_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = TinyProject.create(tmp_path / "project")
    config = tiny.config(determinism={"mode": "strict", "threads": 1, "device": "cpu"})
    out = tmp_path / "rehearsal"
    script = _script()
    launched = script._reprotune

    cold: list[list[str]] = []

    def warm_launch(*args: str, cwd: Path) -> object:
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "HF_HUB_OFFLINE": "1"}
        if needs_cold_start(list(args), env, cwd=cwd):
            cold.append(list(args))
            return launched(*args, cwd=cwd)
        return run_reprotune(list(args), cwd=cwd, env=env, timeout=600)

    monkeypatch.setattr(script, "_reprotune", warm_launch)
    argv = ["--device", "cpu", "--steps", "2", "--no-nccl", "--config", str(config), "--out", str(out)]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    assert script.main() == 0, sorted(p.name for p in out.iterdir())
    results = json.loads((out / "gpu_determinism.json").read_text(encoding="utf-8"))
    assert results["strict"]["verdict"] == results["off"]["verdict"] == "IDENTICAL"
    twins = results["microscope"]["strict_twins_step_1"]
    assert twins["verdict"] == "IDENTICAL" and all(t["reproduced"] for t in twins["traces"])
    assert results["off"]["cpu_isa"] == "avx2-compatible"
    assert "step_time_s_median" in results["step_time_ratios_of"]
    ratio = results["strict_over_off_step_time"]
    medians = [sum(results[m]["step_time_s_median"]) for m in ("strict", "off")]
    assert ratio == {"ratio": pytest.approx(medians[0] / medians[1]), "of": "step_time_s_median"}
    # the script's own launcher ran the portable-mode runs (and a trace of one, where they part)
    portable_runs = [["run", str(config), "--run-dir", str(out / f"off-{t}")] for t in "ab"]
    assert [args[:4] for args in cold[:2]] == portable_runs
    assert all(args[0] == "trace" and args[1] == str(out / "off-a") for args in cold[2:]), cold
    parted = results["microscope"]["strict_vs_off"]
    kernels = json.loads((out / "strict-a" / "record.json").read_text())["environment"]["kernels"]
    if kernels["cpu"]["aten_capability"] == "AVX2" and kernels["blas"]["blas"] != "mkl":
        # native is the portable mode's kernels on such a CPU (tests/determinism/test_isa.py)
        assert parted == {"step": None, "note": "strict and off runs did not part"}
        return
    assert parted["verdict"] == "DIVERGED" and parted["finding"] == "kernel", parted
    assert "same inputs, different outputs" in parted["explanation"][0]
    assert "determinism.cpu_isa native vs avx2-compatible" in parted["explanation"][0]


@pytest.mark.slow
def test_random_weights_keep_the_architecture_and_the_tokenizer(tmp_path: Path) -> None:
    """``--random-weights-from`` (a device call cannot carry the SmolLM2 GGUF): the model folder made
    has the source's config and tokenizer files, seeded weights (the same bytes when made twice)
    of the source's shapes, and reprotune trains it."""
    import hashlib

    from safetensors import safe_open

    tiny = TinyProject.create(tmp_path / "project")
    source = tiny.root / "tiny-model"
    script = _script()
    made = [script.random_weights_model(source, tmp_path / name) for name in ("a", "b")]
    weights = [next(m.glob("*.safetensors")) for m in made]
    digests = {hashlib.sha256(w.read_bytes()).hexdigest() for w in weights}
    assert len(digests) == 1
    with (
        safe_open(str(next(source.glob("*.safetensors"))), "pt") as real,
        safe_open(str(weights[0]), "pt") as new,
    ):
        names, new_names = real.keys(), new.keys()  # safetensors' handles are not iterable
        assert {k: real.get_slice(k).get_shape() for k in names} == {
            k: new.get_slice(k).get_shape() for k in new_names
        }
        assert any(not (real.get_tensor(k) == new.get_tensor(k)).all() for k in names)
    for name in script.TOKENIZER_FILES:
        assert (made[0] / name).is_file() == (source / name).is_file()
    assert (
        json.loads((made[0] / "config.json").read_text())["model_type"]
        == json.loads((source / "config.json").read_text())["model_type"]
    )
    config = tiny.config(model={"name": str(made[0]), "max_length": 64}, train={"max_steps": 2})
    tiny.run_cli("run", str(config), "--run-dir", str(tmp_path / "run"), "--no-progress", "--no-tracking")
    record = json.loads((tmp_path / "run" / "record.json").read_text(encoding="utf-8"))
    assert record["status"] == "completed"


class FakeLauncher:
    """``python -m reprotune`` as the script calls it, without a model: ``run`` writes a record with
    the step times given for its run directory's name (``strict-a``...), ``trace`` a trace header,
    ``compare`` answers from ``compares`` (keyed by the two names), and ``on_run`` is called with
    each run directory's name before it is made."""

    def __init__(self, times: dict[str, tuple[float, float]], compares: dict[tuple[str, str], Any]) -> None:
        self.times, self.compares = times, compares
        self.on_run: Callable[[str], None] = lambda name: None

    def __call__(self, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
        if args[0] == "run":
            run_dir = Path(args[args.index("--run-dir") + 1])
            self.on_run(run_dir.name)
            median, mean = self.times[run_dir.name]
            run_dir.mkdir(parents=True)
            timings = {"step_time_s_median": median, "step_time_s_mean": mean}
            (run_dir / "record.json").write_text(json.dumps({"timings": timings}), encoding="utf-8")
            return subprocess.CompletedProcess(list(args), 0, "", "")
        if args[0] == "trace":
            target = Path(args[args.index("--out") + 1])
            target.write_text(json.dumps({"reproduced": {"step": True}, "ops": 3}) + "\n", encoding="utf-8")
            return subprocess.CompletedProcess(list(args), 0, "", "")
        assert args[0] == "compare"
        answer = self.compares[Path(args[1]).name.split("-step")[0], Path(args[2]).name.split("-step")[0]]
        if isinstance(answer, dict):
            return subprocess.CompletedProcess(
                list(args), 0 if answer["verdict"] == "IDENTICAL" else 1, json.dumps(answer), ""
            )
        code, stderr = answer
        return subprocess.CompletedProcess(list(args), code, "", stderr)


IDENTICAL: dict[str, Any] = {"verdict": "IDENTICAL", "where": {}, "finding": None, "explanation": []}
TIMES = {"strict-a": (0.6, 0.9), "strict-b": (0.6, 0.9), "off-a": (0.3, 0.5), "off-b": (0.3, 0.5)}


def _main(script: ModuleType, out: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    argv = [
        "--device",
        "cpu",
        "--steps",
        "2",
        "--no-nccl",
        "--config",
        str(out / "c.yaml"),
        "--out",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    return int(script.main())


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((2, "error: runs/b: no such run directory\n"), "failed with exit 2"),
        ((0, ""), "exited 0 with no JSON"),
    ],
)
def test_a_compare_that_fails_is_recorded_with_its_stderr_and_the_times_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: tuple[int, str], said: str
) -> None:
    """``compare`` exiting 2 with nothing on stdout (or 0 with no JSON) is that phase's error, with
    the tail of its stderr, beside the step times already measured; nothing raises."""
    script = _script()
    monkeypatch.setattr(script, "_reprotune", FakeLauncher(TIMES, {("strict-a", "strict-b"): answer}))
    found = script.mode_twins(tmp_path, tmp_path / "c.yaml", "strict", [])
    assert said in found["error"] and "verdict" not in found
    assert found["stderr_tail"] == answer[1]
    assert found["step_time_s_median"] == [0.6, 0.6] and found["step_time_s_mean"] == [0.9, 0.9]


def test_every_phase_is_written_and_said_as_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """All phases, with the comparison of strict against off failing (exit 2): recorded as the
    microscope's error, the rest measured; the ratio is of the medians, not the means; one line a
    phase."""
    script = _script()
    compares = {
        ("strict-a", "strict-b"): IDENTICAL,
        ("off-a", "off-b"): IDENTICAL,
        ("strict-a", "off-a"): (2, "error: boom\n"),
    }
    monkeypatch.setattr(script, "_reprotune", FakeLauncher(TIMES, compares))
    assert _main(script, tmp_path, monkeypatch) == 0
    results = json.loads((tmp_path / "gpu_determinism.json").read_text(encoding="utf-8"))
    assert results["strict_over_off_step_time"] == {"ratio": pytest.approx(2.0), "of": "step_time_s_median"}
    assert results["microscope"]["strict_twins_step_1"]["verdict"] == "IDENTICAL"
    parted = results["microscope"]["strict_vs_off"]
    assert parted["step"] is None and "exit 2" in parted["error"] and parted["stderr_tail"] == "error: boom\n"
    lines = capsys.readouterr().out.split("\n")
    phases = ["strict twins", "off twins", "microscope strict_twins_step_1", "microscope strict_vs_off"]
    for phase in phases:
        assert sum(f"] {phase}: " in line for line in lines) == 1, (phase, lines)
    assert not list(tmp_path.glob("*.partial"))


def test_a_timeout_keeps_the_phases_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM (``timeout`` sends it) during the off twins: the strict twins' results are in the
    JSON, with ``stopped``; the exit is 128 + 15, and the signal's handler is put back."""
    script = _script()
    launcher = FakeLauncher(TIMES, {("strict-a", "strict-b"): IDENTICAL})

    def stop_at_off(name: str) -> None:
        if name == "off-a":
            os.kill(os.getpid(), signal.SIGTERM)

    launcher.on_run = stop_at_off
    monkeypatch.setattr(script, "_reprotune", launcher)
    before = signal.getsignal(signal.SIGTERM)
    assert _main(script, tmp_path, monkeypatch) == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
    results = json.loads((tmp_path / "gpu_determinism.json").read_text(encoding="utf-8"))
    assert results["strict"]["verdict"] == "IDENTICAL" and "off" not in results
    assert results["stopped"]["by"] == "SIGTERM"


LAUNCHER = """
import signal, subprocess, sys, time
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
open(sys.argv[1], "w").write(str(rank.pid))
def stop(*_):
    rank.terminate()
    rank.wait()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
time.sleep(120)
"""


def test_a_stopped_script_lets_the_launcher_stop_its_ranks(tmp_path: Path) -> None:
    """Stopped while a launcher runs (as torchrun, whose ranks live in sessions of their own): the
    launcher's group gets SIGTERM, which it passes on, so no rank is left running on the GPU
    (before, subprocess.run SIGKILLed the launcher alone and its ranks ran on)."""
    script = _script()
    pid_file = tmp_path / "rank.pid"
    (tmp_path / "launcher.py").write_text(LAUNCHER)

    def alarm(signum: int, frame: object) -> None:
        raise script.Stopped(signal.SIGTERM)

    before = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 6.0)  # the launcher has started its rank by then
    try:
        with pytest.raises(script.Stopped):
            script._in_its_group(
                [sys.executable, str(tmp_path / "launcher.py"), str(pid_file)], tmp_path, dict(os.environ)
            )
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    rank = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(rank, 0)

"""``determinism.cpu_isa: avx2-compatible`` across CPU vendors, shown on an emulated Intel CPU.

The mode's claim is the same bits on any x86-64 CPU with AVX2, Intel or AMD. One machine has one
vendor, so the other is emulated: QEMU's user mode (``qemu-x86_64 -cpu Haswell-v4``) runs this
venv's Python on an Intel Haswell as far as every library can tell from CPUID (MKL takes its
Intel dispatch there: the record's ``mkl_code_path`` says ``AVX2``, where an AMD CPU gives
``AUTO``). Its floating point is IEEE arithmetic done in software, and its approximation
instructions (``rcpps``, ``rsqrtps``) return the exact reciprocal, where each vendor's silicon
returns its own approximation: an op whose bits hang on those instructions differs under it.
That is what broke the mode before: MKL's ``vsSqrt`` (``torch.sqrt``) runs an ``rsqrtps`` kernel
even in its ``COMPATIBLE`` branch, and AdamW's for-loop form calls it at every step; the mode now
runs AdamW fused (``_determinism.isa``). Both halves are checked: the emulator tells
``torch.sqrt``'s bits apart (so it would catch that dependence), and a whole run in the mode is
IDENTICAL on this CPU and on the emulated Intel one. The emulation is not an Intel machine
(/proc/cpuinfo still shows this CPU: QEMU's user mode passes it through), and is slow (a
SmolLM2 step about 100x, importing torch about 10x): the tiny run only.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reprotune._determinism.isa import BASELINES
from reprotune._proof.compare import compare_runs
from tinyrun import TinyProject

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64", reason="emulates an Intel x86-64 CPU with x86-64 user-mode QEMU"
)

MODE = "avx2-compatible"
INTEL_CPU = "Haswell-v4"  # Intel, AVX2 + FMA + F16C, no AVX-512: what QEMU's TCG can execute

# torch.sqrt (MKL's vsSqrt), then NumPy's square root (sqrtps, correctly rounded), of one tensor
SQRT_BITS = """
import hashlib, numpy, torch
x = torch.linspace(1e-7, 1e-5, 4096, dtype=torch.float64).float()
for root in (torch.sqrt(x).numpy(), numpy.sqrt(x.numpy())):
    print(hashlib.sha256(root.tobytes()).hexdigest())
"""


def _qemu() -> str:
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.fail(
            "qemu-x86_64 is missing: install Debian's qemu-user with "
            "`sudo apt-get update && sudo apt-get install -y qemu-user` (scripts/test.sh does this)"
        )
    return qemu


def _emulated(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [_qemu(), "-cpu", INTEL_CPU, sys.executable, *args]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}\n{done.stderr[-3000:]}"
    return done


def _kernels(run_dir: Path) -> dict[str, object]:
    kernels: dict[str, object] = json.loads((run_dir / "record.json").read_text())["environment"]["kernels"]
    return kernels


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> TinyProject:
    return TinyProject.create(tmp_path_factory.mktemp("emulated"))


def test_the_emulated_intel_cpu_exposes_a_dependence_on_approximate_instructions(
    project: TinyProject,
) -> None:
    """MKL's vector square root under the mode's own settings: other bits on the emulated Intel
    CPU than here (an ``rsqrtps`` kernel), while a correctly rounded square root of the same
    numbers agrees (so the difference is the approximation, not the emulator's arithmetic)."""
    env = {**os.environ, **BASELINES[MODE].env}
    here = subprocess.run(
        [sys.executable, "-c", SQRT_BITS],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    mkl_here, numpy_here = here.stdout.split()
    mkl_there, numpy_there = _emulated("-c", SQRT_BITS, cwd=project.root, env=env).stdout.split()
    assert mkl_here != mkl_there and numpy_here == numpy_there


def test_a_portable_run_is_identical_on_an_emulated_intel_cpu(project: TinyProject) -> None:
    """The tiny run in ``avx2-compatible`` here and on the emulated Intel CPU: IDENTICAL (every
    step's loss bits and weights hash, and the adapter), with MKL on its Intel dispatch there."""
    config = str(project.config("cfg.yaml"))
    pinned = ("--set", f"determinism.cpu_isa={MODE}", "--no-progress")
    project.run_cli("run", config, "--run-dir", "here", *pinned)  # a real interpreter: the mode pins knobs
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    _emulated("-m", "reprotune", "run", config, "--run-dir", "intel", *pinned, cwd=project.root, env=env)
    result = compare_runs(project.root / "here", project.root / "intel")
    assert result.verdict.value == "IDENTICAL", result.format()
    intel = _kernels(project.root / "intel")
    assert intel["blas"] == {**intel["blas"], "mkl_code_path": "AVX2", "mkl_cbwr": "COMPATIBLE,STRICT"}
    assert intel["portable"] == {"cpu_isa": MODE} == _kernels(project.root / "here")["portable"]

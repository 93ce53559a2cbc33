"""The portable CPU mode (``determinism.cpu_isa``): every kernel knob pinned to a named ISA baseline.

On ``native`` (the default) each library picks the kernels of the CPU at hand, so a run made on
a CPU with AVX-512 gives other bits than the same run on one with AVX2 only. A baseline
(``avx2``, ``avx512``, ``avx2-amd``, ``avx2-compatible``) pins every knob that selects a CPU kernel
to it:

- ATen's vectorised kernels: ``ATEN_CPU_CAPABILITY``;
- MKL's code path: ``MKL_ENABLE_INSTRUCTIONS``, and its conditional numerical reproducibility
  mode ``MKL_CBWR=<branch>,STRICT`` (the same results on every CPU that has the branch, whatever
  the thread count: MKL's own promise);
- oneDNN's ISA: ``ONEDNN_MAX_CPU_ISA`` (and its older name ``DNNL_MAX_CPU_ISA``).

MKL takes its named branches (AVX2, AVX512) on Intel CPUs only: on an AMD CPU it reads
``MKL_CBWR=AVX2,STRICT`` as ``AUTO,STRICT`` and picks its own code path, so ``avx2`` and ``avx512``
cannot be put in force there (and are refused). ``avx2-amd`` is the AMD counterpart of ``avx2``:
ATen and oneDNN on AVX2, MKL's instructions capped to AVX2 and its CNR mode ``AUTO,STRICT`` (what
MKL puts in force on an AMD CPU: its own AMD code path), refused on Intel CPUs, where ``AUTO``
would pick an Intel branch. ``avx2-compatible`` takes MKL's vendor-neutral ``COMPATIBLE`` branch
(SSE2 code paths, the same results on Intel and AMD CPUs: MKL's promise), with ATen and oneDNN on
AVX2: the mode for runs that must reproduce across CPU vendors, at the cost of MKL's slower
products (measured in bench/README.md).

MKL keeps one promise of ``COMPATIBLE`` short: its vector-math square root (``vsSqrt``, which ATen
calls for ``torch.sqrt`` on float tensors) runs a kernel built on ``rsqrtps`` in every branch,
``COMPATIBLE`` included, and that instruction's approximation is the CPU's own (Intel's and AMD's
may differ, in MKL's own words; QEMU's is exact). AdamW takes a square root of its second moment
at every step, so ``avx2-compatible`` runs AdamW fused (:attr:`Baseline.fused_adamw`): ATen's
fused kernel takes its square root with ``sqrtps``, correctly rounded on every x86-64 CPU
(docs/microscope.md, section 5).

These are read once, when each library starts, so they must be set before torch is imported:
:func:`set_isa_environment` does that for the CLI (and so for every process it launches:
verify's legs, torchrun's ranks). :func:`require_isa` then reads back what is in force and
refuses a mode that is not, naming what differs; a mode is never claimed without being in force.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from reprotune._determinism.cpu import cpu_flags, cpu_vendor, mkl_cbwr
from reprotune._errors import InputError

CpuIsa = Literal["native", "avx2", "avx512", "avx2-amd", "avx2-compatible"]

INTEL, AMD = "GenuineIntel", "AuthenticAMD"


@dataclass(frozen=True)
class Baseline:
    """One named ISA baseline.

    Attributes:
        name: the ``determinism.cpu_isa`` value.
        needs: the CPU flags (/proc/cpuinfo names) a machine must have.
        env: the variables that pin it (:func:`_pins`).
        vendor: the one CPU vendor whose MKL code path the baseline pins (None: any vendor).
        fused_adamw: whether reprotune's AdamW runs fused (ATen's own square root), where the
            for-loop form's (MKL's ``vsSqrt``) would give each vendor's bits.
    """

    name: str
    needs: tuple[str, ...]
    env: Mapping[str, str]
    vendor: str | None = INTEL
    fused_adamw: bool = False

    @property
    def aten(self) -> str:
        """``torch.backends.cpu.get_cpu_capability()`` when the baseline is in force."""
        return self.env["ATEN_CPU_CAPABILITY"].upper()

    @property
    def mkl_cbwr(self) -> str:
        """MKL's CNR mode when in force (as ``MKL_CBWR`` spells it)."""
        return self.env["MKL_CBWR"]


def _pins(isa: str, onednn: str, cbwr: str) -> dict[str, str]:
    """The variables that pin ATen, MKL and oneDNN (and its older name) to ``isa``."""
    return {
        "ATEN_CPU_CAPABILITY": isa.lower(),
        "MKL_ENABLE_INSTRUCTIONS": isa,
        "MKL_CBWR": cbwr,
        "ONEDNN_MAX_CPU_ISA": onednn,
        "DNNL_MAX_CPU_ISA": onednn,
    }


_AVX2 = ("avx", "avx2", "fma", "f16c")
BASELINES: dict[str, Baseline] = {
    "avx2": Baseline("avx2", _AVX2, _pins("AVX2", "AVX2", "AVX2,STRICT")),
    "avx512": Baseline(
        "avx512",
        (*_AVX2, "avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"),
        _pins("AVX512", "AVX512_CORE", "AVX512,STRICT"),
    ),
    "avx2-amd": Baseline("avx2-amd", _AVX2, _pins("AVX2", "AVX2", "AUTO,STRICT"), vendor=AMD),
    "avx2-compatible": Baseline(
        "avx2-compatible", _AVX2, _pins("AVX2", "AVX2", "COMPATIBLE,STRICT"), vendor=None, fused_adamw=True
    ),
}


def fused_adamw(mode: str) -> bool:
    """Whether a run in ``determinism.cpu_isa`` ``mode`` runs AdamW fused (``avx2-compatible``).

    Example:
        >>> fused_adamw("avx2-compatible"), fused_adamw("native"), fused_adamw("avx2-amd")
        (True, False, False)
    """
    baseline = BASELINES.get(mode)
    return baseline is not None and baseline.fused_adamw


_FIX = (
    "run it through the reprotune CLI (it sets these before torch loads), or set them yourself "
    "before starting Python: {assignments}; or use determinism.cpu_isa: native"
)


def _assignments(baseline: Baseline) -> str:
    return " ".join(f"{k}={v}" for k, v in baseline.env.items())


def vendor_baseline(vendor: str | None) -> str | None:
    """The AVX2 baseline of the CPUs of ``vendor`` alone (MKL's fast branch on them: ``avx2`` for
    Intel, ``avx2-amd`` for AMD); None for another or an unknown vendor (``avx2-compatible`` spans
    both)."""
    own = (b.name for b in BASELINES.values() if b.vendor == vendor and b.needs == _AVX2)
    return next(own, None) if vendor is not None else None


def has_flags(mode: str) -> bool:
    """Whether this CPU has every flag baseline ``mode`` needs."""
    return not _missing_flags(_baseline(mode))


def _missing_flags(baseline: Baseline) -> list[str]:
    flags = cpu_flags()
    if flags is None:  # not an x86-64 Linux machine: nothing to check against
        return list(baseline.needs)
    return [flag for flag in baseline.needs if flag not in flags]


def set_isa_environment(mode: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Put the baseline's variables into the environment, before torch is imported.

    Does nothing for ``native``, or once torch is imported (the libraries have read their
    settings by then: :func:`require_isa` decides whether what is in force is the mode).

    Args:
        mode: ``native`` or a key of :data:`BASELINES`.
        environ: the environment to change (default ``os.environ``).

    Returns:
        Whether the variables were set.

    Raises:
        InputError: an unknown mode, a CPU without the baseline's instructions, or a variable
            already set to something else (it would be overridden silently otherwise).
    """
    if mode == "native":
        return False
    baseline = _baseline(mode)
    missing = _missing_flags(baseline)
    if missing:
        raise InputError(
            f"determinism.cpu_isa {mode!r} cannot be put in force on this CPU: it lacks {', '.join(missing)}",
            source="determinism.cpu_isa",
            fix="choose a baseline this machine has (`reprotune doctor` lists its ISA), or native",
        )
    _require_vendor(baseline)
    target = os.environ if environ is None else environ
    clashes = [f"{k}={target[k]}" for k, v in baseline.env.items() if not _same(target.get(k, v), v)]
    if clashes:
        raise InputError(
            f"determinism.cpu_isa {mode!r} sets {_assignments(baseline)}, but the environment already "
            f"holds {', '.join(clashes)}",
            source="determinism.cpu_isa (environment)",
            fix="unset those variables, or use determinism.cpu_isa: native to keep them",
        )
    if "torch" in sys.modules:
        return False
    for key, value in baseline.env.items():
        target[key] = value
    return True


def _require_vendor(baseline: Baseline) -> None:
    """Refuse a baseline whose MKL code path this CPU's vendor does not get."""
    vendor = cpu_vendor()
    if baseline.vendor is None or vendor in (None, baseline.vendor):
        return
    if baseline.vendor == INTEL:
        why = (
            f"MKL takes its {baseline.mkl_cbwr.split(',')[0]} reproducibility branch on Intel CPUs only "
            "(elsewhere it picks its own code path)"
        )
        ours = "avx2-amd (the same bits on AMD CPUs with AVX2)" if vendor == AMD else None
    else:
        why = "it pins MKL's own AMD code path (on other CPUs MKL picks another one under the same settings)"
        ours = "avx2 (the same bits on Intel CPUs with AVX2)" if vendor == INTEL else None
    raise InputError(
        f"determinism.cpu_isa {baseline.name!r} cannot be put in force on this {vendor} CPU: {why}",
        source="determinism.cpu_isa",
        fix=f"use determinism.cpu_isa: {ours + ', or ' if ours else ''}avx2-compatible (MKL's "
        "vendor-neutral branch: the same bits on Intel and AMD CPUs with AVX2, slower), or native",
    )


def _baseline(mode: str) -> Baseline:
    if mode not in BASELINES:
        raise InputError(
            f"unknown determinism.cpu_isa {mode!r}",
            source="determinism.cpu_isa",
            fix=f"use native or one of {', '.join(BASELINES)}",
        )
    return BASELINES[mode]


def _same(value: str | None, wanted: str) -> bool:
    """Whether a variable holds a mode's value, as the library reads it: spaces beside a comma
    are nothing to MKL (``MKL_CBWR="COMPATIBLE, STRICT"`` reads back ``COMPATIBLE,STRICT``)."""
    return value is not None and re.sub(r"\s*,\s*", ",", value) == wanted


def isa_in_force(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Which ``cpu_isa`` mode is in force, read back from torch, MKL and the environment.

    Returns:
        ``{"cpu_isa": name, "aten_capability": ..., "mkl_cbwr": ..., "env": {...}}``, where
        ``cpu_isa`` is a baseline's name when every one of its knobs is in force, else ``native``.
    """
    import torch

    env = os.environ if environ is None else environ
    aten = torch.backends.cpu.get_cpu_capability()
    cbwr = mkl_cbwr()
    vendor = cpu_vendor()
    name = "native"
    for baseline in BASELINES.values():
        pinned = all(_same(env.get(k), v) for k, v in baseline.env.items())
        ours = baseline.vendor is None or vendor in (None, baseline.vendor)
        if pinned and ours and aten == baseline.aten and cbwr in (baseline.mkl_cbwr, None):
            name = baseline.name
    return {
        "cpu_isa": name,
        "aten_capability": aten,
        "mkl_cbwr": cbwr,
        "env": {k: env.get(k) for k in BASELINES["avx2"].env},
    }


def require_isa(mode: str) -> dict[str, Any]:
    """Refuse to go on unless ``mode`` is in force; return :func:`isa_in_force`.

    Raises:
        InputError: the mode's knobs are not all in force in this process (set after torch
            loaded, or overridden), naming each one that differs and the fix.
    """
    found = isa_in_force()
    if mode == "native" or found["cpu_isa"] == mode:
        return found
    baseline = _baseline(mode)
    _require_vendor(baseline)
    wrong = []
    if found["aten_capability"] != baseline.aten:
        wrong.append(f"ATen capability {found['aten_capability']} (needs {baseline.aten})")
    if found["mkl_cbwr"] not in (baseline.mkl_cbwr, None):
        wrong.append(f"MKL CNR mode {found['mkl_cbwr']} (needs {baseline.mkl_cbwr})")
    wrong += [
        f"{k}={found['env'].get(k)} (needs {v})"
        for k, v in baseline.env.items()
        if not _same(os.environ.get(k), v) and k in found["env"]
    ]
    raise InputError(
        f"determinism.cpu_isa {mode!r} is not in force in this process: {'; '.join(wrong)}",
        source="determinism.cpu_isa",
        fix=_FIX.format(assignments=_assignments(baseline)),
    )

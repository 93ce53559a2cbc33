"""The doctor's checks of what computes the numbers besides the config: the CPU kernels in force
(the ``determinism.cpu_isa`` mode, read back, and which mode to pin to rerun elsewhere) and whether
CI proves the installed library stack, and whether its MLflow can open the config's SQL store.
"""

from __future__ import annotations

from reprotune._determinism.cpu import is_arm
from reprotune._determinism.isa import INTEL, has_flags, vendor_baseline
from reprotune._doctor.findings import Context
from reprotune._run.findings import Finding
from reprotune._run.fingerprint import installed_distributions
from reprotune._run.kernels import kernel_facts
from reprotune._run.stack import mlflow_store_problem, stack_facts
from reprotune._trackers.mlflow_worker import sql_store


def check_cpu_kernels(ctx: Context) -> list[Finding]:
    """Which CPU kernels run (the ``determinism.cpu_isa`` mode in force, read back)."""
    if ctx.device != "cpu":
        return []
    facts = ctx.kernels or kernel_facts(env=ctx.env)  # a Context made without them reads them here
    cpu, blas = facts["cpu"], facts["blas"]
    mode = facts["portable"]["cpu_isa"]
    path = (
        f"ATen capability {cpu['aten_capability']}, MKL code path {blas['mkl_code_path']} "
        f"(CNR {blas['mkl_cbwr']})"
    )
    if mode != "native":
        return [
            Finding(
                "cpu-kernels-portable",
                "info",
                f"determinism.cpu_isa {mode!r} is in force: {path}",
                f"CPU kernel knobs pinned to {mode}, so that runs reproduce on the x86-64 CPUs that can "
                f"hold it ({_holders(mode)})"
                " (shown against a CPU capped to it: docs/microscope.md)",
                "nothing to do",
            )
        ]
    return [
        Finding(
            "cpu-kernels-native",
            "info",
            f"CPU kernels are this CPU's own (determinism.cpu_isa: native): {path}",
            "a CPU with other vector instructions (AVX2 vs AVX-512) runs other kernels and gets other "
            "bits: runs reproduce bit for bit only on CPUs whose kernel facts match",
            _portable_fix(cpu.get("vendor"), arm=is_arm()),
        )
    ]


def _portable_fix(vendor: str | None, *, arm: bool = False) -> str:
    """Which ``determinism.cpu_isa`` to pin to rerun elsewhere: this CPU's vendor's own first."""
    if arm:
        return "no portable mode pins an Arm CPU's kernels yet: its runs reproduce on CPUs like it"
    own = vendor_baseline(vendor)
    if own is None:
        return (
            "to rerun on other CPUs pin determinism.cpu_isa: avx2 (Intel), avx2-amd (AMD) or "
            "avx2-compatible (any x86-64 CPU with AVX2)"
        )
    if not has_flags(own):
        return "this CPU lacks AVX2, which every portable mode needs: its runs reproduce on CPUs like it"
    name = "Intel" if vendor == INTEL else "AMD"  # the vendors with a baseline of their own
    return (
        f"to rerun on other {name} CPUs with AVX2 pin determinism.cpu_isa: {own}; across vendors "
        "too, avx2-compatible (MKL's vendor-neutral branch, slower)"
    )


def check_stack(ctx: Context) -> list[Finding]:
    """Whether CI proves the installed library stack (the record's ``environment.stack``)."""
    del ctx
    facts = stack_facts(installed_distributions())
    if facts["stack"] != "untested":
        return [
            Finding(
                "stack-tested",
                "info",
                f"the installed libraries are a stack CI proves: {facts['stack']}",
                "reprotune's own tests passed on exactly these versions",
                "nothing to do",
            )
        ]
    closest = facts["closest"]
    differs = ", ".join(
        f"{name} {versions['installed']} ({closest}: {versions.get(closest)})"
        for name, versions in facts["differs"].items()
    )
    return [
        Finding(
            "stack-untested",
            "info",
            f"the installed libraries are not a stack CI proves: {differs}",
            "pyproject.toml's ranges allow them, but reprotune's tests ran on the lock and on the "
            "floors only; twin runs still prove themselves (compare, verify)",
            "to run on a proven stack: pip install -c <reprotune>/stacks/lock.txt (or floor.txt) reprotune",
        )
    ]


def check_mlflow_store(ctx: Context) -> list[Finding]:
    """Whether MLflow can open the config's SQL tracking store with the installed pair of
    mlflow-skinny and SQLAlchemy (pyproject.toml's ranges allow one that cannot)."""
    tracking = ctx.cfg.tracking
    if not (tracking.mlflow and sql_store(tracking.uri)):
        return []
    problem = mlflow_store_problem(installed_distributions())
    if problem is None:
        return []
    return [
        Finding(
            "mlflow-store-broken",
            "warning",
            problem,
            f"every run's MLflow mirror to {tracking.uri} would fail (the run and its record go on)",
            "pip install 'mlflow-skinny>=3.9' (or 'SQLAlchemy<2.1'), or set tracking.mlflow: false",
        )
    ]


def _holders(mode: str) -> str:
    """Which vendors' CPUs can hold a portable mode (docs/microscope.md, section 5)."""
    if mode == "avx2-compatible":
        return "Intel or AMD"
    return "AMD CPUs; Intel's refuse it" if mode.endswith("-amd") else "Intel CPUs; AMD's refuse it"

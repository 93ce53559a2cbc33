"""What the doctor reports: findings, the report, and its text form.

Every finding code is a contract documented in docs/doctor.md (:data:`FINDING_CODES`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reprotune._config.locate import value_source
from reprotune._config.schema import ExperimentConfig
from reprotune._formats import DOCTOR
from reprotune._run.findings import SEVERITIES, Finding


@dataclass(frozen=True)
class DoctorReport:
    """Everything ``reprotune doctor`` found, with the probe's result."""

    findings: tuple[Finding, ...]
    config_source: str | None
    mode: str
    device: str
    flags: dict[str, Any]
    probe: dict[str, Any] | None = None
    kernels: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        """1 when an error-level finding exists, else 0."""
        return 1 if any(f.severity == "error" for f in self.findings) else 0

    def codes(self) -> list[str]:
        """The finding codes, in report order."""
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (``reprotune doctor --json``)."""
        counts = {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}
        return DOCTOR.stamp(
            {
                "config": self.config_source,
                "mode": self.mode,
                "device": self.device,
                "exit_code": self.exit_code,
                "counts": counts,
                "findings": [f.to_dict() for f in self.findings],
                "determinism_flags": self.flags,
                "kernels": self.kernels,
                "probe": self.probe,
            }
        )


@dataclass
class Context:
    """What every check sees."""

    cfg: ExperimentConfig
    has_config: bool
    device: str  # the concrete device ("cpu" or "cuda"), or the request when it cannot be had
    device_ok: bool
    flags: dict[str, Any]
    env: Mapping[str, str]
    code_dir: Path
    config_source: str | None = None
    overrides: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    #: what selects a kernel here, read back under the config's mode (``_run.kernels.kernel_facts``)
    kernels: dict[str, Any] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """Where ``key``'s value came from: the ``--set`` that gave it, the config file's line, or
        just the key."""
        return value_source(key, self.overrides, self.config_source) or f"key {key}"


Check = Callable[[Context], list[Finding]]

#: Every finding code the doctor can emit (docs/doctor.md documents each one).
FINDING_CODES: tuple[str, ...] = (
    "no-config",
    "device-unavailable",
    "device-auto",
    "deterministic-algorithms-off",
    "deterministic-warn-only",
    "cudnn-benchmark-on",
    "cudnn-nondeterministic",
    "tf32-matmul-on",
    "tf32-cudnn-on",
    "cublas-workspace-unset",
    "fp16",
    "threads-unpinned",
    "cpu-kernels-native",
    "cpu-kernels-portable",
    "stack-tested",
    "stack-untested",
    "mlflow-store-broken",
    "dataloader-workers",
    "model-revision-unpinned",
    "model-revision-not-sha",
    "git-absent",
    "git-dirty",
    "git-no-commit",
    "data-no-manifest",
    "data-manifest-unreadable",
    "data-unreadable",
    "data-manifest-mismatch",
    "config-column-missing",
    "tokenizers-parallelism-unset",
    "tokenizers-parallelism-on",
    "pythonhashseed-random",
    "nccl-algo-unpinned",
    "nccl-env-set",
    "distributed-placement",
    "distributed-ranks-differ",
    "distributed-ranks-agree",
    "probe-identical",
    "probe-differs",
    "probe-failed",
    "probe-skipped",
)


def format_report(report: DoctorReport) -> str:
    """The human-readable report: one block per finding, most severe first, then a summary line."""
    lines = [
        f"reprotune doctor: {report.config_source or 'default config'} "
        f"(mode {report.mode}, device {report.device})",
        "",
    ]
    for f in report.findings:
        lines.append(f"{f.severity.upper():7} {f.code}: {f.title}")
        lines.append(f"        why: {f.why}")
        lines.append(f"        fix: {f.fix}")
    counts = {s: sum(f.severity == s for f in report.findings) for s in SEVERITIES}
    verdict = "FAIL" if report.exit_code else "OK"
    lines += [
        "",
        f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info",
    ]
    return "\n".join(lines)

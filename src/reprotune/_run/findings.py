"""A reproducibility finding, as the run record (``findings``), ``reprotune doctor --json`` and the
Trainer callback's warnings hold it: a stable code, a severity, what was found, why it matters and
the fix. The doctor's checks and the callback's checks both make these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Finding:
    """One thing the doctor found.

    Attributes:
        code: stable identifier (docs/doctor.md lists them all).
        severity: ``error`` (exit 1), ``warning`` or ``info``.
        title: what was found, naming the value.
        why: why it matters for reproducibility.
        fix: what to do about it.
    """

    code: str
    severity: Severity
    title: str
    why: str
    fix: str

    def to_dict(self) -> dict[str, str]:
        """JSON-safe form."""
        return {
            "code": self.code,
            "severity": self.severity,
            "title": self.title,
            "why": self.why,
            "fix": self.fix,
        }

"""``reprotune doctor``: audit a setup for what can break reproducibility, then prove it empirically.

Static checks (``_doctor.checks``) look at the config, the determinism flags the config's mode puts
in force, the environment variables, git and the data; the probe (``_doctor.probe``) runs a tiny
model's forward and backward twice under that mode. The doctor leaves torch's global flags, RNG
state and environment as it found them, but for a ``CUBLAS_WORKSPACE_CONFIG`` it set that its probe
on a GPU may have put in force (kept: it is then this process's).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reprotune._config.loading import config_from_dict
from reprotune._config.schema import ExperimentConfig
from reprotune._determinism.device import resolve_device
from reprotune._determinism.flags import (
    CUBLAS_ENV,
    apply_determinism,
    cublas_may_be_in_use,
    restore_precision,
    save_precision,
)
from reprotune._doctor.checks import CHECKS
from reprotune._doctor.findings import Context, DoctorReport
from reprotune._doctor.probe import run_probe
from reprotune._errors import InputError
from reprotune._run.findings import SEVERITIES, Finding
from reprotune._run.kernels import kernel_facts

# --- the doctor ----------------------------------------------------------------------------------


@contextmanager
def _torch_state_preserved() -> Iterator[None]:
    """Restore torch's determinism flags, float32 precision, thread count and
    CUBLAS_WORKSPACE_CONFIG afterwards; the variable stays as the doctor set it where torch may
    have made a cuBLAS handle under it meanwhile (the probe on a GPU): that value is then the one
    in force in this process (``_determinism.flags.cublas_may_be_in_use``)."""
    import torch

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.get_num_threads(),
        os.environ.get(CUBLAS_ENV),
    )
    precision = save_precision()
    cublas_in_use = cublas_may_be_in_use()
    try:
        yield
    finally:
        det, warn_only, cudnn_det, bench, threads, cublas = saved
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_det
        torch.backends.cudnn.benchmark = bench
        restore_precision(precision)
        torch.set_num_threads(threads)
        if cublas_in_use or not cublas_may_be_in_use():  # else a handle may have taken the doctor's
            if cublas is None:
                os.environ.pop(CUBLAS_ENV, None)
            else:
                os.environ[CUBLAS_ENV] = cublas


def run_doctor(
    config: ExperimentConfig | None = None,
    *,
    config_source: str | None = None,
    code_dir: str | os.PathLike[str] = ".",
    probe: bool = True,
    env: Mapping[str, str] | None = None,
    overrides: Sequence[str] = (),
) -> DoctorReport:
    """Audit ``config`` (or the defaults) and this machine for what can break reproducibility.

    The config's determinism mode is applied (as ``reprotune run`` would) to read back the flags
    it puts in force and to run the probe; torch's flags are restored before returning.

    Args:
        config: the experiment config; None audits the defaults (with ``overrides`` applied).
        config_source: where the config came from, for the report.
        code_dir: the directory whose git state is checked.
        probe: run the empirical probe.
        env: environment variables to check (default ``os.environ``).
        overrides: the ``--set`` items the config was read with, so a finding names them, not
            the config file's line, as where a value came from.

    Returns:
        The :class:`DoctorReport`; its ``exit_code`` is 1 when an error-level finding exists.
    """

    # Paths as a run opens them (relative ones against config_dir).
    audited = config  # without one, the defaults with the --set items (a config holds them already)
    if audited is None:
        audited = (
            config_from_dict({}, source="--set", overrides=overrides) if overrides else ExperimentConfig()
        )
    cfg = audited.resolve_paths()
    det = cfg.determinism
    with _torch_state_preserved():
        try:
            device: str = resolve_device(det.device).type
            device_ok = True
        except InputError:
            device, device_ok = det.device, False
        flags = apply_determinism(det.mode, det.threads, device if device_ok else "cpu", cpu_isa=det.cpu_isa)
        ctx = Context(
            cfg=cfg,
            has_config=config is not None,
            device=device,
            device_ok=device_ok,
            flags=flags,
            env=os.environ if env is None else env,
            code_dir=Path(code_dir),
            config_source=None if config_source is None else str(config_source),
            overrides=tuple(overrides),
        )
        ctx.kernels = kernel_facts(env=ctx.env)  # under the mode's flags: a run's record reads the same
        findings = [finding for check in CHECKS for finding in check(ctx)]
        probe_result: dict[str, Any] | None = None
        if probe and device_ok:
            probe_result, finding = run_probe(device)
            findings.append(finding)
        elif probe:
            findings.append(
                Finding(
                    "probe-skipped",
                    "info",
                    f"probe skipped: device {device!r} is not available",
                    "the probe runs on the configured device only",
                    "fix device-unavailable first",
                )
            )
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])  # stable: check order within a severity
    return DoctorReport(
        findings=tuple(findings),
        config_source=config_source,
        mode=det.mode,
        device=device,
        flags=flags,
        probe=probe_result,
        kernels=ctx.kernels,
    )

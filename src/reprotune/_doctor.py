"""``reprotune doctor``: audit a setup for what can break reproducibility, then prove it empirically.

Static checks look at the config, the determinism flags the config's mode puts in force, the
environment variables, git and the data; each :class:`Finding` says how bad it is, why it matters
and how to fix it. The empirical probe runs a tiny model's forward and backward pass twice on the
configured device under the configured mode and compares every bit of the loss and gradients.

Every check is one small function in :data:`CHECKS`; the finding codes are a contract documented in
docs/doctor.md. The doctor leaves torch's global flags, RNG state and environment as it found them.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from reprotune._config import BUILTIN_PREFIX, ExperimentConfig
from reprotune._determinism import CUBLAS_DETERMINISTIC_VALUES, CUBLAS_ENV
from reprotune._errors import InputError
from reprotune._jsonio import sha256_file

Severity = Literal["error", "warning", "info"]
SEVERITIES: tuple[Severity, ...] = ("error", "warning", "info")
_SHA_RE = re.compile(r"^[0-9a-f]{40}$")


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


@dataclass(frozen=True)
class DoctorReport:
    """Everything ``reprotune doctor`` found, with the probe's result."""

    findings: tuple[Finding, ...]
    config_source: str | None
    mode: str
    device: str
    flags: dict[str, Any]
    probe: dict[str, Any] | None = None

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
        return {
            "schema": "reprotune/doctor",
            "schema_version": 1,
            "config": self.config_source,
            "mode": self.mode,
            "device": self.device,
            "exit_code": self.exit_code,
            "counts": counts,
            "findings": [f.to_dict() for f in self.findings],
            "determinism_flags": self.flags,
            "probe": self.probe,
        }


@dataclass
class _Context:
    """What every check sees."""

    cfg: ExperimentConfig
    has_config: bool
    device: str  # the concrete device ("cpu" or "cuda"), or the request when it cannot be had
    device_ok: bool
    flags: dict[str, Any]
    env: Mapping[str, str]
    code_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)


Check = Callable[[_Context], list[Finding]]


# --- checks --------------------------------------------------------------------------------------


def check_config(ctx: _Context) -> list[Finding]:
    """No config: say that the defaults were audited."""
    if ctx.has_config:
        return []
    return [
        Finding(
            "no-config",
            "info",
            "no config given: audited the default config",
            "config-specific checks (model revision, data, precision) describe the defaults only",
            "run `reprotune doctor CONFIG` on the config you will train with",
        )
    ]


def check_device(ctx: _Context) -> list[Finding]:
    """The configured device exists, and does not depend on the machine."""
    requested = ctx.cfg.determinism.device
    if not ctx.device_ok:
        return [
            Finding(
                "device-unavailable",
                "error",
                f"determinism.device is {requested!r} but torch sees no GPU",
                "the run would fail; numbers on another device differ in their last bits anyway",
                "use --set determinism.device=cpu, or run on a machine with a CUDA build of torch",
            )
        ]
    if requested == "auto":
        return [
            Finding(
                "device-auto",
                "warning",
                f"determinism.device is 'auto' (here: {ctx.device})",
                "the same config trains on GPU on one machine and CPU on another, and the numbers differ",
                f"pin it: --set determinism.device={ctx.device}",
            )
        ]
    return []


def check_mode(ctx: _Context) -> list[Finding]:
    """Deterministic algorithms on, and raising rather than warning."""
    mode, on_gpu = ctx.cfg.determinism.mode, ctx.device == "cuda"
    if not ctx.flags.get("deterministic_algorithms"):
        return [
            Finding(
                "deterministic-algorithms-off",
                "error" if on_gpu else "warning",
                f"torch deterministic algorithms are off (determinism.mode: {mode})",
                "torch may pick nondeterministic kernels (atomics on GPU: scatter, index_add, embedding "
                "backward), so two runs can differ in their bits",
                "set determinism.mode: strict",
            )
        ]
    if ctx.flags.get("deterministic_warn_only"):
        return [
            Finding(
                "deterministic-warn-only",
                "warning" if on_gpu else "info",
                "determinism.mode is 'warn': nondeterministic ops only warn",
                "a run that uses an op without a deterministic implementation goes on and may not repeat",
                "set determinism.mode: strict to fail on such an op instead",
            )
        ]
    return []


def check_gpu_flags(ctx: _Context) -> list[Finding]:
    """cuDNN and TF32 flags in force (they matter on CUDA only)."""
    if ctx.device != "cuda" or not ctx.device_ok:
        return []
    flags, found = ctx.flags, []
    if flags.get("cudnn_benchmark"):
        found.append(
            Finding(
                "cudnn-benchmark-on",
                "error",
                "torch.backends.cudnn.benchmark is on",
                "cuDNN times candidate kernels and picks the fastest, which can change between runs",
                "set determinism.mode: strict (reprotune turns benchmark off)",
            )
        )
    if not flags.get("cudnn_deterministic"):
        found.append(
            Finding(
                "cudnn-nondeterministic",
                "error",
                "torch.backends.cudnn.deterministic is off",
                "cuDNN may use nondeterministic convolution algorithms",
                "set determinism.mode: strict",
            )
        )
    for key, name in (
        ("matmul_allow_tf32", "torch.backends.cuda.matmul.allow_tf32"),
        ("cudnn_allow_tf32", "torch.backends.cudnn.allow_tf32"),
    ):
        if flags.get(key):
            found.append(
                Finding(
                    f"tf32-{key.split('_')[0]}-on",
                    "error",
                    f"{name} is on",
                    "TF32 rounds float32 inputs to 10 mantissa bits on Ampere and later GPUs: results "
                    "then differ from other GPUs and from CPU",
                    "set determinism.mode: strict (reprotune turns TF32 off)",
                )
            )
    return found


def check_cublas(ctx: _Context) -> list[Finding]:
    """CUBLAS_WORKSPACE_CONFIG on CUDA."""
    if ctx.device != "cuda" or not ctx.device_ok:
        return []
    value = ctx.flags.get("cublas_workspace_config")
    if value in CUBLAS_DETERMINISTIC_VALUES:
        return []
    return [
        Finding(
            "cublas-workspace-unset",
            "error",
            f"{CUBLAS_ENV} is {value!r}",
            "without a fixed cuBLAS workspace, CUDA >= 10.2 matmuls are not reproducible, and strict mode "
            "raises on the first one",
            f"export {CUBLAS_ENV}=:4096:8 before starting Python (strict and warn modes set it)",
        )
    ]


def check_precision(ctx: _Context) -> list[Finding]:
    """fp16 compute or weights."""
    cfg, found = ctx.cfg, []
    if cfg.train.precision == "fp16" or cfg.model.dtype == "float16":
        what = "train.precision: fp16" if cfg.train.precision == "fp16" else "model.dtype: float16"
        found.append(
            Finding(
                "fp16",
                "warning",
                f"{what} chosen",
                "fp16 needs loss scaling: overflow skips steps, and tiny hardware or library "
                "differences then change which steps are skipped, so runs part early",
                "use fp32 (exact) or bf16 (no loss scaling) instead",
            )
        )
    return found


def check_threads(ctx: _Context) -> list[Finding]:
    """The torch thread count is pinned."""
    if ctx.cfg.determinism.threads is not None:
        return []
    return [
        Finding(
            "threads-unpinned",
            "warning",
            f"determinism.threads is null (torch uses {ctx.flags.get('torch_num_threads')} here)",
            "CPU reductions split work by thread count, so a machine with another core count sums in "
            "another order and gets other bits",
            "pin it, e.g. determinism.threads: 2, and use the same value everywhere",
        )
    ]


def check_workers(ctx: _Context) -> list[Finding]:
    """DataLoader worker seeding: reprotune's own loader is seeded; say what other code needs."""
    return [
        Finding(
            "dataloader-workers",
            "info",
            "reprotune draws the data order from its own generator (seed data_order) and seeds DataLoader "
            "workers with seed_worker",
            "a DataLoader with workers but no worker_init_fn or generator gives each worker the same "
            "NumPy/Python RNG stream, or an unseeded one",
            "in your own loaders pass worker_init_fn=reprotune._seeding.seed_worker and "
            "generator=torch_generator(seed)",
        )
    ]


def check_revision(ctx: _Context) -> list[Finding]:
    """A hub model is pinned to a commit."""
    model = ctx.cfg.model
    if model.name.startswith(BUILTIN_PREFIX) or Path(model.name).is_absolute() or Path(model.name).is_dir():
        return []
    if model.revision is None:
        return [
            Finding(
                "model-revision-unpinned",
                "error",
                f"model.name {model.name!r} has no revision",
                "the hub serves the latest commit: new weights or tokenizer files can come between two runs",
                "set model.revision to a 40-hex commit sha from the model's page (Files -> History)",
            )
        ]
    if not _SHA_RE.match(model.revision):
        return [
            Finding(
                "model-revision-not-sha",
                "warning",
                f"model.revision {model.revision!r} is not a commit sha",
                "a branch or tag can be moved to other weights",
                "use the 40-hex commit sha it points to now",
            )
        ]
    return []


def check_git(ctx: _Context) -> list[Finding]:
    """The code is a clean git commit."""
    from reprotune._fingerprint import code_fingerprint

    code = code_fingerprint(ctx.code_dir)
    ctx.extra["code"] = code.to_record()
    if not code.in_git:
        return [
            Finding(
                "git-absent",
                "warning",
                f"{ctx.code_dir} is not in a git work tree",
                "the record cannot name the code a run used, so a rerun cannot check it",
                "run from a git repository (git init && git commit)",
            )
        ]
    if code.dirty:
        parts = []
        if code.diff:
            parts.append("uncommitted changes")
        if code.untracked:
            parts.append(f"{len(code.untracked)} untracked file(s), e.g. {code.untracked[0]}")
        return [
            Finding(
                "git-dirty",
                "warning",
                f"the git tree at {code.root} is dirty: {', '.join(parts)}",
                "a commit alone will not reproduce the run; reprotune saves the diff as code.patch, "
                "but not untracked files",
                "commit (or stash) your changes before the runs you want to reproduce",
            )
        ]
    return []


def check_data(ctx: _Context) -> list[Finding]:
    """The data file is frozen by a split manifest that matches it."""
    cfg = ctx.cfg
    builtin = cfg.data.path.startswith(BUILTIN_PREFIX)
    if cfg.split.manifest is None:
        if builtin:
            return [
                Finding(
                    "data-no-manifest",
                    "info",
                    f"{cfg.data.path} is split at run time (no split.manifest)",
                    "the split is recomputed from the split seed; builtin data is pinned with the package",
                    "freeze it with `reprotune split` and set split.manifest to compare splits across runs",
                )
            ]
        return [
            Finding(
                "data-no-manifest",
                "warning",
                f"data file {cfg.data.path} is not covered by a split manifest",
                "the split is recomputed each run: if the file changes, rows move between train and test "
                "without notice",
                f"run `reprotune split {cfg.data.path} --out split.json` and set split.manifest",
            )
        ]
    from reprotune._manifest import load_manifest

    manifest = Path(cfg.split.manifest)
    try:
        loaded = load_manifest(manifest)
    except InputError as exc:  # missing, not JSON, unknown schema version, damaged
        return [
            Finding(
                "data-manifest-unreadable",
                "error",
                f"split manifest {manifest} cannot be read: {exc.message}",
                "the run cannot check that the data is the data the split was made from",
                "point split.manifest at a manifest written by `reprotune split`",
            )
        ]
    if builtin:
        return []  # the run resolves builtin data and checks it against the manifest itself
    try:
        actual = sha256_file(cfg.data.path)
    except OSError as exc:
        return [
            Finding(
                "data-unreadable",
                "error",
                f"data file {cfg.data.path} cannot be read: {exc}",
                "the run would fail",
                "fix data.path",
            )
        ]
    expected = loaded.dataset_sha256
    if expected != actual:
        return [
            Finding(
                "data-manifest-mismatch",
                "error",
                f"data file {cfg.data.path} (sha256 {actual[:12]}...) is not the file manifest {manifest} "
                f"was made from (sha256 {expected[:12]}..., {loaded.n_rows} rows)",
                "the split indices would point at different rows",
                f"run `reprotune check-split {manifest} {cfg.data.path}` to see what changed",
            )
        ]
    return []


def check_tokenizers(ctx: _Context) -> list[Finding]:
    """TOKENIZERS_PARALLELISM."""
    value = ctx.env.get("TOKENIZERS_PARALLELISM")
    if value is None:
        return [
            Finding(
                "tokenizers-parallelism-unset",
                "info",
                "TOKENIZERS_PARALLELISM is not set",
                "tokenization gives the same ids either way, but the Rust tokenizer's threads compete with "
                "torch's and it warns (or deadlocks) when the process forks",
                "export TOKENIZERS_PARALLELISM=false",
            )
        ]
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return [
            Finding(
                "tokenizers-parallelism-on",
                "warning",
                f"TOKENIZERS_PARALLELISM={value}",
                "the Rust tokenizer's threads oversubscribe the cores torch was pinned to, and forked "
                "workers can deadlock",
                "export TOKENIZERS_PARALLELISM=false",
            )
        ]
    return []


def check_hash_seed(ctx: _Context) -> list[Finding]:
    """PYTHONHASHSEED: str hashing is randomized per process unless set."""
    if ctx.env.get("PYTHONHASHSEED") not in (None, "random"):
        return []
    return [
        Finding(
            "pythonhashseed-random",
            "info",
            "PYTHONHASHSEED is not fixed",
            "iteration order of sets of strings changes between processes; reprotune never relies on it, "
            "but custom code might",
            "export PYTHONHASHSEED=0 if your own code iterates over sets",
        )
    ]


#: Every static check, in report order.
CHECKS: tuple[Check, ...] = (
    check_config,
    check_device,
    check_mode,
    check_gpu_flags,
    check_cublas,
    check_precision,
    check_threads,
    check_workers,
    check_revision,
    check_git,
    check_data,
    check_tokenizers,
    check_hash_seed,
)

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
    "dataloader-workers",
    "model-revision-unpinned",
    "model-revision-not-sha",
    "git-absent",
    "git-dirty",
    "data-no-manifest",
    "data-manifest-unreadable",
    "data-unreadable",
    "data-manifest-mismatch",
    "tokenizers-parallelism-unset",
    "tokenizers-parallelism-on",
    "pythonhashseed-random",
    "probe-identical",
    "probe-differs",
    "probe-failed",
    "probe-skipped",
)


# --- the empirical probe -------------------------------------------------------------------------


def _probe_pass(device: str) -> tuple[str, str]:
    """One seeded forward and backward of a tiny attention model; (loss bits, sha256 of gradients)."""
    import torch
    from torch import nn

    vocab, width, seq, batch = 64, 32, 16, 8
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        torch.manual_seed(1234)
        embed = nn.Embedding(vocab, width)
        proj = nn.Linear(width, 3 * width)
        norm = nn.LayerNorm(width)
        head = nn.Linear(width, vocab)
        dropout = nn.Dropout(0.1)
        model = nn.ModuleDict({"embed": embed, "proj": proj, "norm": norm, "head": head}).to(device)
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        targets = torch.randint(0, vocab, (batch, seq), device=device)
        x = embed(tokens)
        q, k, v = proj(x).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(1, 2) / width**0.5, dim=-1)
        h = norm(dropout(attn @ v) + x)
        logits = head(torch.nn.functional.gelu(h))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        digest = hashlib.sha256()
        for name, param in sorted(model.named_parameters()):
            assert param.grad is not None  # every parameter is on the loss's path, by construction
            digest.update(name.encode())
            digest.update(param.grad.detach().cpu().contiguous().numpy().tobytes())
        return float(loss.item()).hex(), digest.hexdigest()


def run_probe(device: str) -> tuple[dict[str, Any], Finding]:
    """Run :func:`_probe_pass` twice under the flags in force; compare every bit.

    Returns:
        (result dict, the finding that reports it).
    """
    try:
        first = _probe_pass(device)
        second = _probe_pass(device)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            {"device": device, "status": "failed", "error": message},
            Finding(
                "probe-failed",
                "error",
                f"the probe failed on {device}: {message}",
                "an op the training step needs raised under this mode: a real run would fail the same way",
                "read the message: strict mode names the op without a deterministic implementation",
            ),
        )
    result = {
        "device": device,
        "status": "identical" if first == second else "differs",
        "loss": [first[0], second[0]],
        "grads_sha256": [first[1], second[1]],
    }
    if first == second:
        return result, Finding(
            "probe-identical",
            "info",
            f"probe: two forward+backward passes on {device} gave identical bits (loss {first[0]})",
            "the numeric stack repeats itself on this machine under this mode",
            "nothing to do",
        )
    return result, Finding(
        "probe-differs",
        "error",
        f"probe: two identical forward+backward passes on {device} gave different bits "
        f"(loss {first[0]} vs {second[0]})",
        "this setup does not repeat itself: two runs of the same config will differ",
        "set determinism.mode: strict and fix the other error-level findings, then rerun doctor",
    )


# --- the doctor ----------------------------------------------------------------------------------


@contextmanager
def _torch_state_preserved() -> Iterator[None]:
    """Restore torch's determinism flags, thread count and CUBLAS_WORKSPACE_CONFIG afterwards."""
    import torch

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.allow_tf32,
        torch.backends.cuda.matmul.allow_tf32,
        torch.get_float32_matmul_precision(),
        torch.get_num_threads(),
        os.environ.get(CUBLAS_ENV),
    )
    try:
        yield
    finally:
        det, warn_only, cudnn_det, bench, cudnn_tf32, mm_tf32, precision, threads, cublas = saved
        torch.use_deterministic_algorithms(det, warn_only=warn_only)
        torch.backends.cudnn.deterministic = cudnn_det
        torch.backends.cudnn.benchmark = bench
        torch.backends.cudnn.allow_tf32 = cudnn_tf32
        torch.backends.cuda.matmul.allow_tf32 = mm_tf32
        torch.set_float32_matmul_precision(precision)
        torch.set_num_threads(threads)
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
) -> DoctorReport:
    """Audit ``config`` (or the defaults) and this machine for what can break reproducibility.

    The config's determinism mode is applied (as ``reprotune run`` would) to read back the flags
    it puts in force and to run the probe; torch's flags are restored before returning.

    Args:
        config: the experiment config; None audits the defaults.
        config_source: where the config came from, for the report.
        code_dir: the directory whose git state is checked.
        probe: run the empirical probe.
        env: environment variables to check (default ``os.environ``).

    Returns:
        The :class:`DoctorReport`; its ``exit_code`` is 1 when an error-level finding exists.
    """
    from reprotune._determinism import apply_determinism, resolve_device

    cfg = config if config is not None else ExperimentConfig()
    det = cfg.determinism
    with _torch_state_preserved():
        try:
            device: str = resolve_device(det.device)
            device_ok = True
        except InputError:
            device, device_ok = det.device, False
        flags = apply_determinism(det.mode, det.threads, device if device_ok else "cpu")
        ctx = _Context(
            cfg=cfg,
            has_config=config is not None,
            device=device,
            device_ok=device_ok,
            flags=flags,
            env=os.environ if env is None else env,
            code_dir=Path(code_dir),
        )
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

"""The doctor's static checks, one small function per thing that can break reproducibility, on the
config, the flags its mode puts in force, the environment, git and the data; each :class:`Finding`
says how bad it is, why and the fix. Every check is a function of a :class:`Context` in
:data:`CHECKS`, in report order; a new one's codes go in ``FINDING_CODES`` and docs/doctor.md.
"""

from __future__ import annotations

import re
from pathlib import Path

from reprotune._builtins import BUILTIN_PREFIX
from reprotune._determinism.flags import CUBLAS_DETERMINISTIC_VALUES, CUBLAS_ENV
from reprotune._doctor.data_checks import check_columns, check_data
from reprotune._doctor.dist_checks import check_nccl, check_ranks
from reprotune._doctor.findings import Check, Context
from reprotune._doctor.kernel_checks import check_cpu_kernels, check_mlflow_store, check_stack
from reprotune._model.loading import refuse_revision
from reprotune._run.findings import Finding
from reprotune._run.fingerprint import code_fingerprint, own_outputs

_SHA_RE = re.compile(r"^[0-9a-f]{40}$")

# --- checks --------------------------------------------------------------------------------------


def check_config(ctx: Context) -> list[Finding]:
    """No config: say that the defaults were audited."""
    if ctx.has_config:
        return []
    return [
        Finding(
            "no-config",
            "info",
            "no config given: audited the default config"
            + (f" with --set {', '.join(ctx.overrides)}" if ctx.overrides else ""),
            "config-specific checks (model revision, data, precision) describe the defaults only",
            "run `reprotune doctor CONFIG` on the config you will train with",
        )
    ]


def check_device(ctx: Context) -> list[Finding]:
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


def check_mode(ctx: Context) -> list[Finding]:
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


def check_gpu_flags(ctx: Context) -> list[Finding]:
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


def check_cublas(ctx: Context) -> list[Finding]:
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


def check_precision(ctx: Context) -> list[Finding]:
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


def check_threads(ctx: Context) -> list[Finding]:
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


def check_workers(ctx: Context) -> list[Finding]:
    """DataLoader worker seeding: reprotune uses no DataLoader (its data order has its own
    generator); say what other code needs."""
    return [
        Finding(
            "dataloader-workers",
            "info",
            "reprotune draws the data order from its own generator (seed data_order); it uses no "
            "DataLoader workers",
            "torch seeds each DataLoader worker from a base seed drawn from the loader's generator, "
            "torch's global one when none is given: the workers' seeds then repeat only while every "
            "draw from it before the loader starts does",
            "in your own loaders pass worker_init_fn=reprotune.seed_worker and "
            "generator=reprotune.torch_generator(seed)",
        )
    ]


def check_revision(ctx: Context) -> list[Finding]:
    """A hub model is pinned to a commit."""
    model = ctx.cfg.model
    if model.name.startswith(BUILTIN_PREFIX) or Path(model.name).is_absolute() or Path(model.name).is_dir():
        refuse_revision(model.name, model.revision, "not a hub id")  # as the run does: bad input, exit 2
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


def check_git(ctx: Context) -> list[Finding]:
    """The code is a clean git commit."""

    # The run's own outputs are no code, as the run records it: its MLflow store and artifacts.
    code = code_fingerprint(ctx.code_dir, outputs=own_outputs(ctx.cfg.resolve_paths(), Path("runs")))
    ctx.extra["code"] = code.to_record()
    if not code.in_git:
        refused = f" (git: {_shown(code.git_error.splitlines()[0])})" if code.git_error else ""
        return [
            Finding(
                "git-absent",
                "warning",
                f"{_shown(str(ctx.code_dir))} is not in a git work tree{refused}",
                "the record cannot name the code a run used, so a rerun cannot check it",
                "run from a git repository (git init && git commit)"
                + (
                    "; if git distrusts the repository's owner: git config --global --add safe.directory DIR"
                    if "safe.directory" in (code.git_error or "")
                    else ""
                ),
            )
        ]
    if code.commit is None:
        return [
            Finding(
                "git-no-commit",
                "warning",
                f"the git repository at {_shown(str(code.root))} has no commit yet",
                "the record cannot name the code a run used, so a rerun cannot check it",
                "commit the code (git add -A && git commit) before the runs you want to reproduce",
            )
        ]
    if code.dirty:
        parts = []
        if code.diff:
            parts.append("uncommitted changes")
        if code.untracked:
            parts.append(f"{len(code.untracked)} untracked file(s), e.g. {_shown(code.untracked[0])}")
        return [
            Finding(
                "git-dirty",
                "warning",
                f"the git tree at {_shown(str(code.root))} is dirty: {', '.join(parts)}",
                "a commit alone will not reproduce the run; reprotune saves the diff as code.patch, "
                "but not untracked files",
                "commit (or stash) your changes before the runs you want to reproduce",
            )
        ]
    return []


def _shown(name: str) -> str:
    """A file name as a finding shows it: one that is not UTF-8 (its bytes, held as surrogates)
    with its escapes, which a text or JSON report can write."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_tokenizers(ctx: Context) -> list[Finding]:
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
    # As the tokenizers library reads it: every value but these turns its threads on.
    if value.lower() not in ("", "off", "false", "f", "no", "n", "0"):
        return [
            Finding(
                "tokenizers-parallelism-on",
                "warning",
                f"TOKENIZERS_PARALLELISM={value}",
                "the Rust tokenizer's threads oversubscribe torch's pinned cores; forks can deadlock",
                "export TOKENIZERS_PARALLELISM=false",
            )
        ]
    return []


def check_hash_seed(ctx: Context) -> list[Finding]:
    """PYTHONHASHSEED: str hashing is randomized per process unless set."""
    if ctx.env.get("PYTHONHASHSEED") not in (None, "", "random"):  # empty: Python randomizes too
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
    check_cpu_kernels,
    check_stack,
    check_mlflow_store,
    check_workers,
    check_revision,
    check_git,
    check_data,
    check_columns,
    check_tokenizers,
    check_hash_seed,
    check_nccl,
    check_ranks,
)

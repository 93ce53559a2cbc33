"""Secrets kept out of everything reprotune writes: environment variables, URLs, query strings.

A variable whose name looks secret (``HF_TOKEN``, ``WANDB_API_KEY``), or whose value holds a
token-shaped string whatever its name (``WANDB_NOTES=ghp_...``), is recorded as :data:`REDACTED`;
every other recorded value has URL credentials (``https://user:pass@host``) and secret-looking
query parameters masked (``_config.secrets``, the one place that knows what a secret looks like).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from reprotune._config.secrets import mask_url_credentials, token_shape

REDACTED = "***REDACTED***"

#: Environment variables whose name starts with one of these (or equals one) are recorded.
ENV_PREFIXES: tuple[str, ...] = (
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "NCCL_",
    "NVIDIA_",
    "PYTHONHASHSEED",
    "PYTHONPATH",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOTO_",
    "TOKENIZERS_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "ACCELERATE_",
    "SAFETENSORS_",
    "MLFLOW_",
    "WANDB_",
    "TORCH_",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "REPROTUNE_",
    "LD_PRELOAD",
)

# A name is secret when one of its words (split on _ . -) ends with one of the suffixes or is one
# of the words. Word-wise, so TOKENIZERS_PARALLELISM stays visible while HF_TOKEN, HFTOKEN and
# WANDB_API_KEY do not. Over-redacting costs nothing; leaking costs a credential.
_SECRET_SUFFIXES = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH")
_SECRET_WORDS = (
    "PASS", "PWD", "AUTHORIZATION", "COOKIE", "SESSION", "SIGNATURE", "SIG", "PRIVATE", "CREDS", "PAT",
    "USERNAME",
)  # fmt: skip
# --- secrets -----------------------------------------------------------------------------------


def is_secret_name(name: str) -> bool:
    """True when an environment variable's name looks like it holds a secret."""
    words = [w for w in re.split(r"[_.\-]", name.upper()) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words)


def redact_env(env: Mapping[str, str], prefixes: Iterable[str] = ENV_PREFIXES) -> dict[str, str]:
    """The relevant variables of ``env``, with secrets redacted.

    Args:
        env: e.g. ``os.environ``.
        prefixes: a variable is kept when its name starts with one of these.

    Returns:
        name -> value, sorted by name; a secret-looking name's value, or a value holding a
        token-shaped string, is :data:`REDACTED`, and every other value has URL credentials and
        secret query parameters masked.
    """
    wanted = tuple(prefixes)
    out = {}
    for name in sorted(env):
        if not name.startswith(wanted):
            continue
        secret = is_secret_name(name) or token_shape(env[name]) is not None
        out[name] = REDACTED if secret else mask_url_credentials(env[name])
    return out

"""How ``compare`` tells a difference of library stack as a cause: the environment's differences
ranked with the libraries that compute a step first, and the base model's config files and the
buffers the library computed from them at load. No torch."""

from __future__ import annotations

from reprotune._proof.cause_texts import MAX_SHOWN, value_text
from reprotune._proof.differences import Difference
from reprotune._run.stack import COMPUTING_LIBRARIES

BUFFERS_PREFIX = "model.buffers."  # the record keys of the model's buffers
_DISTRIBUTIONS = "environment.distributions."
TRANSFORMERS_KEY = f"{_DISTRIBUTIONS}transformers"
# Environment keys that most often change numbers after the computing libraries, in that order:
# torch's own facts, the GPU stack, threads, determinism flags (matched as substrings).
_ENV_PRIORITY = ("torch", "cuda", "cudnn", "gpu", "driver", "thread", "determin")
#: How the two causes of this module begin (``causes.is_traceable_cause`` reads them).
LIBRARIES_CAUSE = "the libraries that compute the step differ"
BUFFER_CAUSE = "a buffer the base model computed from its config at load differs"
# What restates a torch version the distributions name already.
_TORCH_VERSION_KEYS = frozenset({"environment.torch.version", "environment.torch.git_version"})


def is_computing_library(diff: Difference) -> bool:
    """Whether ``diff`` is the version of one of ``COMPUTING_LIBRARIES``."""
    return (
        diff.key.startswith(_DISTRIBUTIONS) and diff.key.removeprefix(_DISTRIBUTIONS) in COMPUTING_LIBRARIES
    )


def libraries_text(diffs: list[Difference]) -> str:
    """'the libraries that compute the step differ: transformers 5.24.0 vs 4.56.0; ...', and then
    the torch, GPU, thread and determinism facts that differ too (``_ENV_PRIORITY``); ``diffs``
    ranked by :func:`env_rank`."""
    libraries = [d for d in diffs if is_computing_library(d)]
    shown = [f"{key_label(d)} {pair_text(d)}" for d in libraries[:MAX_SHOWN]]
    facts = [
        d
        for d in diffs
        if d not in libraries
        and any(word in d.key.lower() for word in _ENV_PRIORITY)
        and d.key not in _TORCH_VERSION_KEYS
    ]
    also = [f"{key_label(d)} {pair_text(d)}" for d in facts[:MAX_SHOWN]]
    rest = len(diffs) - len(shown) - len(also)
    return (
        f"{LIBRARIES_CAUSE}: {'; '.join(shown)}"
        + (f"; and {'; '.join(also)}" if also else "")
        + (f" (and {rest} more environment differences)" if rest > 0 else "")
    )


def pair_text(diff: Difference) -> str:
    return f"{value_text(diff.a, diff.change == 'added')} vs {value_text(diff.b, diff.change == 'removed')}"


def model_files_text(diffs: list[Difference], reader: Difference | None) -> str:
    """A config file of the base model differs, or a buffer the library computed from it at load
    (the same file read otherwise: ``reader``, the transformers versions, when they differ)."""
    texts = []
    files = [d for d in diffs if d.key.startswith("model.config_files.")]
    files = files or [d for d in diffs if not d.key.startswith(BUFFERS_PREFIX)]
    if files:
        named = [f"{d.key.removeprefix('model.config_files.')} {pair_text(d)}" for d in files[:MAX_SHOWN]]
        shown = "; ".join(named)
        texts.append(f"a file that defines the base model's computation differs: {shown}")
    buffers = sorted(
        (d for d in diffs if d.key.startswith(BUFFERS_PREFIX)), key=lambda d: d.change != "changed"
    )
    if buffers:
        shown = "; ".join(f"{d.key.removeprefix(BUFFERS_PREFIX)} {pair_text(d)}" for d in buffers[:MAX_SHOWN])
        how = f"transformers {pair_text(reader)}" if reader else "the library"
        how += " read them otherwise"
        why = "" if files else f" (with equal config files: {how})"
        texts.append(f"{BUFFER_CAUSE}{why}: {shown}")
    return "; ".join(texts)


def key_label(diff: Difference) -> str:
    """The key path, without the section name where it only repeats the category."""
    key = diff.key
    if diff.category == "environment":
        key = key.removeprefix("environment.")
        key = key.removeprefix("packages.").removeprefix("distributions.")
    return key


def env_rank(diff: Difference) -> tuple[int, str]:
    """The libraries that compute a step first (in ``COMPUTING_LIBRARIES``' order), then torch's,
    the GPU stack's, thread and determinism facts (``_ENV_PRIORITY``), Python, the other
    distributions, the rest."""
    key = diff.key.lower()
    name = key.removeprefix(_DISTRIBUTIONS)
    if name != key and name in COMPUTING_LIBRARIES:
        return COMPUTING_LIBRARIES.index(name), key
    for rank, word in enumerate(_ENV_PRIORITY, start=len(COMPUTING_LIBRARIES)):
        if word in key:
            return rank, key
    after = len(COMPUTING_LIBRARIES) + len(_ENV_PRIORITY)
    if key.startswith("environment.python."):
        return after, key
    return (after + 1 if name != key else after + 2), key

"""An eval's generation settings, and which recorded facts make up its identity.

The settings come from the run's resolved config (section ``eval``, docs/config.md), with the
``--set eval.KEY=VALUE`` overrides of ``reprotune eval`` applied and checked by the config's own
schema. Sampling draws each row from its own generator, seeded by :func:`row_seed` from the
``eval`` derived seed and the row's index in the data, so a row's output never depends on the
rows that share its batch. Pure Python: nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reprotune._config.schema import ExperimentConfig
from reprotune._determinism.seeds import mixed_seed
from reprotune._jsonio import canonical_sha256
from reprotune._run.record import RunRecord

#: The version of :func:`row_seed`: records depend on it, so it never changes meaning.
ROW_SEED_RULE = "sha256('reprotune/eval-row/v1/<eval seed>/<row index>')[:8] big-endian & (2**63-1)"

_ROW_SEED_PREFIX = "reprotune/eval-row/v1"


def row_seed(eval_seed: int, row_index: int) -> int:
    """The seed of one row's sampling generator: a function of the eval seed and the row alone.

    Example:
        >>> row_seed(7, 12) == row_seed(7, 12) != row_seed(8, 12)
        True
    """
    return mixed_seed(_ROW_SEED_PREFIX, eval_seed, row_index)


@dataclass(frozen=True)
class GenerationSettings:
    """How each token is chosen, and how many.

    Attributes:
        decoding: ``greedy`` or ``sample``.
        temperature, top_k, top_p: the sampling warpers (applied in that order, as transformers
            does); unused when greedy.
        max_new_tokens: the most tokens generated per row; a row stops earlier at its first eos.
        eval_seed: the ``eval`` derived seed (rows' sampling seeds come from it).
    """

    decoding: str
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    eval_seed: int

    @classmethod
    def from_config(cls, config: ExperimentConfig, seeds: Mapping[str, int]) -> GenerationSettings:
        """The settings of ``config.eval``, with the ``eval`` seed of ``seeds``."""
        section = config.eval
        return cls(
            decoding=section.decoding,
            temperature=float(section.temperature),
            top_k=int(section.top_k),
            top_p=float(section.top_p),
            max_new_tokens=int(section.max_new_tokens),
            eval_seed=int(seeds["eval"]),
        )

    @property
    def sampling(self) -> bool:
        return self.decoding == "sample"

    def to_json(self) -> dict[str, Any]:
        """The settings as the eval record keeps them (sampling fields are null when greedy)."""
        return {
            "decoding": self.decoding,
            "temperature": self.temperature if self.sampling else None,
            "top_k": self.top_k if self.sampling else None,
            "top_p": self.top_p if self.sampling else None,
            "max_new_tokens": self.max_new_tokens,
            "eval_seed": self.eval_seed,
            "row_seed_rule": ROW_SEED_RULE if self.sampling else None,
            "warper_order": ["temperature", "top_k", "top_p"] if self.sampling else None,
        }


#: Keys of an eval record's ``generation`` section that change what is generated. ``batch_size``
#: joins them when the eval is not batch-invariant; ``eval_seed`` when it samples.
GENERATION_IDENTITY: tuple[str, ...] = (
    "decoding",
    "temperature",
    "top_k",
    "top_p",
    "max_new_tokens",
    "eos_token_ids",
    "pad_token_id",
    "prompt",
    "dtype",
    "attention",
    "row_quantum",  # evals made before the GEMM blocks padded batches to a row quantum instead
    "gemm_blocks",
    "merged_adapter",
)


def generation_identity(generation: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a ``generation`` section that decides the outputs (see :data:`GENERATION_IDENTITY`)."""
    keys = list(GENERATION_IDENTITY)
    if generation.get("decoding") == "sample":
        keys.append("eval_seed")
    if not generation.get("batch_invariant"):
        keys.append("batch_size")
    return {key: generation.get(key) for key in keys}


def identity_sha256(parts: Mapping[str, Any]) -> str:
    """sha256 of the canonical compact JSON of an eval's identity parts."""
    return canonical_sha256(dict(parts))


def wants_eval_at_end(record: RunRecord) -> bool:
    """Whether a run's resolved config asks for ``eval.generate_at_end`` (light: no torch)."""
    section = record.config.get("eval") or {}
    return bool(section.get("generate_at_end"))

"""An eval's prompts, encoded exactly as training encoded them, and what was cut to fit.

Training cuts a sequence too long for ``model.max_length`` from the prompt's start
(``_train.batches.truncate``), keeping the response; with an empty response (an eval's), that is
the end-of-turn tokens the template puts after it (the chat template's end of turn, or the eos
token after a plain template). So a prompt keeps at most ``model.max_length`` less those tokens,
and a longer one loses its start: the system turn and the user header first. The eval encodes
each prompt without a limit and cuts it with training's own cut, counting the rows that were cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from reprotune._config.schema import ExperimentConfig
from reprotune._errors import InputError
from reprotune._eval.inputs import EvalRow
from reprotune._train.batches import IGNORE_INDEX, encode_example, truncate

#: No limit: the prompt whole, before training's cut (``_train.batches.truncate``).
_NO_LIMIT = 2**62
_SHOWN_ROWS = 10


@dataclass(frozen=True)
class EncodedPrompt:
    """A row's prompt ids as training encoded them.

    Attributes:
        index: the row's index in the data.
        ids: the prompt's token ids, cut from the start to fit.
        cut: how many tokens its start lost (0: none).
        limit: the most prompt tokens that fit: ``model.max_length`` less the end-of-turn tokens.
    """

    index: int
    ids: tuple[int, ...]
    cut: int
    limit: int


def encode_prompt(tokenizer: Any, row: EvalRow, cfg: ExperimentConfig) -> EncodedPrompt:
    """The row's prompt ids exactly as training encoded them (chat template or prompt template,
    system prompt, cut from the start to fit): the tokens before the response, taken from the
    training encoder with an empty response and no limit, then cut by the training cut
    (``_train.batches.truncate``, which ``encode_example`` applies), so the cut is counted.

    Raises:
        InputError: the prompt keeps no token within ``model.max_length``.
    """

    ids, labels = encode_example(
        tokenizer,
        row.prompt,
        "",
        system_prompt=cfg.data.system_prompt,
        prompt_template=cfg.data.prompt_template,
        max_length=_NO_LIMIT,
        row_index=row.index,
        source=str(cfg.data.path),
        prompt_field=cfg.data.prompt_field,
        response_field=cfg.data.response_field,
    )
    whole = [int(t) for t, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX]
    end_of_turn = [int(t) for t, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    prompt, _ = truncate(whole, end_of_turn, cfg.model.max_length)  # as encode_example cuts it
    if not prompt:
        raise InputError(
            f"row {row.index}: the prompt encodes to no tokens within model.max_length "
            f"{cfg.model.max_length}",
            source=f"{cfg.data.path}, row {row.index}",
            fix="train with a larger model.max_length",
        )
    return EncodedPrompt(
        row.index, tuple(prompt), len(whole) - len(prompt), cfg.model.max_length - len(end_of_turn)
    )


def prompt_truncation(
    encoded: Sequence[EncodedPrompt], max_length: int, report: Callable[[str], None] | None
) -> dict[str, Any]:
    """The eval record's ``generation.prompt_truncation``: how many prompts were cut from their
    start to fit (``truncated_rows``) and which (``rows``, their indices, sorted), said once on
    ``report`` when any was. ``predictions.jsonl`` is not touched (its bytes are an identity
    compared across evals; its ``prompt_tokens`` are the tokens kept)."""
    cut = sorted(p.index for p in encoded if p.cut > 0)
    if cut and report is not None:
        fit = " or ".join(str(n) for n in sorted({p.limit for p in encoded if p.cut > 0}))
        more = len(cut) - _SHOWN_ROWS
        shown = ", ".join(str(i) for i in cut[:_SHOWN_ROWS]) + (f", ... ({more} more)" if more > 0 else "")
        report(
            f"warning: {len(cut)} of {len(encoded)} prompts were cut from their start to fit {fit} tokens "
            f"(model.max_length {max_length} less the end-of-turn tokens training puts after the "
            "response), as training cut them: the system turn and user header go first; "
            f"rows {shown} (eval.json: generation.prompt_truncation)"
        )
    return {"truncated_rows": len(cut), "rows": cut}

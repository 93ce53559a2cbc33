"""Turning prompt/response rows into token ids and loss labels, and padding them into batches.

The loss covers the response only: every prompt token (system prompt, user turn, the
template's opening of the assistant turn) gets the label ``-100``, which PyTorch's
cross-entropy ignores. :class:`Examples` serves a run's rows encoded on first use (tokenisation
happens after the split, and only on the rows a run reads); the rest are pure functions.
"""

from __future__ import annotations

import string
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from reprotune._data.table import not_text
from reprotune._errors import InputError

if TYPE_CHECKING:
    import torch

    from reprotune._config.schema import ExperimentConfig
    from reprotune._train.data import RunData

#: The label of a token the loss ignores (``torch.nn.CrossEntropyLoss``'s ``ignore_index``).
IGNORE_INDEX = -100

_TEMPLATE_FIELDS = frozenset({"prompt", "system"})


def _where(row_index: int | None, source: str | None) -> str | None:
    """``"data.jsonl, row 12"``-style location for messages, or None when nothing is known."""
    parts = [part for part in (source, f"row {row_index}" if row_index is not None else None) if part]
    return ", ".join(parts) or None


def _check_text(value: object, field: str, row_index: int | None, source: str | None) -> str:
    if isinstance(value, str):
        return value
    raise InputError(
        f"field {field!r} is {not_text(value)}",
        source=_where(row_index, source),
        fix=f"give every row a string {field!r} field (or point the data config at the right field name)",
    )


def check_prompt_template(prompt_template: str) -> list[str]:
    """The fields of a plain prompt template, checked.

    A template is a ``str.format`` string with ``{prompt}`` and optionally ``{system}``;
    literal braces are written ``{{`` and ``}}``.

    Raises:
        InputError: a malformed template, an unknown field, or no ``{prompt}``.
    """
    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(prompt_template) if name is not None]
    except ValueError as exc:
        raise InputError(
            f"prompt template {prompt_template!r} is malformed: {exc}",
            source="data.prompt_template",
            fix="write literal braces as {{ and }}",
        ) from exc
    unknown = sorted(set(fields) - _TEMPLATE_FIELDS)
    if unknown or "prompt" not in fields:
        problem = f"has unknown fields {unknown}" if unknown else "has no {prompt} field"
        raise InputError(
            f"prompt template {prompt_template!r} {problem}",
            source="data.prompt_template",
            fix="use {prompt} (required) and {system} (optional); write literal braces as {{ and }}",
        )
    return fields


def _encode(tokenizer: Any, text: str) -> list[int]:
    # Special tokens are already in the rendered text (or added explicitly below): never twice.
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_parts(tokenizer: Any, prompt: str, response: str, system_prompt: str | None) -> tuple[str, str]:
    """(prompt text up to the opening of the assistant turn, the rest of the conversation).

    Raises:
        InputError: the chat template does not render (a jinja syntax error, or the template's own
            ``raise_exception``), or renders the prompt other than as a prefix of the conversation.
    """
    from jinja2 import TemplateError

    messages = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    messages.append({"role": "user", "content": prompt})
    try:
        prompt_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full_text = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": response}],
            tokenize=False,
            add_generation_prompt=False,
        )
    except TemplateError as exc:
        raise InputError(
            f"the tokenizer's chat template cannot render a conversation: {type(exc).__name__}: {exc}",
            source="model.name (the tokenizer's chat template)",
            fix="restore the tokenizer files (chat_template.jinja, tokenizer_config.json) as the model "
            "came with them; for an eval, the run's own (model.tokenizer_files in record.json)",
        ) from None
    if not full_text.startswith(prompt_text):
        raise InputError(
            "the tokenizer's chat template does not render the prompt as a prefix of the full "
            "conversation, so the response tokens cannot be told apart",
            source="model.name",
            fix="use a model whose chat template renders turns in order, or format without the chat template",
        )
    return prompt_text, full_text[len(prompt_text) :]


def _plain_parts(
    tokenizer: Any, prompt: str, response: str, system_prompt: str | None, prompt_template: str
) -> tuple[list[int], list[int]]:
    fields = check_prompt_template(prompt_template)
    text = prompt_template.format(prompt=prompt, system=system_prompt or "")
    if system_prompt and "system" not in fields:
        text = f"{system_prompt}\n\n{text}"  # never drop a configured system prompt silently
    if tokenizer.eos_token_id is None:
        raise InputError(
            "the tokenizer has no eos token to end the response with",
            source="model.name",
            fix="use a tokenizer with an eos token, or one with a chat template",
        )
    bos = [int(tokenizer.bos_token_id)] if tokenizer.bos_token_id is not None else []
    return bos + _encode(tokenizer, text), [*_encode(tokenizer, response), int(tokenizer.eos_token_id)]


def truncate(prompt_ids: list[int], response_ids: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """Fit prompt + response into ``max_length`` tokens, keeping at least one response token.

    The prompt loses tokens from its start first (its end, which opens the assistant turn, is
    the context that matters most); only when the response alone is longer than ``max_length``
    is the prompt dropped entirely and the response cut from its end.

    Returns:
        ``(prompt_ids, response_ids)``, shortened.
    """
    if len(prompt_ids) + len(response_ids) <= max_length:
        return prompt_ids, response_ids
    keep_prompt = max(0, max_length - len(response_ids))
    kept_prompt = prompt_ids[len(prompt_ids) - keep_prompt :] if keep_prompt else []
    return kept_prompt, response_ids[: max_length - keep_prompt]


def encode_example(
    tokenizer: Any,
    prompt: str,
    response: str,
    *,
    system_prompt: str | None,
    prompt_template: str,
    max_length: int,
    use_chat_template: bool | None = None,
    row_index: int | None = None,
    source: str | None = None,
    prompt_field: str = "prompt",
    response_field: str = "response",
) -> tuple[list[int], list[int]]:
    """Token ids and labels for one prompt/response pair; labels are -100 except on the response.

    With a chat template (the tokenizer's, used when it has one unless ``use_chat_template`` is
    False), the conversation [system?, user, assistant] is rendered twice: up to the opening of
    the assistant turn (``add_generation_prompt=True``), and in full. The prompt tokens are the
    first rendering; the response tokens are the rest (the response and the template's end of
    turn). Each part is tokenized on its own, so the boundary is exact.

    Without one, the prompt is ``prompt_template.format(prompt=..., system=...)`` after the bos
    token (when the tokenizer has one); the response is the response text and the eos token.
    A system prompt with no ``{system}`` field in the template goes first, then a blank line.

    Sequences longer than ``max_length`` are cut as :func:`truncate` says.

    Args:
        tokenizer: a transformers tokenizer.
        prompt: the user's turn. Checked to be a string (a missing field arrives as None).
        response: the assistant's answer, which the loss covers. Checked likewise.
        system_prompt: an optional system turn.
        prompt_template: the plain template, used without a chat template.
        max_length: the most tokens the example may have (>= 1).
        use_chat_template: None to use the tokenizer's chat template when it has one; True to
            require it; False to use ``prompt_template``.
        row_index, source, prompt_field, response_field: where the row came from and its field
            names, for error messages only.

    Returns:
        ``(input_ids, labels)`` of equal length, at least one label not -100.

    Raises:
        InputError: a field missing or not a string; ``max_length`` < 1; a bad template; a
            chat template required but absent; no eos token without a chat template.
    """
    prompt = _check_text(prompt, prompt_field, row_index, source)
    response = _check_text(response, response_field, row_index, source)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise InputError(
            f"max_length {max_length!r} must be a whole number >= 1",
            source="train.max_length",
            fix="set a max_length of at least the longest prompt plus one token",
        )
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if use_chat_template and not has_template:
        raise InputError(
            "a chat template was asked for but the tokenizer has none",
            source="model.name",
            fix="use a prompt template instead, or a model whose tokenizer has a chat template",
        )
    if has_template and use_chat_template is not False:
        prompt_text, response_text = _chat_parts(tokenizer, prompt, response, system_prompt)
        prompt_ids, response_ids = _encode(tokenizer, prompt_text), _encode(tokenizer, response_text)
    else:
        prompt_ids, response_ids = _plain_parts(tokenizer, prompt, response, system_prompt, prompt_template)
    prompt_ids, response_ids = truncate(prompt_ids, response_ids, max_length)
    return prompt_ids + response_ids, [IGNORE_INDEX] * len(prompt_ids) + response_ids


def encode_row(
    tokenizer: Any,
    row: Mapping[str, Any],
    *,
    row_index: int,
    prompt_field: str = "prompt",
    response_field: str = "response",
    system_prompt: str | None,
    prompt_template: str,
    max_length: int,
    use_chat_template: bool | None = None,
    source: str | None = None,
) -> tuple[list[int], list[int]]:
    """:func:`encode_example` on a data row, naming the row and field when one is missing.

    Raises:
        InputError: as :func:`encode_example`; the row is not a JSON object.
    """
    if not isinstance(row, Mapping):
        raise InputError(
            f"row is a {type(row).__name__}, not a JSON object",
            source=_where(row_index, source),
            fix="write one JSON object per line",
        )
    return encode_example(
        tokenizer,
        row.get(prompt_field),  # type: ignore[arg-type]  # checked inside: None means missing
        row.get(response_field),  # type: ignore[arg-type]
        system_prompt=system_prompt,
        prompt_template=prompt_template,
        max_length=max_length,
        use_chat_template=use_chat_template,
        row_index=row_index,
        source=source,
        prompt_field=prompt_field,
        response_field=response_field,
    )


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, pad_token_id: int, padding_side: str
) -> dict[str, torch.Tensor]:
    """Pad encoded examples to the longest of the batch.

    Args:
        examples: ``(input_ids, labels)`` pairs, as :func:`encode_example` returns.
        pad_token_id: the id written into padding positions (never seen by the loss).
        padding_side: ``right`` or ``left``.

    Returns:
        int64 tensors of shape (batch, longest): ``input_ids``; ``attention_mask`` (1 on real
        tokens); ``labels`` (-100 on padding); ``position_ids`` (0, 1, ... over the real tokens
        of each row, so left padding does not shift the rotary positions of a row).

    Raises:
        InputError: no examples, an empty example, ids and labels of unequal length, or a bad
            padding side.
    """
    import torch

    if padding_side not in ("right", "left"):
        raise InputError(
            f"padding side {padding_side!r} is not supported",
            source="model.padding_side",
            fix="use 'right' or 'left'",
        )
    if not examples:
        raise InputError("cannot collate an empty batch", fix="give collate at least one example")
    longest = max(len(ids) for ids, _ in examples)
    rows: dict[str, list[list[int]]] = {
        "input_ids": [],
        "attention_mask": [],
        "labels": [],
        "position_ids": [],
    }
    for index, (ids, labels) in enumerate(examples):
        if not ids or len(ids) != len(labels):
            raise InputError(
                f"example {index} has {len(ids)} ids and {len(labels)} labels",
                fix="pass (input_ids, labels) pairs of equal, non-zero length, as encode_example returns",
            )
        pad = longest - len(ids)
        filled = {
            "input_ids": (list(ids), [pad_token_id] * pad),
            "attention_mask": ([1] * len(ids), [0] * pad),
            "labels": (list(labels), [IGNORE_INDEX] * pad),
            # padding positions get 0: they are masked out, and 0 is a valid rotary position
            "position_ids": (list(range(len(ids))), [0] * pad),
        }
        for key, (real, padding) in filled.items():
            rows[key].append(real + padding if padding_side == "right" else padding + real)
    return {key: torch.tensor(value, dtype=torch.long) for key, value in rows.items()}


class Examples:
    """A run's rows, tokenised on first use and cached.

    Args:
        data: the run's table and split.
        tokenizer: the base model's tokenizer.
        cfg: the config (``data`` fields, templates, ``model.max_length``).
    """

    def __init__(self, data: RunData, tokenizer: Any, cfg: ExperimentConfig) -> None:
        self._data = data
        self._tokenizer = tokenizer
        self._cfg = cfg
        self._cache: dict[int, tuple[list[int], list[int]]] = {}

    def get(self, row: int) -> tuple[list[int], list[int]]:
        """``(input_ids, labels)`` of dataset row ``row``."""
        hit = self._cache.get(row)
        if hit is None:
            hit = encode_row(
                self._tokenizer,
                self._data.table.row(row),
                row_index=row,
                prompt_field=self._cfg.data.prompt_field,
                response_field=self._cfg.data.response_field,
                system_prompt=self._cfg.data.system_prompt,
                prompt_template=self._cfg.data.prompt_template,
                max_length=self._cfg.model.max_length,
                source=self._data.table.source,
            )
            self._cache[row] = hit
        return hit

    def batch(self, rows: list[int], *, pad_token_id: int, padding_side: str) -> dict[str, torch.Tensor]:
        """The padded batch of ``rows``, in that order."""
        return collate([self.get(r) for r in rows], pad_token_id=pad_token_id, padding_side=padding_side)


def micro_batches(rows: list[int], size: int) -> Iterator[list[int]]:
    """``rows`` in consecutive chunks of ``size`` (the last may be shorter)."""
    for start in range(0, len(rows), size):
        yield rows[start : start + size]

"""Tests for reprotune._train.batches: response-only labels, truncation and batch padding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from reprotune._errors import InputError
from reprotune._train.batches import IGNORE_INDEX, collate, encode_example, encode_row, truncate
from reprotune.testing import build_tiny_model, build_tiny_tokenizer


@pytest.fixture(scope="module")
def chat_tok() -> Any:
    """The tiny byte-level tokenizer with its chat template."""
    return build_tiny_tokenizer(chat_template=True)


@pytest.fixture(scope="module")
def plain_tok() -> Any:
    """The tiny byte-level tokenizer without a chat template."""
    return build_tiny_tokenizer(chat_template=False)


def _split(tokenizer: Any, ids: list[int], labels: list[int]) -> tuple[str, str]:
    """(decoded tokens without a label, decoded tokens with one), checking labels copy the ids."""
    prompt = [i for i, label in zip(ids, labels, strict=True) if label == IGNORE_INDEX]
    response = [i for i, label in zip(ids, labels, strict=True) if label != IGNORE_INDEX]
    assert [label for label in labels if label != IGNORE_INDEX] == response
    return tokenizer.decode(prompt), tokenizer.decode(response)


def _encode(tokenizer: Any, prompt: Any, response: Any, **kwargs: Any) -> tuple[list[int], list[int]]:
    options: dict[str, Any] = {"system_prompt": None, "prompt_template": "{prompt}\n", "max_length": 256}
    options.update(kwargs)
    return encode_example(tokenizer, prompt, response, **options)


def test_chat_template_masks_exactly_the_prompt(chat_tok: Any) -> None:
    """With a chat template, the labels cover the response and the end of turn, nothing else."""
    ids, labels = _encode(chat_tok, "hello", "world")
    prompt, response = _split(chat_tok, ids, labels)
    assert prompt == "<s>user\nhello</s>\n<s>assistant\n"
    assert response == "world</s>\n"
    # byte-level: one token per byte, except that each of the two <s> and the one </s> is one token
    n_prompt = len(prompt.encode()) - 2 * (len("<s>") - 1) - (len("</s>") - 1)
    assert labels == [IGNORE_INDEX] * n_prompt + ids[n_prompt:]


def test_chat_template_includes_system_prompt(chat_tok: Any) -> None:
    """A system prompt becomes the first turn, and is masked."""
    ids, labels = _encode(chat_tok, "hi", "yo", system_prompt="be brief")
    prompt, response = _split(chat_tok, ids, labels)
    assert prompt == "<s>system\nbe brief</s>\n<s>user\nhi</s>\n<s>assistant\n"
    assert response == "yo</s>\n"


def test_plain_template_uses_bos_and_eos(plain_tok: Any) -> None:
    """Without a chat template: bos + formatted prompt masked; response + eos labelled."""
    ids, labels = _encode(plain_tok, "2+2?", "4", prompt_template="Q: {prompt}\nA: ")
    assert ids[0] == plain_tok.bos_token_id and ids[-1] == plain_tok.eos_token_id
    assert _split(plain_tok, ids, labels) == ("<s>Q: 2+2?\nA: ", "4</s>")


def test_plain_template_system_prompt(plain_tok: Any) -> None:
    """A {system} field takes the system prompt; without one it goes first, then a blank line."""
    with_field = _encode(plain_tok, "p", "r", system_prompt="S", prompt_template="[{system}] {prompt} ->")
    assert _split(plain_tok, *with_field)[0] == "<s>[S] p ->"
    without = _encode(plain_tok, "p", "r", system_prompt="S", prompt_template="{prompt} ->")
    assert _split(plain_tok, *without)[0] == "<s>S\n\np ->"


def test_chat_template_can_be_bypassed(chat_tok: Any) -> None:
    """use_chat_template=False formats with the plain template even when a chat template exists."""
    ids, labels = _encode(chat_tok, "p", "r", prompt_template="{prompt}=", use_chat_template=False)
    assert _split(chat_tok, ids, labels) == ("<s>p=", "r</s>")


@pytest.mark.parametrize(
    ("template", "said"),
    [
        ("{% for m in messages %}{{ m['content'] }}", "TemplateSyntaxError: Unexpected end of template"),
        ("{{ raise_exception('roles must alternate') }}", "TemplateError: roles must alternate"),
    ],
    ids=["unterminated", "raise-exception"],
)
def test_a_chat_template_that_does_not_render_is_an_input_error(template: str, said: str) -> None:
    """A broken chat template raised jinja2's error (an internal error, exit 1); it is an
    InputError naming the chat template, with the fix."""
    tokenizer = build_tiny_tokenizer(chat_template=True)
    tokenizer.chat_template = template
    with pytest.raises(InputError, match="the tokenizer's chat template cannot render") as info:
        _encode(tokenizer, "p", "r")
    assert said in str(info.value) and info.value.source == "model.name (the tokenizer's chat template)"
    assert "restore the tokenizer files" in str(info.value.fix)


def test_chat_template_required_but_absent(plain_tok: Any) -> None:
    """use_chat_template=True with a tokenizer that has none is an InputError."""
    with pytest.raises(InputError, match="chat template"):
        _encode(plain_tok, "p", "r", use_chat_template=True)


@pytest.mark.parametrize(
    "template",
    ["{prompt} {foo}", "no field", "{prompt", "{}"],
    ids=["unknown", "no-prompt", "open", "positional"],
)
def test_bad_prompt_template(plain_tok: Any, template: str) -> None:
    """A malformed template or one without {prompt} is an InputError naming it."""
    with pytest.raises(InputError) as info:
        _encode(plain_tok, "p", "r", prompt_template=template)
    assert info.value.source == "data.prompt_template"
    assert repr(template) in str(info.value)


def test_truncation_cuts_prompt_from_the_left(chat_tok: Any) -> None:
    """A long prompt loses its start; the response and the assistant opening stay whole."""
    full_ids, _ = _encode(chat_tok, "x" * 50, "answer")
    ids, labels = _encode(chat_tok, "x" * 50, "answer", max_length=30)
    assert len(ids) == 30
    assert ids == full_ids[-30:]
    prompt, response = _split(chat_tok, ids, labels)
    assert response == "answer</s>\n"
    assert prompt.endswith("xx</s>\n<s>assistant\n")


def test_truncation_keeps_a_response_token(chat_tok: Any) -> None:
    """When the response alone is too long, it is cut from its end and at least one token stays."""
    for max_length in (1, 3, 5):
        ids, labels = _encode(chat_tok, "hello", "a long response", max_length=max_length)
        assert len(ids) == max_length
        assert all(label != IGNORE_INDEX for label in labels)
        assert chat_tok.decode(ids) == "a long response"[:max_length]


@pytest.mark.parametrize(
    ("n_prompt", "n_response", "max_length", "kept"),
    [(3, 2, 5, (3, 2)), (3, 2, 4, (2, 2)), (3, 2, 2, (0, 2)), (3, 4, 2, (0, 2)), (0, 1, 1, (0, 1))],
    ids=["fits", "cut-prompt", "no-prompt", "cut-response", "minimal"],
)
def test_truncate_rule(n_prompt: int, n_response: int, max_length: int, kept: tuple[int, int]) -> None:
    """truncate keeps the prompt's end and the response's start, in that order of sacrifice."""
    prompt, response = list(range(n_prompt)), list(range(100, 100 + n_response))
    new_prompt, new_response = truncate(prompt, response, max_length)
    assert (len(new_prompt), len(new_response)) == kept
    assert new_prompt == prompt[n_prompt - kept[0] :]
    assert new_response == response[: kept[1]]


@pytest.mark.parametrize("bad", [0, -3, True, 2.5], ids=["zero", "negative", "bool", "float"])
def test_bad_max_length(chat_tok: Any, bad: Any) -> None:
    """max_length below 1 or not a whole number is an InputError."""
    with pytest.raises(InputError, match="max_length"):
        _encode(chat_tok, "p", "r", max_length=bad)


@pytest.mark.parametrize(
    ("row", "message"),
    [({"response": "r"}, "field 'prompt' is missing"),
     ({"prompt": "p", "response": 3}, r"'response' is a number \(3\), not text"),
     ({"prompt": ["p"], "response": "r"}, "'prompt' is a list")],
    ids=["missing", "number", "list"],
)  # fmt: skip
def test_bad_row_names_row_and_field(chat_tok: Any, row: dict[str, Any], message: str) -> None:
    """A missing or non-string field is an InputError naming the row index and the field."""
    with pytest.raises(InputError, match=message) as info:
        encode_row(
            chat_tok, row, row_index=7, system_prompt=None, prompt_template="{prompt}", max_length=64,
            source="data.jsonl",
        )  # fmt: skip
    assert info.value.source == "data.jsonl, row 7"


def test_custom_field_names(chat_tok: Any) -> None:
    """encode_row reads the configured field names and names them in errors."""
    ids, labels = encode_row(
        chat_tok, {"q": "hi", "a": "yo"}, row_index=0, prompt_field="q", response_field="a",
        system_prompt=None, prompt_template="{prompt}", max_length=64,
    )  # fmt: skip
    assert _split(chat_tok, ids, labels)[1] == "yo</s>\n"
    with pytest.raises(InputError, match="field 'a' is missing"):
        encode_row(
            chat_tok, {"q": "hi"}, row_index=0, prompt_field="q", response_field="a",
            system_prompt=None, prompt_template="{prompt}", max_length=64,
        )  # fmt: skip


def test_collate_right_padding() -> None:
    """Right padding: pad ids, zero mask and -100 labels after the tokens; positions count from 0."""
    batch = collate([([5, 6, 7], [-100, 6, 7]), ([8], [8])], pad_token_id=0, padding_side="right")
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]
    assert all(t.dtype == torch.long for t in batch.values())


def test_collate_left_padding() -> None:
    """Left padding puts the same padding before the tokens; positions still start at the first token."""
    batch = collate([([5, 6, 7], [-100, 6, 7]), ([8], [8])], pad_token_id=9, padding_side="left")
    assert batch["input_ids"].tolist() == [[5, 6, 7], [9, 9, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [-100, -100, 8]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


@pytest.mark.parametrize(
    ("examples", "side"),
    [([], "right"), ([([], [])], "right"), ([([1, 2], [1])], "right"), ([([1], [1])], "up")],
    ids=["empty-batch", "empty-example", "unequal", "side"],
)
def test_collate_rejects_bad_input(examples: list[tuple[list[int], list[int]]], side: str) -> None:
    """An empty batch or example, unequal ids/labels, or a bad side is an InputError."""
    with pytest.raises(InputError):
        collate(examples, pad_token_id=0, padding_side=side)


def test_left_padded_row_scores_like_unpadded(tmp_path: Path, chat_tok: Any) -> None:
    """Thanks to position_ids, a left-padded row gets the logits it gets alone."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(tmp_path / "m")).eval()
    short = _encode(chat_tok, "hi", "yo")
    long = _encode(chat_tok, "a longer prompt", "and a longer answer")
    batch = collate([short, long], pad_token_id=258, padding_side="left")
    alone = collate([short], pad_token_id=258, padding_side="left")
    with torch.no_grad():
        padded_logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        alone_logits = model(**{k: v for k, v in alone.items() if k != "labels"}).logits
    n = len(short[0])
    torch.testing.assert_close(padded_logits[0, -n:], alone_logits[0], rtol=1e-4, atol=1e-5)

"""An eval's longest sequence must fit the model: its positions and any sliding window."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, Qwen2Config

from reprotune._errors import InputError
from reprotune._model.positions import refuse_past_the_model


def test_a_sequence_within_the_models_positions_passes() -> None:
    refuse_past_the_model(LlamaConfig(max_position_embeddings=512), 448, 64)


def test_max_new_tokens_past_the_models_positions_is_refused_with_the_most_it_can_be() -> None:
    """256 + 300 > 512: refused naming eval.max_new_tokens and the most it can be (transformers
    only warned and generated from positions the model never learned)."""
    with pytest.raises(InputError) as caught:
        refuse_past_the_model(LlamaConfig(max_position_embeddings=512), 256, 300)
    assert caught.value.source == "eval.max_new_tokens"
    assert "reaches 556 tokens, past the model's 512 positions" in caught.value.message
    assert caught.value.fix is not None and "at most 256" in caught.value.fix


def test_a_sliding_window_shorter_than_the_sequence_is_refused() -> None:
    config = Qwen2Config(max_position_embeddings=4096, sliding_window=128, use_sliding_window=True)
    with pytest.raises(InputError, match="sliding window of 128 tokens"):
        refuse_past_the_model(config, 100, 64)
    refuse_past_the_model(config, 64, 64)

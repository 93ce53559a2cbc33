"""``reprotune.testing``: a tiny Llama with a byte-level tokenizer, and a tiny dataset, built
deterministically for tests and benchmarks (this project's, and a user's own tests of a pipeline
around reprotune). Nothing in reprotune's own commands imports it.

``build_tiny_model`` writes a Hugging Face model directory (``config.json``,
``model.safetensors``, tokenizer files) that loads with ``AutoModelForCausalLM`` and
``AutoTokenizer`` like any other local model, in about a second. The same seed gives the same
bytes of ``model.safetensors`` in any process: the weights are drawn from a local
``torch.Generator`` after construction, so neither the caller's global RNG nor transformers'
own initialisation scheme decides them.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from reprotune._errors import InputError
from reprotune._jsonio import canonical_dumps, write_bytes_atomic

if TYPE_CHECKING:
    import torch

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)

#: One turn per message, each opened by ``<s>role\n`` and closed by ``</s>\n``; the
#: generation prompt opens the assistant's turn. Kept simple on purpose: tests decode it.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<s>' + message['role'] + '\\n' + message['content'] + '</s>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<s>assistant\\n' }}{% endif %}"
)

# Architecture of the tiny model (torchtune's test models are this size too).
_HIDDEN = 64
_INTERMEDIATE = 128
_LAYERS = 2
_HEADS = 4
_KV_HEADS = 2
_MAX_POSITIONS = 512
_INIT_STD = 0.02


def _byte_level_tokenizer() -> object:
    """A ``tokenizers.Tokenizer``: one token per byte (ids 0-255), then ``<s>``, ``</s>``, ``<pad>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    # BPE over the 256-symbol byte-level alphabet with no merges: every byte is one token,
    # so any text encodes and decodes exactly, with no training step and no randomness.
    alphabet = sorted(ByteLevel.alphabet(), key=lambda ch: _byte_of_symbol()[ch])
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def _byte_of_symbol() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: symbol -> byte value (so token id == byte)."""
    printable = list(range(ord("!"), ord("~") + 1))
    printable += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    symbols = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            symbols.append(256 + extra)
            extra += 1
    return {chr(symbol): byte for byte, symbol in zip(printable, symbols, strict=True)}


def build_tiny_tokenizer(*, chat_template: bool = True) -> object:
    """The tiny model's tokenizer as a transformers ``PreTrainedTokenizerFast``.

    Args:
        chat_template: attach :data:`TINY_CHAT_TEMPLATE` when true.

    Returns:
        A tokenizer with 259 tokens: bytes 0-255 as ids 0-255, ``<s>`` 256, ``</s>`` 257, ``<pad>`` 258.
    """
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_byte_level_tokenizer(),
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="right",
    )
    if chat_template:
        tokenizer.chat_template = TINY_CHAT_TEMPLATE
    return tokenizer


def _initialise(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from a local generator, in sorted name order."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            layer_norm = ".ln_" in name or name.startswith("transformer.ln_f.")  # GPT-2's LayerNorms
            if name.endswith("norm.weight") or (layer_norm and name.endswith(".weight")):
                param.fill_(1.0)  # norm scales start at one, as in every pretrained model
            elif layer_norm:
                param.zero_()
            else:
                param.normal_(0.0, _INIT_STD, generator=generator)


Architecture = Literal["llama", "gpt2", "qwen2"]


def _tiny_config(architecture: Architecture, vocab_size: int) -> Any:
    """The transformers config of a tiny model of ``architecture`` (same sizes for all three)."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    bos, eos, pad = vocab_size - 3, vocab_size - 2, vocab_size - 1
    if architecture == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size,
            n_embd=_HIDDEN,
            n_inner=_INTERMEDIATE,
            n_layer=_LAYERS,
            n_head=_HEADS,
            n_positions=_MAX_POSITIONS,
            activation_function="gelu_new",
            tie_word_embeddings=False,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=pad,
        )
    config_class = Qwen2Config if architecture == "qwen2" else LlamaConfig
    return config_class(
        vocab_size=vocab_size,
        hidden_size=_HIDDEN,
        intermediate_size=_INTERMEDIATE,
        num_hidden_layers=_LAYERS,
        num_attention_heads=_HEADS,
        num_key_value_heads=_KV_HEADS,
        max_position_embeddings=_MAX_POSITIONS,
        tie_word_embeddings=False,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def build_tiny_model(
    directory: Path, *, seed: int = 0, chat_template: bool = True, architecture: Architecture = "llama"
) -> Path:
    """Write a tiny causal LM and its byte-level tokenizer to ``directory`` (HF format).

    2 layers, hidden size 64, 4 attention heads (2 key/value heads for Llama and Qwen2), MLP width
    128, a vocabulary of 259 tokens (256 bytes and ``<s>``, ``</s>``, ``<pad>``), float32 weights.
    ``llama`` (the default; LoRA targets ``q_proj``/``v_proj``), ``qwen2`` (the same module names,
    biased q/k/v) or ``gpt2`` (fused ``c_attn``, LayerNorm, ``gelu_new``): models the tests use to
    check that reprotune is not tied to one architecture.

    Args:
        directory: where to write; created if missing, existing files of the same names replaced.
        seed: the weights are a pure function of this seed: the same seed gives the same bytes of
            ``model.safetensors`` in any process.
        chat_template: give the tokenizer :data:`TINY_CHAT_TEMPLATE`; without it, prompts are
            formatted with the plain prompt template.
        architecture: ``llama``, ``qwen2`` or ``gpt2``.

    Returns:
        ``directory``, for chaining.

    Raises:
        InputError: ``seed`` is negative or too large for torch, or the architecture is unknown.
    """
    if not 0 <= seed < 2**63:
        raise InputError(f"seed {seed} is out of range", fix="use a seed between 0 and 2**63 - 1")
    if architecture not in get_args(Architecture):
        raise InputError(f"unknown tiny architecture {architecture!r}", fix="use llama, qwen2 or gpt2")
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = build_tiny_tokenizer(chat_template=chat_template)
    config = _tiny_config(architecture, len(tokenizer))  # type: ignore[arg-type]
    # transformers initialises from the global RNG while constructing; fork it so the caller's
    # state is untouched, then overwrite everything from our own generator anyway.
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config)
    _initialise(model, seed)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)  # type: ignore[attr-defined]
    return directory


_WORDS = (
    "apple", "river", "stone", "cloud", "green", "quick", "maple", "night",
    "lemon", "tiger", "piano", "ocean", "amber", "frost", "delta", "orbit",
)  # fmt: skip

# One task per category, so a model can learn something category-dependent.
_TASKS = (
    ("repeat", lambda words: " ".join(words)),
    ("reverse", lambda words: " ".join(reversed(words))),
    ("first", lambda words: words[0]),
    ("last", lambda words: words[-1]),
    ("count", lambda words: str(len(words))),
    ("upper", lambda words: " ".join(w.upper() for w in words)),
    ("sort", lambda words: " ".join(sorted(words))),
    ("initials", lambda words: "".join(w[0] for w in words)),
)


def tiny_rows(n_rows: int, *, seed: int = 0, n_categories: int = 3) -> list[dict[str, str]]:
    """Deterministic prompt/response/category rows (short ASCII strings).

    Row ``i < n_categories`` has category ``cat<i>`` so every category occurs; later rows draw
    their category from a seeded generator, so the classes are mildly imbalanced.

    Args:
        n_rows: how many rows (>= 0).
        seed: the rows are a pure function of (n_rows, seed, n_categories).
        n_categories: number of categories, 1 to 8.

    Returns:
        A list of ``{"prompt", "response", "category"}`` dicts.

    Raises:
        InputError: a count out of range.
    """
    if n_rows < 0:
        raise InputError(f"n_rows {n_rows} is negative", fix="ask for 0 or more rows")
    if not 1 <= n_categories <= len(_TASKS):
        raise InputError(
            f"n_categories {n_categories} is out of range", fix=f"use 1 to {len(_TASKS)} categories"
        )
    rng = random.Random(seed)  # a local generator: the caller's `random` state is untouched
    rows = []
    for index in range(n_rows):
        category = index if index < n_categories else rng.randrange(n_categories)
        words = [rng.choice(_WORDS) for _ in range(rng.randint(1, 4))]
        verb, task = _TASKS[category]
        rows.append(
            {"prompt": f"{verb}: {' '.join(words)}", "response": task(words), "category": f"cat{category}"}
        )
    return rows


def write_tiny_dataset(path: Path, n_rows: int, seed: int = 0, n_categories: int = 3) -> Path:
    """Write :func:`tiny_rows` as JSONL (one canonical JSON object per line), atomically.

    Args:
        path: the file to write (parent directories are created).
        n_rows, seed, n_categories: as for :func:`tiny_rows`.

    Returns:
        ``path``.

    Raises:
        InputError: a count out of range.
    """
    rows = tiny_rows(n_rows, seed=seed, n_categories=n_categories)
    text = "".join(canonical_dumps(row, indent=None) for row in rows)
    write_bytes_atomic(path, text.encode("utf-8"))
    return Path(path)

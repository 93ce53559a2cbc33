"""LoRA through PEFT: a seeded init, the trainable tensors and their hash, the adapter on disk.

PEFT draws the LoRA A matrices from torch's *global* RNG (``nn.Linear``'s own init, then
``kaiming_uniform_`` in ``LoraLayer.reset_lora_parameters``; B starts at zero). "LoRA weights
differ between runs" comes from building the adapter at whatever point the global RNG happens
to be. :func:`apply_lora` seeds the init itself, inside a forked RNG, so the init is a function
of its seed alone and the caller's RNG stream goes on as if nothing had happened.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args

from reprotune._errors import InputError
from reprotune._jsonio import json_safe, publishing_dir, sha256_file
from reprotune._model.lora_targets import (
    refuse_a_rank_past_the_layers,
    target_module_names,
    unmatched_targets,
)

if TYPE_CHECKING:
    import torch
    from peft import LoraConfig, PeftModel

LoraBias = Literal["none", "all", "lora_only"]


def build_lora_config(
    *, r: int, alpha: float, dropout: float, target_modules: Sequence[str], bias: str
) -> LoraConfig:
    """A PEFT ``LoraConfig`` for a causal LM, with every argument checked.

    Args:
        r: the LoRA rank (>= 1).
        alpha: the LoRA scaling numerator (> 0); the update is scaled by ``alpha / r``.
        dropout: dropout on the LoRA input, in [0, 1).
        target_modules: module names (or suffixes) to wrap, e.g. ``["q_proj", "v_proj"]``,
            or ``["all-linear"]``.
        bias: ``none``, ``all`` or ``lora_only``.

    Raises:
        InputError: a value out of range; a target list that is empty or not a list of strings.
    """
    from peft import LoraConfig

    problems = []
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        problems.append(("lora.r", f"rank {r!r} must be a whole number >= 1", "use e.g. r: 8"))
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0:
        problems.append(("lora.alpha", f"alpha {alpha!r} must be a number > 0", "use e.g. alpha: 16"))
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        problems.append(("lora.dropout", f"dropout {dropout!r} must be in [0, 1)", "use e.g. dropout: 0.05"))
    if bias not in get_args(LoraBias):
        problems.append(("lora.bias", f"bias {bias!r} is not supported", "use one of: none, all, lora_only"))
    if (
        isinstance(target_modules, str)
        or not target_modules
        or not all(isinstance(t, str) and t for t in target_modules)
    ):
        problems.append(
            (
                "lora.target_modules",
                f"target modules {target_modules!r} must be a non-empty list of names",
                'use e.g. target_modules: ["q_proj", "v_proj"]',
            )
        )
    if problems:
        source, message, fix = problems[0]
        extra = "".join(f"; also {s}: {m}" for s, m, _ in problems[1:])
        raise InputError(message + extra, source=source, fix=fix)
    modules: str | list[str] = (
        "all-linear" if list(target_modules) == ["all-linear"] else list(target_modules)
    )
    return LoraConfig(
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]  # annotated int in PEFT, used as a number
        lora_dropout=float(dropout),
        target_modules=modules,
        bias=cast(LoraBias, bias),
        task_type="CAUSAL_LM",
    )


def apply_lora(
    model: torch.nn.Module,
    *,
    r: int,
    alpha: float,
    dropout: float,
    target_modules: Sequence[str],
    bias: str,
    seed: int,
    observe: AbstractContextManager[Any] | None = None,
) -> PeftModel:
    """Wrap ``model`` with LoRA adapters whose init is drawn from ``seed`` alone.

    The adapter is created inside ``torch.random.fork_rng`` (the CPU generator, and the CUDA
    generators of the model's devices) after ``torch.manual_seed(seed)``: the same seed gives
    the same LoRA weights whatever ran before, and the caller's global RNG state is the same
    after the call as before it. ``model`` itself is modified in place (PEFT injects the layers).

    Args:
        model: a transformers causal LM (not yet wrapped).
        r, alpha, dropout, target_modules, bias: as :func:`build_lora_config`.
        seed: the LoRA-init seed (0 <= seed < 2**63), derived by the caller from the root seed.
        observe: entered around the adapter's creation alone, after the seed (``reprotune trace
            --step 0`` traces the ops of the LoRA init in it).

    Returns:
        The ``PeftModel``; only LoRA (and, per ``bias``, bias) parameters require grad.

    Raises:
        InputError: a bad LoRA setting, or target modules that match no module (the message
            lists the names that can be targeted).
    """
    import torch
    from peft import get_peft_model

    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise InputError(
            f"LoRA-init seed {seed!r} is out of range", source="seeds.lora_init", fix="use 0 <= seed < 2**63"
        )
    config = build_lora_config(r=r, alpha=alpha, dropout=dropout, target_modules=target_modules, bias=bias)
    if config.target_modules != "all-linear":
        unmatched = unmatched_targets(model, list(target_modules))
        if unmatched:
            raise InputError(
                f"target modules {unmatched} match no module of this model",
                source="lora.target_modules",
                fix=f"choose among the model's layer names: {', '.join(target_module_names(model))}",
            )
    refuse_a_rank_past_the_layers(model, r, list(target_modules))
    cuda_devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        try:
            with warnings.catch_warnings():
                # PEFT 0.21 calls an attribute transformers 5 deprecated; nothing for users to do.
                warnings.filterwarnings(
                    "ignore", message=".*is_gradient_checkpointing", category=FutureWarning
                )
                with observe if observe is not None else nullcontext():
                    peft_model = get_peft_model(model, config)
        except ValueError as exc:  # e.g. a name that matches a module of a type LoRA cannot wrap
            raise InputError(
                f"PEFT cannot apply LoRA to target modules {list(target_modules)}: {exc}",
                source="lora.target_modules",
                fix=f"choose among the model's layer names: {', '.join(target_module_names(model))}",
            ) from exc
    return peft_model


def trainable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that require grad, by full name, detached (no copy)."""
    return {name: param.detach() for name, param in model.named_parameters() if param.requires_grad}


_NUMPY_DTYPES: frozenset[str] = frozenset(
    f"torch.{name}"
    for name in ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
)


def _hashable_in_place(tensor: torch.Tensor) -> bool:
    """A CPU tensor whose bytes NumPy can expose as they are (contiguous, a NumPy dtype)."""
    return tensor.device.type == "cpu" and tensor.is_contiguous() and str(tensor.dtype) in _NUMPY_DTYPES


@functools.lru_cache(maxsize=4096)
def _header(name: str, dtype: object, shape: tuple[int, ...], nbytes: int) -> bytes:
    return f"{name}\0{dtype}\0{','.join(str(size) for size in shape)}\0{nbytes}\0".encode()


def tensors_sha256(tensors: Mapping[str, torch.Tensor]) -> str:
    """One sha256 over named tensors: in sorted name order, each tensor's header then its bytes.

    The header is ``f"{name}\\0{dtype}\\0{shape}\\0{nbytes}\\0"`` in UTF-8 (``dtype`` as torch
    prints it, e.g. ``torch.float32``; ``shape`` as a comma-separated list, e.g. ``8,64``); the
    bytes are the tensor's elements in row-major order, native (little-endian) byte order. The
    same tensors give the same digest on CPU or GPU. Fast enough to run after every step: the
    bytes are hashed in place on CPU, and tensors on a GPU are packed into one buffer and copied
    to the host once.

    Args:
        tensors: name -> tensor; any dtype, any device.

    Returns:
        The hex digest.
    """
    import torch

    names = sorted(tensors)
    if all(_hashable_in_place(tensors[name]) for name in names):
        return WeightsHasher(tensors)()  # on CPU: no copies, no reshapes
    digest = hashlib.sha256()
    flat = [tensors[name].detach().reshape(-1).contiguous() for name in names]
    raw = [t.view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8) for t in flat]
    accelerator = next((t.device for t in raw if t.device.type != "cpu"), None)
    if accelerator is not None:
        # One device-to-host copy instead of one per tensor (each copy synchronises).
        packed = torch.cat([t.to(accelerator) for t in raw]).cpu()
        views, offset = [], 0
        for t in raw:
            views.append(packed[offset : offset + t.numel()])
            offset += t.numel()
        raw = views
    for name, tensor, data in zip(names, flat, raw, strict=True):
        shape = ",".join(str(size) for size in tensors[name].shape)
        digest.update(f"{name}\0{tensor.dtype}\0{shape}\0{data.numel()}\0".encode())
        digest.update(data.numpy().data)
    return digest.hexdigest()


def buffer_hashes(model: torch.nn.Module) -> dict[str, str]:
    """Buffer name -> :func:`tensors_sha256` of that buffer alone, for every buffer of ``model`` as
    it is in force after loading (``model.rotary_emb.inv_freq``). Buffers are not in the weight
    files: the library computes them from the config at load, so the same files read by two
    library versions can give other buffers (and other numbers). Each hash is of the buffer's
    dtype, shape and bytes alone (hashed under the name ``buffer``), so a buffer hashes alike
    under a PEFT wrapper's longer name."""
    return {name: tensors_sha256({"buffer": buffer}) for name, buffer in model.named_buffers()}


class WeightsHasher:
    """:func:`tensors_sha256` of one fixed set of tensors, again and again as they change in place.

    The training loop hashes the trainable weights after every step. Sorting the names, building
    the headers and exposing each CPU tensor's bytes happen once here, so a call is only the
    hashing itself: for the tiny model's 8 LoRA tensors about 5 us instead of 23 us with warm
    caches, and about 14 us instead of 35 us right after a training step. Tensors that cannot be
    hashed in place (on a GPU, or of a dtype NumPy lacks) go through :func:`tensors_sha256` on
    each call.

    The tensors must change in place, as optimizer steps and ``load_state_dict`` change them; a
    parameter given a new storage (``param.data = other``) is not seen.

    Args:
        tensors: name -> tensor, e.g. :func:`trainable_tensors` of the model.
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors = dict(tensors)
        self._parts: list[bytes | memoryview] | None = None
        # Copying a fresh hash object skips OpenSSL's algorithm lookup, which right after a
        # training step (cold caches) costs more than hashing the tiny model's weights.
        self._empty = hashlib.sha256()
        names = sorted(self._tensors)
        if all(_hashable_in_place(self._tensors[name]) for name in names):
            self._parts = []
            for name in names:
                tensor = self._tensors[name].detach()
                self._parts.append(_header(name, tensor.dtype, tuple(tensor.shape), tensor.nbytes))
                self._parts.append(tensor.numpy().data)

    def __call__(self) -> str:
        """The hex digest of the tensors as they are now."""
        if self._parts is None:
            return tensors_sha256(self._tensors)
        digest = self._empty.copy()
        for part in self._parts:
            digest.update(part)
        return digest.hexdigest()


def save_adapter(
    model: PeftModel,
    directory: str | os.PathLike[str],
    *,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, str]:
    """Save the LoRA adapter alone (safetensors) to ``directory``, atomically.

    PEFT writes ``adapter_model.safetensors`` and ``adapter_config.json`` into a temporary
    folder beside ``directory`` which then replaces it in one rename (an existing ``directory``
    is moved aside first and removed after). PEFT's boilerplate ``README.md`` model card is not
    kept. Equal weights give byte-identical ``adapter_model.safetensors``, and equal configs a
    byte-identical ``adapter_config.json`` (:func:`_canonical_config`).

    Args:
        model: the ``PeftModel`` from :func:`apply_lora`.
        directory: the adapter folder to (re)write.
        state_dict: the weights to save, by parameter name, when the model's own are not whole
            (a model sharded by FSDP: its gathered trainable weights).

    Returns:
        File name -> sha256 of every file in the adapter folder.
    """
    with publishing_dir(Path(directory), replace=True) as tmp:
        extra: dict[str, Any] = {} if state_dict is None else {"state_dict": dict(state_dict)}
        # reprotune never resizes the vocabulary, so the base embeddings are never part of the
        # adapter; PEFT's "auto" would look the base model up by its name to find out (a hub
        # lookup and a warning for a name like builtin:smollm2-135m-instruct).
        model.save_pretrained(str(tmp), safe_serialization=True, save_embedding_layers=False, **extra)
        (tmp / "README.md").unlink(missing_ok=True)
        _canonical_config(tmp / ADAPTER_CONFIG)
        hashes = {path.name: sha256_file(path) for path in sorted(tmp.iterdir()) if path.is_file()}
    return hashes


#: The adapter config PEFT writes beside the weights.
ADAPTER_CONFIG = "adapter_config.json"
# List-valued keys of a LoRA config whose order carries no meaning: PEFT keeps them as sets and
# writes them in hash order, which changes from process to process (PYTHONHASHSEED).
_UNORDERED_KEYS = ("target_modules", "modules_to_save", "exclude_modules", "layers_to_transform")


def _canonical_config(path: Path) -> None:
    """Rewrite PEFT's ``adapter_config.json`` with its unordered lists sorted, in PEFT's own format
    (``json.dumps(indent=2, sort_keys=True)``), so twin runs write the same bytes."""
    config = json.loads(path.read_text(encoding="utf-8"))
    for key in _UNORDERED_KEYS:
        if isinstance(config.get(key), list):
            config[key] = sorted(config[key], key=lambda item: (str(type(item)), str(item)))
    path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")


def lora_config_dict(config: LoraConfig | PeftModel, adapter_name: str = "default") -> dict[str, Any]:
    """The LoRA config PEFT received, as JSON-safe data for the record.

    Args:
        config: a ``LoraConfig``, or the ``PeftModel`` (its config for ``adapter_name``).
        adapter_name: which adapter of a ``PeftModel``.

    Returns:
        ``LoraConfig.to_dict()`` with sets as sorted lists and enums as strings.
    """
    return cast(dict[str, Any], json_safe(_adapter_config(config, adapter_name).to_dict()))


def lora_defaults(config: LoraConfig | PeftModel, adapter_name: str = "default") -> dict[str, Any]:
    """The default of each field of the LoRA config's class, in the PEFT at hand, as JSON-safe data
    for the record (``lora_defaults``): a field an older PEFT lacks is its feature off there, so
    where the run that has it holds its default, the two PEFTs train alike (``compare``).

    Args:
        config, adapter_name: as :func:`lora_config_dict`.

    Returns:
        Field name -> its default; a field with no default is left out.
    """
    defaults = {}
    for field in dataclasses.fields(_adapter_config(config, adapter_name)):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
    return cast(dict[str, Any], json_safe(defaults))


def _adapter_config(config: LoraConfig | PeftModel, adapter_name: str) -> Any:
    """``config`` itself, or a ``PeftModel``'s config of ``adapter_name`` (PEFT's own types are
    not annotated, so it is ``Any``)."""
    peft_config = getattr(config, "peft_config", None)
    return peft_config[adapter_name] if peft_config is not None else config

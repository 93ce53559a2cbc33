"""Batch invariance, measured on the machine at hand: GEMMs in fixed blocks, a probe, evidence.

A row's logits depend on its neighbours through the matrix products: a BLAS computes a row with
other bits depending on how many rows the product has (on an AMD EPYC with AVX2, row counts 1,
2-3 and >= 4 differ; on an Intel Xeon with AVX-512, 1, 2-15, 16-48 and 64 for some shapes), and
those classes change with the CPU, the shapes and the thread count. So the eval does not bet on
a class; it removes the row count from the question:

1. **Fixed blocks.** Every linear layer of the model (``nn.Linear``, transformers' ``Conv1D``,
   PEFT's LoRA layers through theirs) computes its rows in products of exactly ``block`` rows,
   the last block padded with zero rows. A row's bits can then depend only on its position
   inside a block and on the other rows' values, never on the batch.
2. **A probe** (:func:`plan_gemm_blocks`) measures, for each distinct layer shape with the
   layer's own weights, whether a row gets the same bits at every position of a block whatever
   the other rows hold, for the candidate blocks in their order of preference
   (:data:`BLOCK_CANDIDATES`: 64 down to 1 rows for the prompt, 8, 16, 4, 2, 1 for new tokens),
   and keeps the first that does (1 always does: one row alone). The plan is cached per machine,
   library stack, thread count and shapes (``<cache>/invariance/``), since it is a fact of those
   alone.
3. **A check of the claim** (:func:`check_rows`): prompts of several lengths generated alone and
   together must give every row the same logits, bit for bit, at every step. Only then is
   ``batch_invariant`` claimed; the evidence (the plan, each shape's probe, the check) is kept in
   the eval record. Ops other than the products (attention, norms) are covered by the rowwise
   attention (``_eval.decode``) and by this check; where it fails, the eval says so and the batch
   size becomes part of its identity.
"""

from __future__ import annotations

import time
import types
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from reprotune._documents import read_json_file
from reprotune._eval.decode import PASS_ATTRIBUTE, GeneratePass, generate_rows
from reprotune._eval.settings import GenerationSettings
from reprotune._jsonio import canonical_sha256, write_json_atomic
from reprotune._model.builtin import cache_root
from reprotune._run.kernels import kernel_facts

#: Rows per product tried, in order of preference, for each pass of generate: the prompt's pass
#: (``prefill``: many rows, so large blocks, few calls) and each new token's (``decode``: one row
#: per sequence, so a block near the default batch of 8). 1 is always position-independent.
BLOCK_CANDIDATES: dict[str, tuple[int, ...]] = {
    "prefill": (64, 32, 16, 8, 4, 2, 1),
    "decode": (8, 16, 4, 2, 1),
}
#: The probe's version: a cached plan of another version is probed again.
PROBE_VERSION = 2
#: Prompt lengths and new tokens of the check: several lengths, so that padding is real.
CHECK_LENGTHS: tuple[int, ...] = (5, 11, 3, 8)
CHECK_NEW_TOKENS = 3


@dataclass(frozen=True)
class GemmPlan:
    """How many rows each layer shape computes per product in each pass, and the probe behind it.

    Attributes:
        threads: the torch thread count the probe ran with (the plan holds only with it).
        blocks: shape key (``linear 576x1536 float32``) -> pass (``prefill``, ``decode``) -> rows
            per product.
        probes: shape key -> pass -> each candidate tried -> whether it was position-free.
        cache_key: sha256 of what the plan is a function of.
        cached: the plan was read from the cache, not probed now.
        probe_s: seconds the probe took (0 when cached).
    """

    threads: int
    blocks: dict[str, dict[str, int]]
    probes: dict[str, dict[str, dict[str, bool]]]
    cache_key: str
    cached: bool = False
    probe_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "blocks": {k: dict(v) for k, v in self.blocks.items()},
            "probes": {k: {p: dict(c) for p, c in v.items()} for k, v in self.probes.items()},
            "cache_key": self.cache_key,
            "cached": self.cached,
            "probe_s": round(self.probe_s, 3),
        }


@dataclass(frozen=True)
class Invariance:
    """Whether an eval may claim batch invariance here, and why.

    Attributes:
        shown: the claim holds on this machine (the plan applied and the check passed).
        reason: one line for people.
        plan: the GEMM block plan applied (None when none was).
        check: the check's evidence (None when it did not run).
    """

    shown: bool
    reason: str
    plan: GemmPlan | None = None
    check: dict[str, Any] | None = field(default=None)

    def to_json(self) -> dict[str, Any]:
        return {
            "shown": self.shown,
            "reason": self.reason,
            "method": "GEMMs in fixed blocks of probed size, rowwise attention, per-row sampling "
            "generators, a fixed thread count; claimed only after rows generated alone and together "
            "gave the same logits bit for bit",
            "gemm": self.plan.to_json() if self.plan is not None else None,
            "check": self.check,
        }


def _gemm_modules(model: Any) -> dict[str, list[torch.nn.Module]]:
    """The model's linear layers by shape key, in module order. The output layer is keyed apart
    (``head ...``): it gets one row per sequence in every pass (generate keeps only the last
    position's logits), so its prompt pass uses a new token's block too."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    found: dict[str, list[torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            n_in, n_out, kind = module.in_features, module.out_features, "linear"
        elif isinstance(module, Conv1D):
            n_in, n_out, kind = int(module.weight.shape[0]), int(module.nf), "conv1d"
        else:
            continue
        kind = "head" if module is head else kind
        bias = "+bias" if module.bias is not None else ""
        dtype = str(module.weight.dtype).removeprefix("torch.")
        found.setdefault(f"{kind} {n_in}x{n_out}{bias} {dtype}", []).append(module)
    return found


def _gemm(module: Any, rows: torch.Tensor) -> torch.Tensor:
    """The layer's own product on a 2-D block of rows, as its forward computes it."""
    if isinstance(module, torch.nn.Linear):
        return F.linear(rows, module.weight, module.bias)
    return torch.addmm(module.bias, rows, module.weight)  # transformers' Conv1D


@torch.no_grad()
def _position_free(module: Any, block: int) -> bool:
    """Whether a row's bits in a ``block``-row product are free of its position and neighbours.

    Three products of the layer's own weights: a block of random rows, the same block rotated by
    one row and by half a block (every row at another position, every pair of neighbouring
    positions compared), and one row among zeros. A kernel that computes some positions another
    way (an edge tile, another thread's share) gives those rows other bits: with random rows and
    hundreds of terms per sum, equal bits by chance do not happen.
    """
    weight = module.weight
    n_in = weight.shape[1] if isinstance(module, torch.nn.Linear) else weight.shape[0]
    generator = torch.Generator().manual_seed(block)
    rows = torch.randn(block, n_in, generator=generator).to(weight.dtype).to(weight.device)
    out = _gemm(module, rows)
    for shift in sorted({1, block // 2} - {0}):
        if not torch.equal(_gemm(module, rows.roll(shift, dims=0)), out.roll(shift, dims=0)):
            return False
    alone = torch.zeros_like(rows)
    alone[block - 1] = rows[block - 1]
    return torch.equal(_gemm(module, alone)[block - 1], out[block - 1])


def _cache_key(shapes: Sequence[str], threads: int, device: str) -> str:
    facts = kernel_facts()
    facts.pop("attention", None)
    facts.pop("algorithms", None)  # the GEMM probe's kernels do not depend on it; caches stay valid
    what = {
        "probe_version": PROBE_VERSION,
        "candidates": BLOCK_CANDIDATES,
        "torch": torch.__version__,
        "kernels": facts,
        "threads": threads,
        "device": device,
        "shapes": sorted(shapes),
    }
    return canonical_sha256(what)


def _cache_file(key: str) -> Path:
    return cache_root() / "invariance" / f"gemm-{key[:32]}.json"


def _read_cached(key: str) -> GemmPlan | None:
    path = _cache_file(key)
    if not path.is_file():
        return None
    try:
        data = read_json_file(path, what="cached GEMM plan", fix="delete it")
        if data.get("cache_key") != key or data.get("probe_version") != PROBE_VERSION:
            return None
        blocks = {str(k): {str(p): int(n) for p, n in v.items()} for k, v in data["blocks"].items()}
        if any(
            set(v) != set(BLOCK_CANDIDATES) or any(n not in BLOCK_CANDIDATES[p] for p, n in v.items())
            for v in blocks.values()
        ):
            return None  # a block size the probe never tries: edited, probed again
        probes = {
            str(k): {str(p): {str(c): bool(ok) for c, ok in tried.items()} for p, tried in v.items()}
            for k, v in data["probes"].items()
        }
        return GemmPlan(int(data["threads"]), blocks, probes, key, cached=True)
    except Exception:  # a damaged cache entry is probed again, never trusted
        return None


def _write_cached(plan: GemmPlan) -> None:
    body = {**plan.to_json(), "probe_version": PROBE_VERSION}
    body.pop("cached"), body.pop("probe_s")
    try:
        _cache_file(plan.cache_key).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(_cache_file(plan.cache_key), body)
    except Exception:  # a read-only cache costs a probe next time, nothing else
        return


def plan_gemm_blocks(model: Any, *, use_cache: bool = True) -> GemmPlan:
    """Probe each distinct linear layer shape of ``model`` (see the module docstring).

    Args:
        model: the model the eval generates with (its weights are used, not changed).
        use_cache: read and write the plan in reprotune's cache.

    Returns:
        The plan for the current torch thread count.
    """
    modules = _gemm_modules(model)
    threads = torch.get_num_threads()
    device = str(next(iter(modules.values()))[0].weight.device) if modules else "cpu"
    key = _cache_key(list(modules), threads, device)
    if use_cache and (cached := _read_cached(key)) is not None and set(cached.blocks) == set(modules):
        return cached
    started = time.perf_counter()
    blocks: dict[str, dict[str, int]] = {}
    probes: dict[str, dict[str, dict[str, bool]]] = {}
    for shape, members in modules.items():
        blocks[shape], probes[shape] = {}, {}
        for phase, candidates in BLOCK_CANDIDATES.items():
            if shape.startswith("head "):
                candidates = BLOCK_CANDIDATES["decode"]
            tried: dict[str, bool] = {}
            for block in candidates:
                tried[str(block)] = block == 1 or _position_free(members[0], block)
                if tried[str(block)]:
                    blocks[shape][phase] = block
                    break
            probes[shape][phase] = tried
    plan = GemmPlan(threads, blocks, probes, key, cached=False, probe_s=time.perf_counter() - started)
    if use_cache:
        _write_cached(plan)
    return plan


def _blocked_forward(
    module: torch.nn.Module, blocks: dict[str, int], threads: int, current: GeneratePass
) -> Any:
    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if torch.get_num_threads() != threads:
            raise RuntimeError(
                f"the eval's GEMM blocks were probed with {threads} threads; this process now runs "
                f"{torch.get_num_threads()}: probe again (plan_gemm_blocks) after changing the count"
            )
        block = blocks[current.name]
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if n % block:
            rows = F.pad(rows, (0, 0, 0, block - n % block))
        if rows.shape[0] == block:
            out = _gemm(self, rows)
        else:
            out = torch.cat([_gemm(self, part) for part in rows.split(block)])
        return out[:n].reshape(*x.shape[:-1], out.shape[-1])

    return types.MethodType(forward, module)


def use_gemm_blocks(model: Any, plan: GemmPlan) -> int:
    """Make every linear layer of ``model`` compute in the plan's blocks; return how many.

    The block of each pass is picked by the :class:`~reprotune._eval.decode.GeneratePass` that
    ``generate_rows`` keeps on the model (a plain forward call counts as a prompt's pass).
    """
    current = GeneratePass()
    setattr(model, PASS_ATTRIBUTE, current)
    patched = 0
    for shape, members in _gemm_modules(model).items():
        for module in members:
            # An instance attribute: nn.Module.__call__ finds it before the class's forward.
            module.forward = _blocked_forward(module, plan.blocks[shape], plan.threads, current)
            patched += 1
    return patched


def check_rows(
    model: Any, *, eos_token_ids: Sequence[int], pad_token_id: int, vocab_size: int
) -> dict[str, Any]:
    """Generate prompts of :data:`CHECK_LENGTHS` alone and together; compare every step's logits.

    Returns:
        ``prompt_lengths``, ``new_tokens``, ``batch_sizes``, ``rows_equal``, ``rows`` and ``equal``.
    """
    generator = torch.Generator().manual_seed(0)
    low = min(vocab_size, 3)
    prompts = [
        [int(t) for t in torch.randint(low, vocab_size, (length,), generator=generator)]
        for length in CHECK_LENGTHS
    ]
    settings = GenerationSettings("greedy", 1.0, 0, 1.0, max_new_tokens=CHECK_NEW_TOKENS, eval_seed=0)
    rows = list(range(len(prompts)))
    common: dict[str, Any] = {
        "eos_token_ids": eos_token_ids,
        "pad_token_id": pad_token_id,
        "keep_logits": True,
    }
    alone = generate_rows(model, prompts, rows, settings, batch_size=1, **common)
    together = generate_rows(model, prompts, rows, settings, batch_size=len(prompts), **common)
    equal_rows = 0
    for a, b in zip(alone, together, strict=True):
        if a.ids == b.ids and a.logits is not None and b.logits is not None:
            equal_rows += bool(torch.equal(a.logits, b.logits))
    return {
        "prompt_lengths": list(CHECK_LENGTHS),
        "new_tokens": CHECK_NEW_TOKENS,
        "batch_sizes": [1, len(prompts)],
        "rows": len(prompts),
        "rows_equal": equal_rows,
        "equal": equal_rows == len(prompts),
    }


def make_batch_invariant(
    model: Any,
    *,
    device: str,
    attention: str,
    rowwise: str,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    vocab_size: int,
) -> Invariance:
    """Apply the probed GEMM blocks to ``model`` and check the claim; see the module docstring.

    Args:
        model: the eval's model (changed in place: its linear layers compute in blocks).
        device: where it generates; only CPUs are probed (on CUDA the claim is not made).
        attention: the attention implementation in force; ``rowwise``: the batch-invariant one.
        eos_token_ids, pad_token_id, vocab_size: for the check's generation.

    Returns:
        The :class:`Invariance`: shown or not, why, and the evidence.
    """
    if not device.startswith("cpu"):
        return Invariance(False, f"not measured on {device}: the batch size is part of this eval's identity")
    if attention != rowwise:
        return Invariance(
            False, f"attention {attention!r} is not the rowwise attention: rows attend over padded shapes"
        )
    plan = plan_gemm_blocks(model)
    use_gemm_blocks(model, plan)
    check = check_rows(model, eos_token_ids=eos_token_ids, pad_token_id=pad_token_id, vocab_size=vocab_size)
    if not check["equal"]:
        return Invariance(
            False,
            f"rows generated alone and together differ here ({check['rows'] - check['rows_equal']} of "
            f"{check['rows']}): the batch size is part of this eval's identity",
            plan,
            check,
        )
    sizes = {phase: sorted({b[phase] for b in plan.blocks.values()}) for phase in BLOCK_CANDIDATES}
    shown = ", ".join(f"{phase} {sizes[phase]}" for phase in sizes)
    return Invariance(
        True,
        f"shown on this machine: {len(plan.blocks)} layer shapes in blocks of rows ({shown}), "
        f"{check['rows']} rows alone and together bit for bit equal",
        plan,
        check,
    )

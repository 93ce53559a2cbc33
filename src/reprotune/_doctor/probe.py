"""The doctor's empirical probe: a tiny attention model's forward and backward twice, bit for bit."""

from __future__ import annotations

import hashlib
from typing import Any

from reprotune._run.findings import Finding


def _probe_pass(device: str) -> tuple[str, str]:
    """One seeded forward and backward of a tiny attention model; (loss bits, sha256 of gradients)."""
    import torch
    from torch import nn

    vocab, width, seq, batch = 64, 32, 16, 8
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        torch.manual_seed(1234)
        embed = nn.Embedding(vocab, width)
        proj = nn.Linear(width, 3 * width)
        norm = nn.LayerNorm(width)
        head = nn.Linear(width, vocab)
        dropout = nn.Dropout(0.1)
        model = nn.ModuleDict({"embed": embed, "proj": proj, "norm": norm, "head": head}).to(device)
        tokens = torch.randint(0, vocab, (batch, seq), device=device)
        targets = torch.randint(0, vocab, (batch, seq), device=device)
        x = embed(tokens)
        q, k, v = proj(x).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(1, 2) / width**0.5, dim=-1)
        h = norm(dropout(attn @ v) + x)
        logits = head(torch.nn.functional.gelu(h))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
        loss.backward()
        digest = hashlib.sha256()
        for name, param in sorted(model.named_parameters()):
            assert param.grad is not None  # every parameter is on the loss's path, by construction
            digest.update(name.encode())
            digest.update(param.grad.detach().cpu().contiguous().numpy().tobytes())
        return float(loss.item()).hex(), digest.hexdigest()


def run_probe(device: str) -> tuple[dict[str, Any], Finding]:
    """Run :func:`_probe_pass` twice under the flags in force; compare every bit.

    Returns:
        (result dict, the finding that reports it).
    """
    try:
        first = _probe_pass(device)
        second = _probe_pass(device)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (
            {"device": device, "status": "failed", "error": message},
            Finding(
                "probe-failed",
                "error",
                f"the probe failed on {device}: {message}",
                "an op the training step needs raised under this mode: a real run would fail the same way",
                "read the message: strict mode names the op without a deterministic implementation",
            ),
        )
    result = {
        "device": device,
        "status": "identical" if first == second else "differs",
        "loss": [first[0], second[0]],
        "grads_sha256": [first[1], second[1]],
    }
    if first == second:
        return result, Finding(
            "probe-identical",
            "info",
            f"probe: two forward+backward passes on {device} gave identical bits (loss {first[0]})",
            "the numeric stack repeats itself on this machine under this mode",
            "nothing to do",
        )
    return result, Finding(
        "probe-differs",
        "error",
        f"probe: two identical forward+backward passes on {device} gave different bits "
        f"(loss {first[0]} vs {second[0]})",
        "this setup does not repeat itself: two runs of the same config will differ",
        "set determinism.mode: strict and fix the other error-level findings, then rerun doctor",
    )

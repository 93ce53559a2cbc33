"""How the adapters of two runs differ: their files' sha256 and, when they differ, the largest
absolute difference of each tensor (computed in float64, exact for float32, float16 and bfloat16;
NaN where one side holds a NaN the other does not, 0 where both hold one)."""

from __future__ import annotations

import numpy as np

from reprotune._proof.differences import AdapterDiff, TensorDiff
from reprotune._run.adapter import load_adapter
from reprotune._run.rundir import RunDir


def compare_adapters(run_a: RunDir, run_b: RunDir) -> AdapterDiff | None:
    """Hash both adapter files; when they differ, the max |difference| per tensor."""
    if run_a.adapter_path is None and run_b.adapter_path is None:
        return None
    sha_a, sha_b = run_a.adapter_sha256(), run_b.adapter_sha256()
    if sha_a is not None and sha_a == sha_b:
        return AdapterDiff(sha_a, sha_b, identical=True, same_structure=True, tensors=())
    if run_a.adapter_path is None or run_b.adapter_path is None:
        return AdapterDiff(sha_a, sha_b, identical=False, same_structure=False, tensors=())
    ta, tb = load_adapter(run_a.adapter_path), load_adapter(run_b.adapter_path)
    tensors = []
    for name in sorted(set(ta) | set(tb)):
        xa, xb = ta.get(name), tb.get(name)
        shape_a = tuple(xa.shape) if xa is not None else None
        shape_b = tuple(xb.shape) if xb is not None else None
        max_diff: float | None = None
        if xa is not None and xb is not None and shape_a == shape_b:
            # float64 holds every float32/float16/bfloat16 value and their differences exactly
            wa, wb = xa.astype(np.float64), xb.astype(np.float64)
            delta = np.abs(wa - wb)
            delta[np.isnan(wa) & np.isnan(wb)] = 0.0  # NaN in both at one place: no difference in value
            max_diff = float(delta.max()) if delta.size else 0.0  # NaN where only one side is NaN
        tensors.append(TensorDiff(name, shape_a, shape_b, max_diff))
    same_structure = all(t.shape_a is not None and t.shape_a == t.shape_b for t in tensors)
    return AdapterDiff(sha_a, sha_b, identical=False, same_structure=same_structure, tensors=tuple(tensors))

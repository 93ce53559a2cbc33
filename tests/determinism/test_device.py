"""Tests for reprotune._determinism.device: the one place a device name is resolved."""

from __future__ import annotations

import pytest
import torch

from reprotune._determinism.device import resolve_device
from reprotune._errors import InputError


def test_cpu_and_auto_resolve_without_a_gpu() -> None:
    """cpu is cpu; auto is cpu exactly when torch sees no GPU."""
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:0"], ids=["cuda", "cuda-index"])
def test_cuda_without_gpu_is_refused(name: str) -> None:
    """Asking for cuda without a GPU raises InputError naming the key and the fix."""
    with pytest.raises(InputError, match="no CUDA device") as info:
        resolve_device(name)
    assert info.value.source == "determinism.device" and "determinism.device=cpu" in str(info.value.fix)


@pytest.mark.parametrize("name", ["tpu", "cuda:x", ""], ids=["unknown-type", "bad-index", "empty"])
def test_unknown_names_are_refused_with_their_source(name: str) -> None:
    """A name that is not cpu/cuda[:N]/auto raises InputError naming where it came from."""
    with pytest.raises(InputError) as info:
        resolve_device(name, source="model device")
    assert info.value.source == "model device" and repr(name) in info.value.message

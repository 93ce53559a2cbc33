"""How ``compare`` prints the adapter tensors that differ: the largest first, at most ten."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from reprotune._proof.compare import compare_runs
from reprotune._proof.differences import MAX_TENSORS_SHOWN
from rundirs import write_run_dir


def _adapters(a: Path, b: Path, tensors_a: dict[str, np.ndarray], tensors_b: dict[str, np.ndarray]) -> None:
    """Replace the adapters of two hand-built runs."""
    save_file(tensors_a, str(a / "adapter" / "adapter_model.safetensors"))
    save_file(tensors_b, str(b / "adapter" / "adapter_model.safetensors"))


def test_the_largest_differences_come_first_and_the_rest_are_counted(tmp_path: Path) -> None:
    """30 tensors: 3 equal, one NaN, 26 with differences 1e-9 .. 26e-9: the text says 27 of 30 differ,
    names the NaN first and then the nine largest in order, and counts the 17 left out; the JSON
    keeps all 30."""
    a, b = write_run_dir(tmp_path / "a"), write_run_dir(tmp_path / "b")
    base = {f"layers.{i}.lora_A.weight": np.zeros((2, 3), np.float32) for i in range(30)}
    other = {k: v.copy() for k, v in base.items()}
    for i in range(3, 29):
        other[f"layers.{i}.lora_A.weight"][1, 2] = np.float32(i * 1e-9)
    other["layers.29.lora_A.weight"][0, 0] = np.nan
    _adapters(a, b, base, other)
    result = compare_runs(a, b)
    lines = result.format().splitlines()
    at = lines.index(next(line for line in lines if line.startswith("adapter: differs")))
    assert lines[at + 1] == "  27 of 30 tensors differ, 3 equal; largest first:"
    listed = [line.split()[0] for line in lines[at + 2 : at + 2 + MAX_TENSORS_SHOWN]]
    assert listed == ["layers.29.lora_A.weight"] + [f"layers.{i}.lora_A.weight" for i in range(28, 19, -1)]
    assert lines[at + 2 + MAX_TENSORS_SHOWN] == "  ... and 17 more (compare --json lists every tensor)"
    assert result.adapter is not None and len(result.adapter.tensors) == 30


def test_files_that_differ_with_equal_values_say_so(tmp_path: Path) -> None:
    """Adapters whose tensors are equal in value but whose bytes differ (-0.0 against 0.0) list no
    tensor and say where the difference can be."""
    a, b = write_run_dir(tmp_path / "a"), write_run_dir(tmp_path / "b")
    zeros = {"w": np.zeros((2, 2), np.float32)}
    _adapters(a, b, zeros, {"w": -zeros["w"]})
    text = compare_runs(a, b).format()
    assert "adapter: differs" in text
    assert "  every tensor is equal in value: the files differ in their metadata or in bits" in text
    assert "max |diff|" not in text


def test_a_nan_in_both_adapters_at_one_place_is_no_difference(tmp_path: Path) -> None:
    """NaN in both files at the same element: that tensor is equal in value (the files differ in its
    payload bits only); a NaN on one side alone is a difference, listed first."""
    a, b = write_run_dir(tmp_path / "a"), write_run_dir(tmp_path / "b")
    quiet, payload = np.array([np.nan, 1.0], np.float32), np.array([1, 1], np.float32)
    payload.view(np.uint32)[0] = 0x7FC00001  # another NaN
    payload[1] = 1.0
    _adapters(a, b, {"w": quiet, "v": np.zeros(2, np.float32)}, {"w": payload, "v": np.zeros(2, np.float32)})
    result = compare_runs(a, b)
    assert result.adapter is not None and {t.name: t.max_abs_diff for t in result.adapter.tensors} == {
        "v": 0.0,
        "w": 0.0,
    }
    assert "every tensor is equal in value" in result.format()
    _adapters(a, b, {"w": quiet}, {"w": np.ones(2, np.float32)})
    listed = compare_runs(a, b).format()
    assert "  w  max |diff| nan" in listed

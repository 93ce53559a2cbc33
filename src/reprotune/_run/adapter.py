"""Read a run's adapter without torch: its tensors as NumPy arrays, and its sha256.

``compare`` and ``report`` read adapters through here (``safetensors.numpy``), so they never
import torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from reprotune._errors import InputError


def load_adapter(path: Path) -> dict[str, np.ndarray]:
    """The adapter's tensors as numpy arrays (bfloat16 widened to float32), by name.

    Args:
        path: an ``adapter_model.safetensors`` file.

    Raises:
        InputError: the file is not a readable safetensors file.
    """
    from safetensors.numpy import load_file

    try:
        return dict(load_file(str(path)))
    except TypeError:
        # numpy has no bfloat16, so safetensors.numpy refuses it: widen by hand (exact).
        return _load_safetensors_widening(path)
    except Exception as exc:  # safetensors raises its own error types for a broken file
        raise InputError(
            f"cannot read the adapter: {exc}",
            source=str(path),
            fix="restore adapter/ from a copy of the run directory",
        ) from None


def _load_safetensors_widening(path: Path) -> dict[str, np.ndarray]:
    """Read a safetensors file whose dtypes numpy lacks (BF16), widening them to float32."""
    dtypes = {
        "F64": np.float64,
        "F32": np.float32,
        "F16": np.float16,
        "I64": np.int64,
        "I32": np.int32,
        "I16": np.int16,
        "I8": np.int8,
        "U8": np.uint8,
        "BOOL": np.bool_,
    }
    data = path.read_bytes()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
    except (struct.error, ValueError) as exc:
        raise InputError(f"not a safetensors file ({exc})", source=str(path)) from None
    body = data[8 + size :]
    tensors: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        chunk = body[start:end]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(chunk, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in dtypes:
            array = np.frombuffer(chunk, dtype=np.dtype(dtypes[info["dtype"]]).newbyteorder("<"))
        else:
            raise InputError(
                f"tensor {name!r} has dtype {info['dtype']}, which compare cannot read", source=str(path)
            )
        tensors[name] = array.reshape(info["shape"])
    return tensors

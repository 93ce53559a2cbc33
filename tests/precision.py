"""torch's float32 precision as a fresh process has it (torch 2.9 and later have two APIs: the
legacy TF32 flags and the fp32_precision settings), for tests that set it: the suite's autouse
fixture restores the legacy flags only."""

from __future__ import annotations

import torch

#: Each fp32_precision setting and the value a fresh process reads (torch 2.9 and later).
FRESH_PRECISION = (
    ("fp32_precision", lambda: torch.backends, "none"),
    ("fp32_precision_cuda_matmul", lambda: torch.backends.cuda.matmul, "none"),
    ("fp32_precision_cudnn", lambda: torch.backends.cudnn, "none"),
    ("fp32_precision_cudnn_conv", lambda: torch.backends.cudnn.conv, "tf32"),
    ("fp32_precision_cudnn_rnn", lambda: torch.backends.cudnn.rnn, "tf32"),
    ("fp32_precision_mkldnn", lambda: torch.backends.mkldnn, "none"),
    ("fp32_precision_mkldnn_matmul", lambda: torch.backends.mkldnn.matmul, "none"),
    ("fp32_precision_mkldnn_conv", lambda: torch.backends.mkldnn.conv, "none"),
    ("fp32_precision_mkldnn_rnn", lambda: torch.backends.mkldnn.rnn, "none"),
)


def put_fresh_precision() -> None:
    """Set torch's float32 precision as a fresh process has it, with torch's own setters: the
    legacy ones first, as each of them also sets some of the new settings."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("highest")
    if hasattr(torch.backends, "fp32_precision"):
        for _, holder, value in FRESH_PRECISION:
            holder().fp32_precision = value

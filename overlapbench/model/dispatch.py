"""Which arithmetic runs as overlapbench's own Triton kernels (kernels/).

Half-precision tensors on CUDA take the kernels: that is the layer an engine runs. Float32 and
CPU tensors take the torch code beside each kernel's caller, which is the kernels' oracle: the
float32 truth a bf16 run is checked against (sweep's `check: fp32`) is computed by torch, never
by the kernel it checks.
"""

from __future__ import annotations

import torch

HALF = (torch.bfloat16, torch.float16)


def uses_kernels(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype in HALF

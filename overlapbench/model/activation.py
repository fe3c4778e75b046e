"""The MLP's activation: SwiGLU of the gate/up projection's rows (dense MLP and each expert's).

Half precision on GPUs runs one Triton pass (kernels/swiglu.py); the torch code below is the
CPU and float32 path and that kernel's oracle (overlapbench/model/dispatch.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from overlapbench.model.dispatch import uses_kernels


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of rows [gate | up] -> [rows, width]."""
    if uses_kernels(gate_up) and gate_up.stride(-1) == 1:
        from kernels.swiglu import swiglu as kernel

        return kernel(gate_up)
    return torch_swiglu(gate_up)


def torch_swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """`swiglu` in torch ops: the oracle."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up

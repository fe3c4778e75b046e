"""RMSNorm, and the residual add + RMSNorm that follows each row-parallel block's reduction.

Half precision on GPUs runs one Triton kernel each (kernels/rmsnorm.py, overlapbench/model/dispatch.py);
the torch code here is the CPU and float32 path and the kernels' oracle.
"""

from __future__ import annotations

import torch

from overlapbench.model.dispatch import uses_kernels


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """rmsnorm(x) * weight over the last dimension, in fp32, rounded once to x's dtype (into `out`)."""
    if uses_kernels(x) and x.dim() == 2 and x.stride(1) == 1:
        from kernels.rmsnorm import rmsnorm

        return rmsnorm(x, weight, eps, out)
    normed = torch_rms_norm(x, weight, eps)
    return normed if out is None else out.copy_(normed)


def torch_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`rms_norm` in torch ops: the oracle."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_rms_norm(
    partial: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """residual += partial (in place); returns rmsnorm(residual) * weight (into `out` if given).

    On GPUs this is one fused Triton kernel, as in the engines the baseline stands for; the
    torch version is the CPU path and the kernel's test oracle.
    """
    if partial.is_cuda:
        from kernels.rmsnorm import fused_add_rmsnorm

        return fused_add_rmsnorm(partial, residual, weight, eps, out=out)
    residual += partial
    return rms_norm(residual, weight, eps, out)

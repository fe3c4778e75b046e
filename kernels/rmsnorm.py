"""Fused residual add + RMSNorm (and plain RMSNorm): one Triton kernel, and the torch reference
it must match.

Contract of the fused add, shared by both: ``residual += x`` in place (rounded once to residual's dtype), then
``out = rmsnorm(residual) * weight`` computed in fp32 from the *stored* residual. Normalizing
the rounded residual (not the fp32 sum) is what lets every rank of the all-reduce kernel
recompute bit-identical outputs from the gathered residual rows.

`rmsnorm` is the same kernel without the add (the stack's first norm): one read, one write.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Elements one program loads per tensor: a whole row must sit in registers (one pass, no re-read).
_TILE = 8192


def add_rmsnorm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pure-torch version of `fused_add_rmsnorm` (CPU fallback and test oracle)."""
    residual.copy_(residual.float() + x.float())
    r = residual.float()
    normed = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    if out is None:
        return normed.to(residual.dtype)
    return out.copy_(normed)


@triton.jit
def rmsnorm_rows(v, w, hidden, eps, AXIS: tl.constexpr):
    """rmsnorm of fp32 `v` along AXIS, its last (masked columns must hold 0), times fp32 `w`."""
    rstd = tl.rsqrt(tl.sum(v * v, axis=AXIS) / hidden + eps)
    return v * tl.expand_dims(rstd, AXIS) * w


@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, res_ptr, out_ptr, w_ptr,
    n_rows, hidden, stride_x, stride_res, stride_out, eps,
    BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr, ADD: tl.constexpr = True,
):
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < n_rows)[:, None] & (cols < hidden)[None, :]
    v = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if ADD:  # residual += x, rounded to its dtype; the norm reads the stored value
        res_ptrs = res_ptr + rows[:, None] * stride_res + cols[None, :]
        r = tl.load(res_ptrs, mask=mask, other=0.0).to(tl.float32)
        new = (v + r).to(res_ptr.dtype.element_ty)
        tl.store(res_ptrs, new, mask=mask)
        v = new.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
    y = rmsnorm_rows(v, w[None, :], hidden, eps, 1)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def fused_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """In place ``residual += x``; returns ``out = rmsnorm(residual) * weight`` ([tokens, hidden]).

    One Triton kernel on CUDA (or under TRITON_INTERPRET=1); the torch reference on plain CPU.
    """
    if out is None:
        out = torch.empty_like(residual)
    if not (x.is_cuda or _interpreting()):
        return add_rmsnorm_reference(x, residual, weight, eps, out)
    n_rows, hidden = residual.shape
    assert x.shape == residual.shape == out.shape and weight.shape == (hidden,)
    assert x.stride(1) == residual.stride(1) == out.stride(1) == 1 and weight.is_contiguous()
    _launch(x, residual, out, weight, eps, add=True)
    return out


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """``out = rmsnorm(x) * weight`` ([tokens, hidden], computed in fp32, rounded once to out's dtype).

    One Triton kernel, on CUDA or under TRITON_INTERPRET=1 (overlapbench.model.norms.rms_norm is the
    torch version, its oracle, and picks between them).
    """
    if out is None:
        out = torch.empty_like(x)
    assert x.shape == out.shape and weight.shape == (x.shape[1],)
    assert x.stride(1) == out.stride(1) == 1 and weight.is_contiguous()
    _launch(x, x, out, weight, eps, add=False)
    return out


def _launch(x, residual, out, weight, eps: float, add: bool) -> None:
    """One program per block of whole rows (a row sits in registers: one pass, no re-read)."""
    n_rows, hidden = out.shape
    if n_rows == 0:
        return
    block_h = triton.next_power_of_2(hidden)
    block_r = max(1, _TILE // block_h)
    num_warps = max(1, min(16, block_r * block_h // 512))
    _add_rmsnorm_kernel[(triton.cdiv(n_rows, block_r),)](
        x, residual, out, weight,
        n_rows, hidden, x.stride(0), residual.stride(0), out.stride(0), eps,
        BLOCK_R=block_r, BLOCK_H=block_h, ADD=add, num_warps=num_warps,
    )

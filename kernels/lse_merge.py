"""Exact merge of two partial attentions of the same queries by their log-sum-exps, one kernel.

Attention of queries over keys K1 and, separately, over keys K2 gives outputs o1, o2 and
log-sum-exps l1, l2 (natural log, of the scaled scores). Attention over K1 and K2 together is

    o = (exp(l1 - m) * o1 + exp(l2 - m) * o2) / (exp(l1 - m) + exp(l2 - m)),  m = max(l1, l2)

computed here in fp32 in one pass over o1 and o2 (three tensors' traffic). In plain torch ops
the same merge is about ten kernels and costs ~1 ms per layer at 32K tokens. A row whose keys
were all masked out on one side has l = -inf there and takes the other side whole; a row with
no keys at all on either side comes out as zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_T = 16  # query rows per program; one head per program


@triton.jit
def _lse_merge_kernel(
    o1_ptr, o2_ptr, l1_ptr, l2_ptr, out_ptr, lse_out_ptr, rows,
    o1_st, o1_sh, o2_st, o2_sh, l1_sh, l1_st, l2_sh, l2_st, out_st, out_sh, lo_sh, lo_st,
    HEAD_DIM: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, WRITE_LSE: tl.constexpr,
):
    head = tl.program_id(1)
    t = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    row_ok = t < rows
    mask = row_ok[:, None] & (d[None, :] < HEAD_DIM)
    a = tl.load(l1_ptr + head * l1_sh + t * l1_st, mask=row_ok, other=float("-inf")).to(tl.float32)
    b = tl.load(l2_ptr + head * l2_sh + t * l2_st, mask=row_ok, other=float("-inf")).to(tl.float32)
    m = tl.maximum(a, b)
    m = tl.where(m == float("-inf"), 0.0, m)  # no keys on either side: both weights 0
    wa, wb = tl.exp(a - m), tl.exp(b - m)
    total = wa + wb
    safe = tl.where(total == 0.0, 1.0, total)
    wa, wb = wa / safe, wb / safe
    x = tl.load(o1_ptr + t[:, None] * o1_st + head * o1_sh + d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = tl.load(o2_ptr + t[:, None] * o2_st + head * o2_sh + d[None, :], mask=mask, other=0.0).to(tl.float32)
    merged = wa[:, None] * x + wb[:, None] * y
    tl.store(out_ptr + t[:, None] * out_st + head * out_sh + d[None, :], merged.to(out_ptr.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        lse = tl.where(total == 0.0, float("-inf"), m + tl.log(safe))
        tl.store(lse_out_ptr + head * lo_sh + t * lo_st, lse, mask=row_ok)


def _check(o: torch.Tensor, lse: torch.Tensor, rows: int, heads: int, dim: int) -> None:
    if o.shape != (rows, heads, dim) or o.stride(-1) != 1:
        raise ValueError(f"outputs must be [rows, heads, head_dim] with unit last stride, got {tuple(o.shape)}")
    if lse.shape != (heads, rows):
        raise ValueError(f"log-sum-exps must be [heads, rows] = {(heads, rows)}, got {tuple(lse.shape)}")


def lse_merge(
    o1: torch.Tensor,
    lse1: torch.Tensor,
    o2: torch.Tensor,
    lse2: torch.Tensor,
    out: torch.Tensor | None = None,
    lse_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Merge o1 [rows, heads, D] (log-sum-exp lse1 [heads, rows]) with o2 (lse2) into `out`
    (o1's shape and dtype unless given; any strides with unit last stride). `lse_out`
    [heads, rows] fp32, if given, receives the merged log-sum-exp (to merge a third part)."""
    rows, heads, dim = o1.shape
    _check(o1, lse1, rows, heads, dim)
    _check(o2, lse2, rows, heads, dim)
    if out is None:
        out = torch.empty(rows, heads, dim, dtype=o1.dtype, device=o1.device)
    _check(out, lse2, rows, heads, dim)
    if rows == 0:
        return out
    lo = lse_out if lse_out is not None else lse1  # a placeholder pointer when not written
    grid = (triton.cdiv(rows, BLOCK_T), heads)
    _lse_merge_kernel[grid](
        o1, o2, lse1, lse2, out, lo, rows,
        o1.stride(0), o1.stride(1), o2.stride(0), o2.stride(1),
        lse1.stride(0), lse1.stride(1), lse2.stride(0), lse2.stride(1),
        out.stride(0), out.stride(1), lo.stride(0), lo.stride(1),
        HEAD_DIM=dim, BLOCK_T=BLOCK_T, BLOCK_D=triton.next_power_of_2(dim), WRITE_LSE=lse_out is not None,
    )
    return out


def lse_merge_reference(
    o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same merge in torch ops (fp32): (output in o1's dtype, merged log-sum-exp)."""
    a, b = lse1.float().t()[..., None], lse2.float().t()[..., None]  # [rows, heads, 1]
    m = torch.maximum(a, b)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    wa, wb = torch.exp(a - m), torch.exp(b - m)
    total = wa + wb
    safe = torch.where(total == 0, torch.ones_like(total), total)
    out = (wa * o1.float() + wb * o2.float()) / safe
    lse = torch.where(total == 0, torch.full_like(m, float("-inf")), m + torch.log(safe))
    return out.to(o1.dtype), lse[..., 0].t()

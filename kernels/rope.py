"""RoPE of q and k in one pass over the QKV projection's rows: one Triton kernel.

Each program takes a tile of rows times a group of heads of one section of the projection (q,
k, or v) and reads it once: the QKV bias where the caller asks for it (the SP path, whose GEMM
takes none), Qwen3's per-head RMSNorm of q and k (fp32 statistics over the head), the rotation
(rotate-half convention, cos/sin from the table at each row's position), and one write, rounded
once to the output's dtype. q and k go to their own [rows, heads, head_dim] outputs (dense, as
the attention kernels take them; k may be a KV buffer's rows, the split's store in this pass);
v is written only where asked (its bias added in place, or a copy into a KV buffer), else left
where the GEMM put it.

Bytes: q and k read and written once, cos/sin rows read once per group of heads (from L2).
overlapbench/model/rope.py holds the torch version (the oracle, and the CPU and float32 path) and
picks between them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

GROUP = 4  # heads per program: the cos/sin rows it loads serve this many heads
BLOCK_T = 16  # rows per program


@triton.jit
def _heads(
    src_ptr, stride_src, dst_ptr, stride_dst, rows, row_mask, first, count,
    pos_ptr, cos_ptr, sin_ptr, stride_cs, bias_ptr, w_ptr, eps,
    HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, GROUP_SIZE: tl.constexpr,
    ROTATE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
):
    """Heads [first, first + GROUP_SIZE) (those < count) of one section, for `rows`: a
    [rows, heads, half] tile of each half of the head dimension."""
    heads = first + tl.arange(0, GROUP_SIZE)
    cols = tl.arange(0, BLOCK_HALF)
    mask = row_mask[:, None, None] & (heads < count)[None, :, None] & (cols < HALF)[None, None, :]
    at = heads[None, :, None] * (2 * HALF) + cols[None, None, :]  # column within the section
    src = src_ptr + rows[:, None, None] * stride_src + at
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        x1 += tl.load(bias_ptr + at, mask=mask, other=0.0).to(tl.float32)
        x2 += tl.load(bias_ptr + at + HALF, mask=mask, other=0.0).to(tl.float32)
    if ROTATE:
        if HAS_NORM:  # RMSNorm over each head's head_dim (masked columns are 0)
            rstd = tl.rsqrt((tl.sum(x1 * x1, axis=2) + tl.sum(x2 * x2, axis=2)) / (2 * HALF) + eps)
            w_mask = cols < HALF
            w1 = tl.load(w_ptr + cols, mask=w_mask, other=0.0).to(tl.float32)[None, None, :]
            w2 = tl.load(w_ptr + HALF + cols, mask=w_mask, other=0.0).to(tl.float32)[None, None, :]
            x1 = x1 * rstd[:, :, None] * w1
            x2 = x2 * rstd[:, :, None] * w2
        pos = tl.load(pos_ptr + rows, mask=row_mask, other=0)
        cs_mask = row_mask[:, None] & (cols < HALF)[None, :]
        cs = pos[:, None] * stride_cs + cols[None, :]
        cos = tl.load(cos_ptr + cs, mask=cs_mask, other=0.0)[:, None, :]
        sin = tl.load(sin_ptr + cs, mask=cs_mask, other=0.0)[:, None, :]
        x1, x2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    dst = dst_ptr + rows[:, None, None] * stride_dst + heads[None, :, None] * (2 * HALF) + cols[None, None, :]
    tl.store(dst, x1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, x2.to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    qkv_ptr, stride_qkv, pos_ptr, cos_ptr, sin_ptr, stride_cs, bias_ptr, qw_ptr, kw_ptr,
    q_ptr, stride_q, k_ptr, stride_k, v_ptr, stride_v, n_rows, eps,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, GROUP_SIZE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_NORM: tl.constexpr,
):
    q_groups: tl.constexpr = (HEADS + GROUP_SIZE - 1) // GROUP_SIZE
    kv_groups: tl.constexpr = (KV_HEADS + GROUP_SIZE - 1) // GROUP_SIZE
    k_at: tl.constexpr = HEADS * 2 * HALF  # the k section's first column in a row of qkv
    v_at: tl.constexpr = (HEADS + KV_HEADS) * 2 * HALF
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    row_mask = rows < n_rows
    group = tl.program_id(1)
    if group < q_groups:
        _heads(qkv_ptr, stride_qkv, q_ptr, stride_q, rows, row_mask, group * GROUP_SIZE, HEADS,
               pos_ptr, cos_ptr, sin_ptr, stride_cs, bias_ptr, qw_ptr, eps,
               HALF, BLOCK_HALF, GROUP_SIZE, True, HAS_BIAS, HAS_NORM)
    elif group < q_groups + kv_groups:
        _heads(qkv_ptr + k_at, stride_qkv, k_ptr, stride_k, rows, row_mask, (group - q_groups) * GROUP_SIZE, KV_HEADS,
               pos_ptr, cos_ptr, sin_ptr, stride_cs, bias_ptr + k_at, kw_ptr, eps,
               HALF, BLOCK_HALF, GROUP_SIZE, True, HAS_BIAS, HAS_NORM)
    else:  # launched only where v is written
        _heads(qkv_ptr + v_at, stride_qkv, v_ptr, stride_v, rows, row_mask, (group - q_groups - kv_groups) * GROUP_SIZE,
               KV_HEADS, pos_ptr, cos_ptr, sin_ptr, stride_cs, bias_ptr + v_at, kw_ptr, eps,
               HALF, BLOCK_HALF, GROUP_SIZE, False, HAS_BIAS, False)


def _check_rows(t: torch.Tensor, rows: int, heads: int, head_dim: int, name: str) -> None:
    """An output of `rows` rows (any row stride), each `heads` dense heads of `head_dim`."""
    ok = t.shape == (rows, heads, head_dim) and t.stride(2) == 1 and (t.stride(1) == head_dim or heads == 1)
    assert ok, f"{name}: expected [{rows}, {heads}, {head_dim}] with dense rows, got {tuple(t.shape)} strides {t.stride()}"


def rope_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float = 1e-6,
    bias: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
    v_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [rows, heads, head_dim] and k [rows, kv_heads, head_dim], normed (q_norm/k_norm, both
    or neither) and rotated, and v [rows, kv_heads, head_dim], from qkv [rows, (heads + 2
    kv_heads) * head_dim] (+ bias, added to all three); one kernel launch.

    cos/sin: [positions, head_dim / 2] float32 (overlapbench.model.rope.RopeTable). v is `v_out` if
    given (written), else the view of qkv's v columns (written in place only to add the bias).
    """
    rows, half = qkv.shape[0], head_dim // 2
    assert qkv.stride(1) == 1 and qkv.shape[1] == (heads + 2 * kv_heads) * head_dim
    assert (q_norm is None) == (k_norm is None), "q_norm and k_norm come together"
    assert cos.stride(1) == sin.stride(1) == 1 and cos.stride(0) == sin.stride(0) and cos.shape[1] == half
    v_view = qkv[:, (heads + kv_heads) * head_dim :].unflatten(1, (kv_heads, head_dim))
    q = qkv.new_empty(rows, heads, head_dim) if q_out is None else q_out
    k = qkv.new_empty(rows, kv_heads, head_dim) if k_out is None else k_out
    v = v_out if v_out is not None else v_view
    write_v = v_out is not None or bias is not None
    for t, n, name in ((q, heads, "q_out"), (k, kv_heads, "k_out"), (v, kv_heads, "v_out")):
        _check_rows(t, rows, n, head_dim, name)
    if rows == 0:
        return q, k, v
    groups = triton.cdiv(heads, GROUP) + triton.cdiv(kv_heads, GROUP) * (2 if write_v else 1)
    dummy = qkv  # pointer arguments a constexpr leaves unread
    _rope_kernel[(triton.cdiv(rows, BLOCK_T), groups)](
        qkv, qkv.stride(0), positions, cos, sin, cos.stride(0),
        dummy if bias is None else bias, dummy if q_norm is None else q_norm, dummy if k_norm is None else k_norm,
        q, q.stride(0), k, k.stride(0), v, v.stride(0), rows, eps,
        HEADS=heads, KV_HEADS=kv_heads, HALF=half, BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_ROWS=BLOCK_T, GROUP_SIZE=GROUP, HAS_BIAS=bias is not None, HAS_NORM=q_norm is not None,
        num_warps=4,
    )
    return q, k, v

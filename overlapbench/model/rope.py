"""Rotary position embeddings of q and k, with the QKV bias and Qwen3's q/k norms before them.

`RopeTable` holds cos/sin per position (computed in float64, stored in float32), built once per
batch. `rope_qkv` turns rows of the QKV projection into q, k, v heads: half precision on GPUs
in one Triton pass (kernels/rope.py), float32 and CPU through the torch code below, which is
that kernel's oracle (overlapbench/model/dispatch.py).
"""

from __future__ import annotations

import torch

from overlapbench.model.dispatch import uses_kernels
from overlapbench.model.models import ModelShape
from overlapbench.model.norms import torch_rms_norm


class RopeTable:
    """cos/sin of rotary embeddings for positions 0..max_pos-1 (rotate-half convention)."""

    def __init__(self, shape: ModelShape, max_pos: int, device) -> None:
        half = shape.head_dim // 2
        inv = shape.rope_theta ** (-torch.arange(half, dtype=torch.float64, device=device) / half)
        angles = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv
        self.cos = angles.cos().float()
        self.sin = angles.sin().float()

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: [rows, heads, head_dim], in float32, rounded back to x's dtype."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def rope_qkv(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    table: RopeTable,
    heads: int,
    kv_heads: int,
    head_dim: int,
    eps: float,
    bias: torch.Tensor | None = None,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    kv_out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of a QKV projection -> q [rows, heads, head_dim], k and v [rows, kv_heads, head_dim]:
    `bias` added (to q, k and v; None where the GEMM added it or there is none), the per-head
    q/k RMSNorms where given, then RoPE on q and k at each row's position. `kv_out`: (k, v)
    tensors to write k and v into (a KV buffer's rows), which are then the k and v returned."""
    if uses_kernels(qkv) and qkv.stride(1) == 1:
        from kernels.rope import rope_qkv as kernel

        k_out, v_out = (None, None) if kv_out is None else kv_out
        return kernel(qkv, positions, table.cos, table.sin, heads, kv_heads, head_dim, eps, bias, q_norm, k_norm,
                      k_out=k_out, v_out=v_out)
    q, k, v = torch_rope_qkv(qkv, positions, table, heads, kv_heads, head_dim, eps, bias, q_norm, k_norm)
    return (q, k, v) if kv_out is None else (q, kv_out[0].copy_(k), kv_out[1].copy_(v))


def torch_rope_qkv(qkv, positions, table: RopeTable, heads: int, kv_heads: int, head_dim: int, eps: float,
                   bias=None, q_norm=None, k_norm=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rope_qkv` in torch ops, in float32 inside: the oracle (the bias is added in place)."""
    if bias is not None:
        qkv = qkv.add_(bias)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(-1, heads, head_dim), k.view(-1, kv_heads, head_dim)
    if q_norm is not None:
        q, k = torch_rms_norm(q, q_norm, eps), torch_rms_norm(k, k_norm, eps)
    return table.apply(q, positions), table.apply(k, positions), v.view(-1, kv_heads, head_dim)

"""SwiGLU in one pass: SiLU(gate) * up of the gate/up projection's rows, one Triton kernel.

The projection's row is [gate | up] (the MLP's fused GEMM, and each expert's); the kernel reads
each half once and writes the product once, in fp32 inside, rounded once to the output's dtype:
where `F.silu(gate) * up` runs two kernels and a temporary as wide as the output.
overlapbench/model/activation.py holds the torch version (the oracle, and the CPU and float32 path)
and picks between them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# A program's tile and warps: 4096 elements, 16 per thread (16-byte accesses). 2 x 2048 at 8 warps
# ran 2-4% faster than 8 x 512 at 4 on llama3-70b's TP=2 shard (results/h200/, bench-pieces).
BLOCK_T, BLOCK_F, WARPS = 2, 2048, 8


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, n_rows, width, stride_x, stride_out, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    rows = (tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    mask = (rows < n_rows)[:, None] & (cols < width)[None, :]
    gate_ptrs = x_ptr + rows[:, None] * stride_x + cols[None, :]
    gate = tl.load(gate_ptrs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_ptrs + width, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu(gate_up: torch.Tensor, out: torch.Tensor | None = None, tile: tuple[int, int, int] | None = None) -> torch.Tensor:
    """SiLU(gate) * up of gate_up [rows, 2 * width] -> [rows, width] (into `out` if given).
    `tile`: (rows, columns, warps) of a program, for tests/benchmarks/layer_pieces.py to compare."""
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    assert gate_up.shape[1] == 2 * width and gate_up.stride(1) == 1
    if out is None:
        out = gate_up.new_empty(rows, width)
    assert out.shape == (rows, width) and out.stride(1) == 1
    if rows == 0 or width == 0:
        return out
    block_t, block_f, warps = tile or (BLOCK_T, BLOCK_F, WARPS)
    grid = (triton.cdiv(rows, block_t), triton.cdiv(width, block_f))
    _swiglu_kernel[grid](gate_up, out, rows, width, gate_up.stride(0), out.stride(0),
                         BLOCK_ROWS=block_t, BLOCK_COLS=block_f, num_warps=warps)
    return out

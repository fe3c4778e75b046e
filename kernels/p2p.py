"""A point-to-point copy on a fixed number of CTAs: the `sm` transport of flash_agrs.

The copy engine moves bytes without SMs but cannot be throttled or fused; this kernel is its
SM alternative, with the CTA budget as the knob: few CTAs leave the SMs to the GEMM it hides
under, so each CTA keeps many bytes in flight (16-byte vectors, a whole block loaded before
it is stored). Either side may be a peer's symmetric-memory buffer: the kernel reads and
writes peers through the mapped addresses, no NVLink multicast.

Both tensors are addressed relative to one `anchor` tensor in this process's memory (the
local symmetric buffer), as element offsets in 16-byte units: only the anchor is handed to
Triton as a pointer, so no peer address goes through the launcher's pointer checks, and the
16-byte unit tells the compiler every access is vector-aligned.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_BYTES = 32 * 1024  # bytes one CTA loads per step before storing them
_NUM_WARPS = 8


@triton.jit
def _copy_kernel(anchor_ptr, src_vec, dst_vec, n_vec, VEC: tl.constexpr, BLOCK: tl.constexpr):
    src = anchor_ptr + src_vec.to(tl.int64) * VEC  # peers can be gigabytes away
    dst = anchor_ptr + dst_vec.to(tl.int64) * VEC
    n = n_vec * VEC
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def _vec_offset(t: torch.Tensor, anchor: torch.Tensor, vec_bytes: int = 16) -> int:
    delta = t.data_ptr() - anchor.data_ptr()
    if delta % vec_bytes:
        raise ValueError("p2p copy: tensors must sit at 16-byte offsets from the anchor")
    return delta // vec_bytes


def copy(dst: torch.Tensor, src: torch.Tensor, num_ctas: int, anchor: torch.Tensor | None = None) -> torch.Tensor:
    """dst[...] = src[...] on `num_ctas` CTAs of the current stream; returns dst.

    Both contiguous, same dtype and size, a whole number of 16-byte vectors; `anchor` is a
    tensor of this process (default: dst) of the same dtype.
    """
    anchor = dst if anchor is None else anchor
    if dst.dtype != src.dtype or anchor.dtype != dst.dtype:
        raise ValueError(f"p2p copy: dtypes differ ({src.dtype} -> {dst.dtype}, anchor {anchor.dtype})")
    if dst.numel() != src.numel() or not (dst.is_contiguous() and src.is_contiguous()):
        raise ValueError("p2p copy: dst and src must be contiguous and of the same size")
    if num_ctas < 1:
        raise ValueError(f"p2p copy: num_ctas={num_ctas} must be >= 1")
    size = dst.element_size()
    if dst.numel() * size % 16:
        raise ValueError("p2p copy: the size must be a whole number of 16-byte vectors")
    if dst.numel() == 0:
        return dst
    vec = 16 // size
    block = triton.next_power_of_2(_BLOCK_BYTES // size)
    grid = (min(num_ctas, triton.cdiv(dst.numel(), block)),)
    _copy_kernel[grid](
        anchor, _vec_offset(src, anchor), _vec_offset(dst, anchor), dst.numel() // vec,
        VEC=vec, BLOCK=block, num_warps=_NUM_WARPS,
    )
    return dst

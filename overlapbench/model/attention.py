"""Causal attention of a chunk's rows: whole sequences, and runs of rows that continue a sequence
whose earlier positions an earlier chunk computed.

A run at positions [start, start + length) of its sequence attends to positions [0, start)
(the prefix, read from the KV buffer) and to its own rows (causally). Its mask is causal
aligned lower-right, which PyTorch 2.11 never runs on cuDNN, the fastest kernel on Hopper. So
it is computed as two calls that cuDNN does run (`kernels`):

    own:    the chunk's queries over the chunk's own keys, causal and square per run;
    prefix: the continuing runs' queries over their prefixes, no mask;

merged exactly by their log-sum-exps in one fused kernel (kernels/lse_merge.py). FLOPs are
exactly the lower-right amount. All runs of a chunk go into one call each (batched where
their lengths are equal, varlen otherwise), not a loop over sequences; the geometry is planned
once, at build (`ChunkPlan`), so nothing is copied to the device while a CUDA graph is captured.

Decode tokens of a mixed batch each attend to their own sequence's KV cache: one query over
context + 1 keys, no mask. All of a chunk's decode tokens go into ONE batched call
(`decode_attention`: batch = decode tokens, one query each, K/V with their own kv heads).

The kernel is picked once per (device, dtype, heads) by what this GPU and torch can do, checked
against a float32 reference (`attention_kernels.select`); `recording()` collects the names of
the paths that ran, for the result rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from overlapbench.model import attention_kernels as kernels


class SegmentLike(Protocol):
    """A run of `length` rows at chunk row `row`: positions [start, start + length) of a sequence
    whose positions [0, start) are at KV-buffer rows [kv_row, kv_row + start)."""

    row: int
    length: int
    start: int
    kv_row: int


@dataclass
class Prefixed:
    """Adjacent continuing runs whose prefixes also lie back to back: one prefix call."""

    rows: slice  # query rows in the chunk
    keys: slice  # their prefixes' rows in the KV buffer
    q_lens: kernels.Ragged
    k_lens: kernels.Ragged


@dataclass
class ChunkPlan:
    """The geometry of one chunk's attention, with its cumulative lengths on the device."""

    size: int
    own: kernels.Ragged  # every run's own rows, causal square each
    prefixed: list[Prefixed]

    @classmethod
    def of(cls, segments: tuple[SegmentLike, ...], size: int, device) -> ChunkPlan:
        own = kernels.Ragged.of([s.length for s in segments], device)
        groups: list[list[SegmentLike]] = []
        for s in segments:
            if s.start == 0:
                continue
            last = groups[-1][-1] if groups else None
            if last is not None and last.row + last.length == s.row and last.kv_row + last.start == s.kv_row:
                groups[-1].append(s)
            else:
                groups.append([s])
        prefixed = [
            Prefixed(
                rows=slice(g[0].row, g[-1].row + g[-1].length),
                keys=slice(g[0].kv_row, g[-1].kv_row + g[-1].start),
                q_lens=kernels.Ragged.of([s.length for s in g], device),
                k_lens=kernels.Ragged.of([s.start for s in g], device),
            )
            for g in groups
        ]
        return cls(size, own, prefixed)


_RAN: set[str] | None = None  # names of the kernels that ran, while `recording`


@contextlib.contextmanager
def recording() -> Iterator[set[str]]:
    """Collect the names of the attention kernels that run inside the block."""
    global _RAN
    outer, _RAN = _RAN, set()
    try:
        yield _RAN
    finally:
        _RAN = outer


def describe(names: set[str]) -> str | None:
    return ",".join(sorted(names)) or None


def _note(name: str) -> None:
    if _RAN is not None:
        _RAN.add(name)


def causal_attention(
    plan: ChunkPlan,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_k: torch.Tensor | None,
    kv_v: torch.Tensor | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of a chunk's rows -> [rows, heads * head_dim] (into `out` if given).

    q [rows, Hq, D], k/v [rows, Hkv, D]: the chunk's own; kv_k/kv_v [*, Hkv, D]: the KV buffer
    holding the continuing runs' prefixes (None when no run continues). K/V with fewer heads
    than q go in as they are.
    """
    rows, heads, dim = q.shape
    kernel = kernels.select(q.device, q.dtype, heads, k.shape[1], dim)
    if out is None and (rows == 0 or not kernel.has_lse or plan.prefixed):
        out = torch.empty(rows, heads * dim, dtype=q.dtype, device=q.device)
    if rows == 0:
        return out
    if not kernel.has_lse:  # the fallback: whole lower-right calls, one per run
        _note(kernel.name)
        return kernel.lower_right(plan, q, k, v, kv_k, kv_v, out)
    o_own, lse_own = kernel.causal(q, k, v, plan.own, want_lse=bool(plan.prefixed))
    if not plan.prefixed:
        _note(kernel.path(plan.own, plan.own))
        if out is None:  # no copy: the kernel's output, viewed as rows
            return o_own.reshape(rows, heads * dim)
        out.view(rows, heads, dim).copy_(o_own)
        return out
    assert kv_k is not None and kv_v is not None, "a chunk that continues a sequence needs its KV buffer"
    paths = [kernel.path(plan.own, plan.own)] + [kernel.path(p.q_lens, p.k_lens) for p in plan.prefixed]
    _note("+".join(dict.fromkeys(paths)) + "+lse_merge")  # e.g. cudnn+lse_merge, cudnn_batched+flash_varlen+lse_merge
    out3, done = out.view(rows, heads, dim), 0
    for p in plan.prefixed:
        if p.rows.start > done:  # rows of whole sequences: the own call's result as it is
            out3[done : p.rows.start].copy_(o_own[done : p.rows.start])
        o_pre, lse_pre = kernel.cross(q[p.rows], kv_k[p.keys], kv_v[p.keys], p.q_lens, p.k_lens)
        merge(o_pre, lse_pre, o_own[p.rows], lse_own[:, p.rows], out3[p.rows])
        done = p.rows.stop
    if done < rows:
        out3[done:].copy_(o_own[done:])
    return out


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """Each decode token's query over its own cache, one batched call -> [tokens, heads * head_dim].

    q [tokens, Hq, D]; k_cache/v_cache [tokens, keys, Hkv, D] (token i's keys are row i's).
    """
    tokens, heads, dim = q.shape
    kernel = kernels.select(q.device, q.dtype, heads, k_cache.shape[2], dim)
    if out is None:
        out = torch.empty(tokens, heads * dim, dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    _note(kernel.decode_path)
    out.view(tokens, heads, dim).copy_(kernel.decode(q, k_cache, v_cache))
    return out


def merge(o1, lse1, o2, lse2, out: torch.Tensor) -> torch.Tensor:
    """out = the exact merge of two partial attentions (kernels/lse_merge.py); torch ops on CPU."""
    if out.is_cuda:
        from kernels.lse_merge import lse_merge

        return lse_merge(o1, lse1, o2, lse2, out=out)
    from kernels.lse_merge import lse_merge_reference

    return out.copy_(lse_merge_reference(o1, lse1, o2, lse2)[0])

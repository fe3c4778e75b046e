"""kernels/lse_merge.py in Triton's interpreter, against its torch reference and against
attention over the union of the keys."""

from __future__ import annotations

import math

import pytest

from tests.interpreter import use_interpreter

triton = use_interpreter()  # before anything imports triton
torch = pytest.importorskip("torch")

from kernels.lse_merge import lse_merge, lse_merge_reference  # noqa: E402
from overlapbench.model.attention_kernels import softmax_attention  # noqa: E402


def parts(rows: int, heads: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    o1, o2 = torch.randn(rows, heads, dim, generator=g), torch.randn(rows, heads, dim, generator=g)
    l1, l2 = 4 * torch.randn(heads, rows, generator=g), 4 * torch.randn(heads, rows, generator=g)
    return o1, l1, o2, l2


@pytest.mark.parametrize("rows,heads,dim", [(1, 1, 16), (37, 3, 96), (16, 4, 128), (50, 2, 64)])
def test_merge_matches_reference(rows, heads, dim):
    o1, l1, o2, l2 = parts(rows, heads, dim, seed=rows * heads + dim)
    lse = torch.full((heads, rows), float("nan"))
    out = lse_merge(o1, l1, o2, l2, lse_out=lse)
    ref, ref_lse = lse_merge_reference(o1, l1, o2, l2)
    assert (out - ref).abs().max() < 1e-5 and (lse - ref_lse).abs().max() < 1e-5


def test_merge_takes_strided_views_and_writes_into_out():
    o1, l1, o2, l2 = parts(40, 8, 32, seed=5)
    wide = torch.randn(40, 8, 48)[:, :, :32]  # row and head strides that are not dim
    l1t = l1.t().contiguous().t()  # [heads, rows] with strides (1, heads)
    out = torch.full((40, 8 * 32), float("nan"))
    lse_merge(wide, l1t, o2, l2, out=out.view(40, 8, 32)[:, :, :])
    ref, _ = lse_merge_reference(wide, l1, o2, l2)
    assert (out.view(40, 8, 32) - ref).abs().max() < 1e-5


def test_infinite_lse_takes_the_other_side_and_empty_rows_are_zero():
    o1, l1, o2, l2 = parts(5, 2, 16, seed=9)
    l1[0, 1] = float("-inf")
    l1[1, 3] = l2[1, 3] = float("-inf")
    out = lse_merge(o1, l1, o2, l2)
    assert torch.equal(out[1, 0], o2[1, 0])
    assert torch.equal(out[3, 1], torch.zeros(16)) and not out.isnan().any()


def test_merge_of_two_key_sets_is_attention_over_both():
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(13, 4, 32, generator=g), torch.randn(29, 2, 32, generator=g), torch.randn(29, 2, 32, generator=g)
    o1, l1 = softmax_attention(q, k[:17], v[:17], causal=False)
    o2, l2 = softmax_attention(q, k[17:], v[17:], causal=False)
    whole, lse = softmax_attention(q, k, v, causal=False)
    merged_lse = torch.empty(4, 13)
    merged = lse_merge(o1, l1, o2, l2, lse_out=merged_lse)
    assert (merged - whole).abs().max() < 1e-5 and (merged_lse - lse).abs().max() < 1e-5
    assert math.isfinite(merged_lse.sum().item())


def test_bad_shapes_are_refused():
    o1, l1, o2, l2 = parts(6, 2, 16, seed=1)
    with pytest.raises(ValueError, match=r"\[heads, rows\]"):
        lse_merge(o1, l1.t(), o2, l2)

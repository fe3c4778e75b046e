"""The layer's elementwise kernels (RoPE with bias and q/k norms, SwiGLU, RMSNorm) in Triton's
interpreter, against their torch oracles, on fresh random inputs at odd sizes: rows that are no
multiple of a tile, heads that are no multiple of a head group, a head_dim whose half is no
power of two, strided rows, outputs poisoned with NaN before each call.
"""

from __future__ import annotations

import pytest

from tests.interpreter import use_interpreter

triton = use_interpreter()  # before anything imports triton
torch = pytest.importorskip("torch")

from kernels import rmsnorm as rmsnorm_kernel  # noqa: E402
from kernels import rope as rope_kernel  # noqa: E402
from kernels import swiglu as swiglu_kernel  # noqa: E402
from overlapbench.model import activation, norms, rope  # noqa: E402
from overlapbench.model.models import ModelShape  # noqa: E402

EPS = 1e-6


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _gen(*seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(seed) % (2**31))


# ---------------------------------------------------------------- RoPE


def _case(rows: int, heads: int, kv_heads: int, head_dim: int, seed: int, pad: int = 0):
    """Fresh qkv rows (row stride widened by `pad`), positions out of order, and a table."""
    g = _gen(rows, heads, kv_heads, head_dim, seed)
    width = (heads + 2 * kv_heads) * head_dim
    qkv = torch.randn(rows, width + pad, generator=g)[:, :width]
    positions = torch.randint(0, 3 * rows + 5, (rows,), generator=g)
    shape = ModelShape(hidden=64, ffn=64, heads=heads, kv_heads=kv_heads, head_dim=head_dim, rope_theta=1e4)
    table = rope.RopeTable(shape, 3 * rows + 5, "cpu")
    return qkv, positions, table, g


CASES = [  # rows, heads, kv_heads, head_dim: odd rows, heads past a group of 4, half of 12 (not a power of 2)
    (1, 4, 4, 16), (7, 5, 1, 8), (33, 6, 2, 24), (17, 8, 2, 16), (40, 3, 3, 32),
]


@pytest.mark.parametrize("rows,heads,kv_heads,head_dim", CASES)
@pytest.mark.parametrize("bias,norm", [(False, False), (True, False), (False, True), (True, True)])
def test_rope_kernel_matches_the_torch_oracle(rows, heads, kv_heads, head_dim, bias, norm):
    qkv, positions, table, g = _case(rows, heads, kv_heads, head_dim, seed=1, pad=8)
    b = torch.randn(qkv.shape[1], generator=g) if bias else None
    qn, kn = (1 + 0.1 * torch.randn(2, head_dim, generator=g)).unbind() if norm else (None, None)
    v_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    ref = rope.rope_qkv(qkv.clone(), positions, table, heads, kv_heads, head_dim, EPS, b, qn, kn)  # CPU: torch
    q_out = torch.full((rows, heads, head_dim), float("nan"))
    k_out = torch.full((rows, kv_heads, head_dim), float("nan"))
    q, k, v = rope_kernel.rope_qkv(qkv, positions, table.cos, table.sin, heads, kv_heads, head_dim, EPS, b, qn, kn,
                                   q_out=q_out, k_out=k_out)
    assert q.data_ptr() == q_out.data_ptr() and k.data_ptr() == k_out.data_ptr()
    for name, ours, theirs in (("q", q, ref[0]), ("k", k, ref[1]), ("v", v, ref[2])):
        assert ours.shape == theirs.shape and rel_err(ours, theirs) < 1e-5, name
    expected_v = v_before + b[(heads + kv_heads) * head_dim :] if bias else v_before
    assert torch.equal(v.reshape(rows, -1), expected_v), "v: the bias added in place, else untouched"
    assert v.data_ptr() == qkv[:, (heads + kv_heads) * head_dim :].data_ptr(), "v stays a view of the projection"


def test_rope_kernel_rotates_by_position_not_by_row():
    """The same row at two positions rotates differently; at position 0 RoPE is the identity."""
    qkv, _, table, _ = _case(2, 2, 1, 16, seed=2)
    qkv[1] = qkv[0]
    q, k, _ = rope_kernel.rope_qkv(qkv, torch.tensor([0, 5]), table.cos, table.sin, 2, 1, 16)
    assert torch.allclose(q[0], qkv[0, :32].view(2, 16)) and torch.allclose(k[0], qkv[0, 32:48].view(1, 16))
    assert not torch.allclose(q[1], q[0])


def test_rope_kernel_writes_k_and_v_into_a_kv_buffer():
    """The split's KV store in the RoPE pass: k and v straight into rows of a buffer."""
    rows, heads, kv_heads, d = 9, 4, 2, 16
    qkv, positions, table, _ = _case(rows, heads, kv_heads, d, seed=3)
    ref = rope.rope_qkv(qkv.clone(), positions, table, heads, kv_heads, d, EPS)
    k_buffer, v_buffer = (torch.full((rows + 4, kv_heads, d), float("nan")) for _ in range(2))
    _, k, v = rope_kernel.rope_qkv(qkv, positions, table.cos, table.sin, heads, kv_heads, d,
                                   k_out=k_buffer[2 : 2 + rows], v_out=v_buffer[2 : 2 + rows])
    assert k.data_ptr() == k_buffer[2].data_ptr() and v.data_ptr() == v_buffer[2].data_ptr()
    assert rel_err(k, ref[1]) < 1e-5 and torch.equal(v.reshape(rows, -1), qkv[:, (heads + kv_heads) * d :])
    for buffer in (k_buffer, v_buffer):
        assert buffer[:2].isnan().all() and buffer[2 + rows :].isnan().all(), "only its rows are written"


def test_rope_kernel_in_bf16_rounds_once():
    qkv, positions, table, _ = _case(21, 8, 2, 16, seed=4)
    ref = rope.rope_qkv(qkv.clone(), positions, table, 8, 2, 16, EPS)  # float32
    q, k, _ = rope_kernel.rope_qkv(qkv.bfloat16(), positions, table.cos, table.sin, 8, 2, 16)
    assert q.dtype == torch.bfloat16 and rel_err(q, ref[0]) < 8e-3 and rel_err(k, ref[1]) < 8e-3


def test_rope_kernel_with_no_rows():
    _, _, table, _ = _case(1, 2, 1, 8, seed=5)
    q, k, v = rope_kernel.rope_qkv(torch.empty(0, 32), torch.empty(0, dtype=torch.long), table.cos, table.sin, 2, 1, 8)
    assert q.shape == (0, 2, 8) and k.shape == (0, 1, 8) and v.shape == (0, 1, 8)


# ---------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("rows,width", [(1, 5), (9, 96), (31, 600), (8, 1024)])
def test_swiglu_kernel_matches_the_torch_oracle(rows, width):
    g = _gen(rows, width)
    gate_up = 3 * torch.randn(rows, 2 * width + 3, generator=g)[:, : 2 * width]  # strided rows
    out = torch.full((rows, width), float("nan"))
    got = swiglu_kernel.swiglu(gate_up, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert rel_err(got, activation.swiglu(gate_up)) < 1e-6  # CPU: the torch oracle


def test_swiglu_kernel_in_bf16():
    gate_up = torch.randn(13, 2 * 200, generator=_gen(6))
    got = swiglu_kernel.swiglu(gate_up.bfloat16())
    assert got.dtype == torch.bfloat16 and rel_err(got, activation.swiglu(gate_up)) < 8e-3


# ---------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("rows,hidden", [(1, 64), (5, 96), (17, 1000), (3, 4096)])
def test_rmsnorm_kernel_matches_the_torch_oracle(rows, hidden):
    g = _gen(rows, hidden)
    x = 2 * torch.randn(rows, hidden + 16, generator=g)[:, :hidden]
    weight = 1 + 0.1 * torch.randn(hidden, generator=g)
    out = torch.full((rows, hidden), float("nan"))
    before = x.clone()
    got = rmsnorm_kernel.rmsnorm(x, weight, EPS, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.equal(x, before), "x is read only"
    assert rel_err(got, norms.rms_norm(x, weight, EPS)) < 1e-5  # CPU: the torch oracle

"""The mixture-of-experts MLP of one rank under tensor parallelism: router, then grouped experts.

Sharding. The router ([experts, hidden]) is replicated: every rank routes every token the same
way, since every rank holds the same normed input. Each expert's FFN is sharded over the TP
ranks exactly as the dense FFN is: its gate|up column-parallel ([experts, 2 * expert_ffn / tp,
hidden]), its down row-parallel ([experts, hidden, expert_ffn / tp]). So a rank's output is a
partial sum of every token's expert outputs, reduced by the same one all-reduce (or
reduce-scatter) that reduces the dense MLP's partial: a strategy's schedule is the dense one's.

Routing. softmax over all experts (in fp32), the top_k, and those k weights renormalized to
sum to 1: what Mixtral does, and Qwen3-MoE with `norm_topk_prob: true` (its MoE configs).

Experts. The token-expert assignments are sorted by expert; per-expert counts become group
offsets on the device (a scatter-add into a fixed-size tensor: no host sync), and the experts
run as two grouped GEMMs (gate|up, then down) with SwiGLU between them. The weighted sum back
to the tokens is a batched [1, k] x [k, hidden] product per token after the sorted rows are
scattered back to assignment order: deterministic (no atomics), accumulated in fp32. On GPUs
the grouped GEMM is PyTorch's (bf16 on sm90+: a CUTLASS kernel, CUDA-graph capturable; other
dtypes fall back to a per-group loop that reads the offsets on the host, so fp32 runs eagerly
only); on CPU a loop over the groups computes the same thing.

`reference_moe` is the oracle the tests hold the grouped path to: every expert on the tokens
that chose it, one at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from overlapbench.model.activation import swiglu


def route(normed: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [tokens, top_k] fp32 summing to 1 per token, experts [tokens, top_k] int64)."""
    logits = normed.float() @ router.float().t()
    weights, experts = logits.softmax(dim=-1).topk(top_k, dim=-1)
    return weights / weights.sum(dim=-1, keepdim=True), experts


def grouped_mm(a: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows offsets[e-1]:offsets[e] of a [rows, K] times w[e].T, w: [groups, N, K] (nn.Linear
    layout) -> [rows, N]. `offsets`: int32 group ends on a's device."""
    if a.is_cuda:
        op = getattr(F, "grouped_mm", None) or torch._grouped_mm
        return op(a, w.transpose(-2, -1), offs=offsets)  # b stored K-major: the kernel's layout
    out = a.new_empty(a.shape[0], w.shape[1])
    begin = 0
    for e, end in enumerate(offsets.tolist()):
        torch.matmul(a[begin:end], w[e].t(), out=out[begin:end])
        begin = end
    return out


def moe_partial(
    normed: torch.Tensor,
    router: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    top_k: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """This rank's partial sum of the routed experts' outputs for `normed` [tokens, hidden]."""
    tokens, experts = normed.shape[0], router.shape[0]
    if tokens == 0:  # no rows (a shape, not a value: no sync); grouped GEMMs want at least one
        return normed.new_zeros(0, w_down.shape[1]) if out is None else out
    weights, chosen = route(normed, router, top_k)
    flat = chosen.flatten()  # assignment a = token * top_k + j
    order = flat.argsort(stable=True)  # assignments sorted by expert
    counts = torch.zeros(experts, dtype=torch.int32, device=normed.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offsets = counts.cumsum(0, dtype=torch.int32)
    rows = normed[order // top_k]  # each sorted assignment's token
    y = grouped_mm(swiglu(grouped_mm(rows, w_gate_up, offsets)), w_down, offsets)
    by_assignment = y.new_empty(y.shape)  # contiguous (a grouped GEMM may pad its rows)
    by_assignment[order] = y
    return _weighted_sum(weights, by_assignment.view(tokens, top_k, -1), out)


def _weighted_sum(weights: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """sum_j weights[t, j] * y[t, j] -> [tokens, hidden] (into `out` if given)."""
    w = weights.to(y.dtype).unsqueeze(1)  # [tokens, 1, top_k]
    if out is not None and out.is_contiguous():
        torch.bmm(w, y, out=out.view(out.shape[0], 1, out.shape[1]))
        return out
    result = torch.bmm(w, y).squeeze(1)
    return result if out is None else out.copy_(result)


def reference_moe(
    normed: torch.Tensor, router: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, top_k: int
) -> torch.Tensor:
    """The oracle: each expert on the tokens that chose it, in a Python loop (host syncs)."""
    weights, chosen = route(normed, router, top_k)
    out = torch.zeros(normed.shape, dtype=torch.float32, device=normed.device)
    for e in range(router.shape[0]):
        token, slot = (chosen == e).nonzero(as_tuple=True)
        if token.numel():
            y = swiglu(normed[token] @ w_gate_up[e].t()) @ w_down[e].t()
            out.index_add_(0, token, y.float() * weights[token, slot, None])
    return out.to(normed.dtype)

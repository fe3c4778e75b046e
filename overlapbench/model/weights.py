"""The layer stack's weights: seeded, sharded Megatron style, the same function for every TP.

Each weight is drawn from a seed of its own (layer, name, shard), so a rank builds its shard alone
and the single-process reference (`rank=None`) joins the shards into the unsharded stack: both
compute the same function from the same seed. The stack's input is seeded the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from overlapbench.model.models import ModelShape


@dataclass
class LayerWeights:
    """One layer's weights on one rank, nn.Linear layout ([out, in])."""

    attn_norm: torch.Tensor  # [hidden]
    wqkv: torch.Tensor  # [(heads + 2 kv_heads) / tp * head_dim, hidden]: this rank's q | k | v
    bqkv: torch.Tensor | None  # [(heads + 2 kv_heads) / tp * head_dim]: its bias (shape.qkv_bias), else None
    q_norm: torch.Tensor | None  # [head_dim], replicated: Qwen3's per-head q RMSNorm (shape.qk_norm), else None
    k_norm: torch.Tensor | None  # [head_dim], replicated: the same for k
    wo: torch.Tensor  # [hidden, heads / tp * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 ffn / tp, hidden]: this rank's gate | up (MoE: [experts, 2 expert_ffn / tp, hidden])
    w_down: torch.Tensor  # [hidden, ffn / tp] (MoE: [experts, hidden, expert_ffn / tp])
    router: torch.Tensor | None = None  # MoE: [experts, hidden], the same on every rank


@dataclass
class Stack:
    """A rank's shard of the layer stack (tp=1: the whole, unsharded stack)."""

    shape: ModelShape
    tp: int
    layers: list[LayerWeights]
    final_norm: torch.Tensor

    @property
    def heads(self) -> int:
        return self.shape.heads // self.tp

    @property
    def kv_heads(self) -> int:
        return self.shape.kv_heads // self.tp

    @property
    def device(self) -> torch.device:
        return self.final_norm.device

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.dtype

    def norm_after(self, layer: int) -> torch.Tensor:
        """The norm applied to the residual leaving `layer`: the next layer's, or the final one."""
        return self.layers[layer + 1].attn_norm if layer + 1 < len(self.layers) else self.final_norm


def seeded_randn(shape: tuple[int, ...], seed: int, device: torch.device, scale: float) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32) * scale


def stable_seed(seed: int, layer: int, name: str, shard: int) -> int:
    """A stable per-(layer, weight, shard) seed, so shards can be made independently."""
    code = sum((i + 1) * ord(c) for i, c in enumerate(name))
    return (seed * 1_000_003 + layer * 10_007 + code * 101 + shard) % (2**62)


def _shard(shape: ModelShape, tp: int, layer: int, shard: int, seed: int, num_layers: int, device) -> dict:
    """Shard `shard` of `tp` of one layer's weights, in fp32.

    Weights are N(0, 1/fan_in); the output projections (O, down) are scaled down by
    sqrt(2 * num_layers) as in Megatron's and GPT-2's initialization, so each block adds a
    small update to a residual stream that dominates, as in trained models. (With unscaled
    outputs, bf16 rounding differences between two correct schedules compound to ~1e-2.)
    """
    h, d = shape.hidden, shape.head_dim
    q, kv, f = shape.heads // tp * d, shape.kv_heads // tp * d, shape.mlp_width // tp
    out_scale = (2 * num_layers) ** -0.5

    def make(name: str, rows: int, cols: int, scale: float = 1.0, base: int = seed) -> torch.Tensor:
        return seeded_randn((rows, cols), stable_seed(base, layer, name, shard), device, scale * cols**-0.5)

    biases = {}
    if shape.qkv_bias:  # N(0, 0.5^2) against q, k, v of unit scale: a bias that matters, as Qwen2's do
        for name, rows in (("bq", q), ("bk", kv), ("bv", kv)):
            biases[name] = seeded_randn((rows,), stable_seed(seed, layer, name, shard), device, 0.5)
    weights = {"wq": make("wq", q, h), "wk": make("wk", kv, h), "wv": make("wv", kv, h), **biases,
               "wo": make("wo", h, q, out_scale)}
    if not shape.moe:
        return weights | {"gate": make("gate", f, h), "up": make("up", f, h), "down": make("down", h, f, out_scale)}
    # Expert e's shard is seeded from (layer, e, shard): shards are made independently, as above.
    bases = [stable_seed(seed, layer, "expert", e) for e in range(shape.experts)]
    return weights | {
        "gate": torch.stack([make("gate", f, h, base=b) for b in bases]),
        "up": torch.stack([make("up", f, h, base=b) for b in bases]),
        "down": torch.stack([make("down", h, f, out_scale, base=b) for b in bases]),
    }


def _norm_weight(hidden: int, seed: int, layer: int, name: str, device) -> torch.Tensor:
    return 1.0 + seeded_randn((hidden,), stable_seed(seed, layer, name, 0), device, 0.1)


def _layer(shape: ModelShape, tp: int, layer: int, shards, seed: int, num_layers: int, device) -> LayerWeights:
    """One layer's weights: the given shards joined along their sharded dimension."""
    parts = [_shard(shape, tp, layer, s, seed, num_layers, device) for s in shards]

    def cat(name: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([p[name] for p in parts], dim=dim)

    e = 1 if shape.moe else 0  # MoE: [experts, ...], every dimension one further
    return LayerWeights(
        attn_norm=_norm_weight(shape.hidden, seed, layer, "attn_norm", device),
        wqkv=torch.cat([cat("wq"), cat("wk"), cat("wv")]),
        bqkv=torch.cat([cat("bq"), cat("bk"), cat("bv")]) if shape.qkv_bias else None,
        q_norm=_norm_weight(shape.head_dim, seed, layer, "q_norm", device) if shape.qk_norm else None,
        k_norm=_norm_weight(shape.head_dim, seed, layer, "k_norm", device) if shape.qk_norm else None,
        wo=cat("wo", dim=1),
        mlp_norm=_norm_weight(shape.hidden, seed, layer, "mlp_norm", device),
        w_gate_up=torch.cat([cat("gate", e), cat("up", e)], dim=e),
        w_down=cat("down", dim=1 + e),
        router=_router(shape, seed, layer, device) if shape.moe else None,
    )


def _router(shape: ModelShape, seed: int, layer: int, device) -> torch.Tensor:
    """The MoE router [experts, hidden]: one seed for all ranks (it is replicated, not sharded).
    N(0, 1/hidden) like the other weights: logits of about unit spread, a soft top-k."""
    return seeded_randn((shape.experts, shape.hidden), stable_seed(seed, layer, "router", 0), device, shape.hidden**-0.5)


def build_stack(
    shape: ModelShape,
    num_layers: int,
    tp: int,
    rank: int | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int = 0,
) -> Stack:
    """Rank `rank`'s shard of the stack; `rank=None` builds the unsharded stack from all shards.

    The full stack is the concatenation of the tp shards, so the single-process reference and
    the sharded ranks compute the same function from the same seed.
    """
    shape.check_tp(tp)
    shards = range(tp) if rank is None else [rank]
    layers = [_layer(shape, tp, i, shards, seed, num_layers, device) for i in range(num_layers)]
    final = _norm_weight(shape.hidden, seed, num_layers, "final_norm", device)
    stack = Stack(shape, 1 if rank is None else tp, layers, final)
    for w in stack.layers:
        for name, t in vars(w).items():
            if t is not None:  # absent attention details (no QKV bias, no q/k norms)
                setattr(w, name, t.to(dtype).contiguous())
    stack.final_norm = final.to(dtype)
    return stack


def cast(stack: Stack, dtype: torch.dtype) -> Stack:
    """A copy of the stack with every weight in `dtype`: the fp32 truth of a bf16 stack computes
    with the very weights the bf16 one rounded to."""

    def convert(value):
        return value.to(dtype) if isinstance(value, torch.Tensor) else value

    layers = [replace(w, **{name: convert(v) for name, v in vars(w).items()}) for w in stack.layers]
    return Stack(stack.shape, stack.tp, layers, convert(stack.final_norm))


def random_input(tokens: int, hidden: int, seed: int, dtype, device) -> torch.Tensor:
    """The stack's input hidden states: the same on every rank for the same seed and tokens."""
    return seeded_randn((tokens, hidden), stable_seed(seed, tokens, "input", 0), device, 1.0).to(dtype)

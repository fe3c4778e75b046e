"""Model shape presets: the real dimensions of the models whose TP layers we measure."""

from __future__ import annotations

from dataclasses import MISSING, asdict, dataclass, fields, replace

from overlapbench.errors import UserError, did_you_mean, shown


@dataclass(frozen=True)
class ModelShape:
    """One decoder layer's dimensions (Llama-style, grouped-query attention).

    The attention details of the deployed models ride along: `qkv_bias` (Qwen2, and configs that
    set `attention_bias`) and `qk_norm` (Qwen3's per-head RMSNorm of q and k before RoPE). A shape
    with `experts` > 0 is a mixture-of-experts layer: each token goes to its `top_k` experts, each
    an FFN of width `expert_ffn` (sharded over the TP ranks like the dense FFN); `ffn` is then the
    config's dense width, which the layer does not use.
    """

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float = 1e-5
    rope_theta: float = 500000.0
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0  # 0: a dense MLP
    top_k: int = 0
    expert_ffn: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "heads", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"shape.{name}: must be a positive integer, got {shown(value)}")
        for name in ("qkv_bias", "qk_norm"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"shape.{name}: must be true or false, got {shown(getattr(self, name))}")
        for name in ("experts", "top_k", "expert_ffn"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise UserError(f"shape.{name}: must be an integer >= 0, got {shown(value)}")
        if self.experts and not (1 <= self.top_k <= self.experts and self.expert_ffn):
            raise UserError(
                f"shape.top_k: a MoE shape (experts={self.experts}) needs 1 <= top_k <= experts "
                f"and expert_ffn > 0, got top_k={self.top_k}, expert_ffn={self.expert_ffn}"
            )
        if not self.experts and (self.top_k or self.expert_ffn):
            raise UserError("shape.experts: top_k and expert_ffn are for MoE shapes; set experts > 0 or drop them")
        if self.heads % self.kv_heads:
            raise UserError(
                f"shape.kv_heads: {self.kv_heads} must divide shape.heads={self.heads}"
            )
        if self.head_dim % 2:
            raise UserError(f"shape.head_dim: must be even for RoPE, got {self.head_dim}")
        if not self.eps > 0:
            raise UserError(f"shape.eps: must be positive, got {shown(self.eps)}")

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def mlp_width(self) -> int:
        """The width the layer's MLP shards over the TP ranks: each expert's, or the dense one."""
        return self.expert_ffn if self.moe else self.ffn

    def check_tp(self, tp: int) -> None:
        """Megatron sharding needs tp to divide heads, kv_heads and the MLP's width."""
        mlp = "expert_ffn" if self.moe else "ffn"
        for name in ("heads", "kv_heads", mlp):
            value = getattr(self, name)
            if value % tp:
                raise UserError(
                    f"tp: {tp} does not divide shape.{name}={value}; choose a tp that divides "
                    f"heads ({self.heads}), kv_heads ({self.kv_heads}) and {mlp} ({getattr(self, mlp)})"
                )

    def as_dict(self) -> dict:
        return asdict(self)

    def shard(self, tp: int) -> ModelShape:
        """One rank's shape of a TP=tp layer: heads, kv_heads and the MLP's width divided by tp,
        hidden unchanged. A tp=1 layer of this shape computes exactly what one rank computes, so
        one GPU measures a rank's compute (the `sweeps/shard-*.yaml` studies, tests/benchmarks/layer_vs_transformers.py)."""
        self.check_tp(tp)
        width = {"expert_ffn": self.expert_ffn // tp} if self.moe else {"ffn": self.ffn // tp}
        return replace(self, heads=self.heads // tp, kv_heads=self.kv_heads // tp, **width)


def completed(shape: dict) -> dict:
    """A shape's fields as rows store them, in ModelShape's order, the fields it lacks at their
    defaults: rows written before a field existed lack it (results.upgraded). Unknown keys stay."""
    out = {f.name: shape.get(f.name, f.default) for f in fields(ModelShape) if f.name in shape or f.default is not MISSING}
    return out | shape

PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, eps=1e-5),
    "tiny-moe": ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, experts=4, top_k=2, expert_ffn=64),
    "llama3-8b": ModelShape(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128),
    "llama3-70b": ModelShape(hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128),
    # Qwen2 has biases on q, k and v (not on o); Qwen3 drops them and RMS-normalizes q and k
    # per head. Qwen3's heads are not hidden / heads wide: 64 x 128 = 8192 from hidden 5120.
    "qwen2.5-72b": ModelShape(
        hidden=8192, ffn=29568, heads=64, kv_heads=8, head_dim=128, eps=1e-6, rope_theta=1e6, qkv_bias=True
    ),
    "qwen3-32b": ModelShape(
        hidden=5120, ffn=25600, heads=64, kv_heads=8, head_dim=128, eps=1e-6, rope_theta=1e6, qk_norm=True
    ),
    # Mixture-of-experts (config.json: num_local_experts / num_experts, num_experts_per_tok,
    # and for Qwen3-MoE moe_intermediate_size; both renormalize the top-k routing weights).
    "mixtral-8x7b": ModelShape(
        hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128, eps=1e-5, rope_theta=1e6,
        experts=8, top_k=2, expert_ffn=14336,
    ),
    "qwen3-30b-a3b": ModelShape(
        hidden=2048, ffn=6144, heads=32, kv_heads=4, head_dim=128, eps=1e-6, rope_theta=1e6,
        qk_norm=True, experts=128, top_k=8, expert_ffn=768,
    ),
}


def preset(name: str) -> ModelShape:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(
            f"model: unknown preset '{name}'{did_you_mean(name, PRESETS)}; "
            f"choose one of {', '.join(PRESETS)} or give a custom 'shape'"
        ) from None

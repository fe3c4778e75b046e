"""Model shape presets: the real dimensions of the models whose TP layers we measure."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from overlapbench.errors import UserError, did_you_mean


@dataclass(frozen=True)
class ModelShape:
    """One decoder layer's dimensions (Llama-style, grouped-query attention)."""

    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float = 1e-5
    rope_theta: float = 500000.0

    def __post_init__(self) -> None:
        for name in ("hidden", "ffn", "heads", "kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise UserError(f"shape.{name}: must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise UserError(
                f"shape.kv_heads: {self.kv_heads} must divide shape.heads={self.heads}"
            )
        if self.head_dim % 2:
            raise UserError(f"shape.head_dim: must be even for RoPE, got {self.head_dim}")
        if not self.eps > 0:
            raise UserError(f"shape.eps: must be positive, got {self.eps!r}")

    def check_tp(self, tp: int) -> None:
        """Megatron sharding needs tp to divide heads, kv_heads and ffn."""
        for name in ("heads", "kv_heads", "ffn"):
            value = getattr(self, name)
            if value % tp:
                raise UserError(
                    f"tp: {tp} does not divide shape.{name}={value}; "
                    f"choose a tp that divides heads, kv_heads and ffn"
                )

    def as_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(hidden=64, ffn=128, heads=4, kv_heads=2, head_dim=16, eps=1e-5),
    "llama3-8b": ModelShape(hidden=4096, ffn=14336, heads=32, kv_heads=8, head_dim=128),
    "llama3-70b": ModelShape(hidden=8192, ffn=28672, heads=64, kv_heads=8, head_dim=128),
    "qwen2.5-72b": ModelShape(
        hidden=8192, ffn=29568, heads=64, kv_heads=8, head_dim=128, eps=1e-6, rope_theta=1e6
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

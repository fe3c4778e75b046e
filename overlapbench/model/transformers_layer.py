"""Hugging Face transformers' decoder layer holding overlapbench's weights: what a user would run
instead of our layer (tests/benchmarks/layer_vs_transformers.py times the two) and what our reference is checked
against (tests/test_transformers_reference.py).

transformers is an optional extra (`pip install 'overlapbench[hf]'`); `require()` names it in
one line where it is missing. The kind follows the shape's attention details: a QKV bias is
Qwen2's layer, q/k norms Qwen3's, neither Llama's. Dense shapes only (MoE layers are not built).
"""

from __future__ import annotations

import torch

from overlapbench.errors import UserError
from overlapbench.model.models import ModelShape

CLASSES = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}


def require():
    """The transformers module, or a UserError naming the extra that installs it."""
    try:
        import transformers
    except ImportError:
        raise UserError("transformers is not installed: pip install 'overlapbench[hf]' (the hf extra)") from None
    return transformers


def kind_of(shape: ModelShape) -> str:
    if shape.moe:
        raise UserError("transformers' decoder layer: dense shapes only (experts > 0 is not built)")
    if shape.qkv_bias and shape.qk_norm:
        raise UserError("transformers' decoder layer: no model family has both a QKV bias and q/k norms")
    return "qwen2" if shape.qkv_bias else "qwen3" if shape.qk_norm else "llama"


def config(shape: ModelShape, attention: str = "sdpa", layers: int = 1):
    """The family's config of `shape` (`layers` layers), with `attention` as its attention implementation."""
    transformers = require()
    kind = kind_of(shape)
    made = getattr(transformers, f"{CLASSES[kind]}Config")(
        hidden_size=shape.hidden, intermediate_size=shape.ffn, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rms_norm_eps=shape.eps,
        rope_theta=shape.rope_theta, attention_bias=False, hidden_act="silu", num_hidden_layers=layers,
    )
    made._attn_implementation = attention
    return made


def _modeling(kind: str):
    return getattr(getattr(require().models, kind), f"modeling_{kind}")


def decoder_layer(shape: ModelShape, weights, index: int = 0, attention: str = "sdpa") -> torch.nn.Module:
    """transformers' decoder layer `index` of `shape` holding `weights` (a weights.LayerWeights of
    the unsharded stack, tp=1), in their dtype and on their device, in eval mode."""
    kind = kind_of(shape)
    made = config(shape, attention, layers=index + 1)
    layer = getattr(_modeling(kind), f"{CLASSES[kind]}DecoderLayer")(made, layer_idx=index)
    layer = layer.to(device=weights.wqkv.device, dtype=weights.wqkv.dtype).eval()
    q, kv, f = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.ffn
    attn = layer.self_attn
    with torch.no_grad():
        for proj, lo, n in ((attn.q_proj, 0, q), (attn.k_proj, q, kv), (attn.v_proj, q + kv, kv)):
            proj.weight.copy_(weights.wqkv[lo : lo + n])
            if shape.qkv_bias:
                proj.bias.copy_(weights.bqkv[lo : lo + n])
            elif proj.bias is not None:
                raise AssertionError(f"{kind}: a bias where the shape has none")
        attn.o_proj.weight.copy_(weights.wo)
        if shape.qk_norm:
            attn.q_norm.weight.copy_(weights.q_norm)
            attn.k_norm.weight.copy_(weights.k_norm)
        layer.mlp.gate_proj.weight.copy_(weights.w_gate_up[:f])
        layer.mlp.up_proj.weight.copy_(weights.w_gate_up[f:])
        layer.mlp.down_proj.weight.copy_(weights.w_down)
        layer.input_layernorm.weight.copy_(weights.attn_norm)
        layer.post_attention_layernorm.weight.copy_(weights.mlp_norm)
    return layer


def rotary_embedding(shape: ModelShape, device) -> torch.nn.Module:
    """The family's rotary embedding module (cos/sin of the positions it is called with)."""
    kind = kind_of(shape)
    return getattr(_modeling(kind), f"{CLASSES[kind]}RotaryEmbedding")(config(shape)).to(device)


class DecoderStack(torch.nn.Module):
    """transformers' layers one after another, as its model runs them: the rotary embedding once
    per forward, then each layer on [1, tokens, hidden]. SDPA attention without a mask, which
    transformers runs causal (is_causal)."""

    def __init__(self, shape: ModelShape, layers: list) -> None:
        super().__init__()
        device = layers[0].wqkv.device
        self.layers = torch.nn.ModuleList(decoder_layer(shape, w, i, "sdpa") for i, w in enumerate(layers))
        self.rotary = rotary_embedding(shape, device)

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = x[None]
        embeddings = self.rotary(hidden, positions[None])
        for layer in self.layers:
            out = layer(hidden, attention_mask=None, position_ids=positions[None], position_embeddings=embeddings)
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden[0]

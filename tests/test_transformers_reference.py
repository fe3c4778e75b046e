"""The reference layer equals Hugging Face transformers' decoder layer given the same weights:
Qwen2's (QKV bias), Qwen3's (per-head q/k RMSNorm) and Llama's. Skipped where transformers is
not installed (it is not a dependency: `pip install transformers` to run these)."""

from __future__ import annotations

import pytest
import torch

from overlapbench.layer import build_stack, random_input, reference_forward, rms_norm
from overlapbench.models import ModelShape

transformers = pytest.importorskip("transformers")

SEQ = 23
SHAPES = {
    "qwen2": ModelShape(hidden=64, ffn=96, heads=8, kv_heads=2, head_dim=8, eps=1e-6, rope_theta=1e6, qkv_bias=True),
    "qwen3": ModelShape(hidden=48, ffn=96, heads=8, kv_heads=2, head_dim=16, eps=1e-6, rope_theta=1e6, qk_norm=True),
    "llama": ModelShape(hidden=64, ffn=96, heads=8, kv_heads=4, head_dim=8, eps=1e-5, rope_theta=5e5),
}


def _hf_layer(kind: str, shape: ModelShape):
    """transformers' decoder layer of `shape` (eager attention) and its rotary embedding."""
    names = {"qwen2": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[kind]
    module = getattr(transformers.models, kind)
    config = getattr(transformers, f"{names}Config")(
        hidden_size=shape.hidden, intermediate_size=shape.ffn, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim, rms_norm_eps=shape.eps,
        rope_theta=shape.rope_theta, attention_bias=False, hidden_act="silu",
    )
    config._attn_implementation = "eager"
    modeling = getattr(module, f"modeling_{kind}")
    layer = getattr(modeling, f"{names}DecoderLayer")(config, layer_idx=0).float().eval()
    rotary = getattr(modeling, f"{names}RotaryEmbedding")(config)
    return layer, rotary


@pytest.mark.parametrize("kind", SHAPES)
def test_reference_equals_the_transformers_layer(kind):
    shape = SHAPES[kind]
    stack = build_stack(shape, 1, 1, None, torch.float32, torch.device("cpu"), seed=3)
    w = stack.layers[0]
    layer, rotary = _hf_layer(kind, shape)
    q, kv, f = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.ffn
    attn = layer.self_attn
    with torch.no_grad():
        for proj, lo, n in ((attn.q_proj, 0, q), (attn.k_proj, q, kv), (attn.v_proj, q + kv, kv)):
            proj.weight.copy_(w.wqkv[lo : lo + n])
            if shape.qkv_bias:
                proj.bias.copy_(w.bqkv[lo : lo + n])
            else:
                assert proj.bias is None
        attn.o_proj.weight.copy_(w.wo)
        if shape.qk_norm:
            attn.q_norm.weight.copy_(w.q_norm)
            attn.k_norm.weight.copy_(w.k_norm)
        layer.mlp.gate_proj.weight.copy_(w.w_gate_up[:f])
        layer.mlp.up_proj.weight.copy_(w.w_gate_up[f:])
        layer.mlp.down_proj.weight.copy_(w.w_down)
        layer.input_layernorm.weight.copy_(w.attn_norm)
        layer.post_attention_layernorm.weight.copy_(w.mlp_norm)

        x = random_input(SEQ, shape.hidden, 3, torch.float32, torch.device("cpu"))
        positions = torch.arange(SEQ)[None]
        mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)[None, None]  # causal, additive
        out = layer(x[None], attention_mask=mask, position_ids=positions,
                    position_embeddings=rotary(x[None], positions))
        out = out[0] if isinstance(out, tuple) else out
        theirs = rms_norm(out[0], stack.final_norm, shape.eps)
    ours = reference_forward(shape, 1, 1, (SEQ,), seed=3)
    err = (torch.linalg.vector_norm(ours - theirs) / torch.linalg.vector_norm(theirs)).item()
    assert err < 1e-5, f"{kind}: rel err {err:.2e} against transformers"

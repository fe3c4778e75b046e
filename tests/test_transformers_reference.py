"""The reference layer equals Hugging Face transformers' decoder layer given the same weights:
Qwen2's (QKV bias), Qwen3's (per-head q/k RMSNorm) and Llama's; and transformers' stack as
tests/benchmarks/layer_vs_transformers.py runs it (SDPA, no mask: causal) computes our reference stack. Skipped
where transformers is not installed (the optional extra: `pip install 'overlapbench[hf]'`)."""

from __future__ import annotations

import pytest
import torch

from overlapbench.errors import UserError
from overlapbench.model import transformers_layer
from overlapbench.model.layer import reference_forward
from overlapbench.model.models import PRESETS, ModelShape
from overlapbench.model.norms import rms_norm
from overlapbench.model.weights import build_stack, random_input

transformers = pytest.importorskip("transformers")

SEQ = 23
SHAPES = {
    "qwen2": ModelShape(hidden=64, ffn=96, heads=8, kv_heads=2, head_dim=8, eps=1e-6, rope_theta=1e6, qkv_bias=True),
    "qwen3": ModelShape(hidden=48, ffn=96, heads=8, kv_heads=2, head_dim=16, eps=1e-6, rope_theta=1e6, qk_norm=True),
    "llama": ModelShape(hidden=64, ffn=96, heads=8, kv_heads=4, head_dim=8, eps=1e-5, rope_theta=5e5),
}
CPU = torch.device("cpu")


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return (torch.linalg.vector_norm(ours - theirs) / torch.linalg.vector_norm(theirs)).item()


@pytest.mark.parametrize("kind", SHAPES)
def test_reference_equals_the_transformers_layer(kind):
    shape = SHAPES[kind]
    assert transformers_layer.kind_of(shape) == kind
    stack = build_stack(shape, 1, 1, None, torch.float32, CPU, seed=3)
    layer = transformers_layer.decoder_layer(shape, stack.layers[0], attention="eager")
    rotary = transformers_layer.rotary_embedding(shape, CPU)
    with torch.no_grad():
        x = random_input(SEQ, shape.hidden, 3, torch.float32, CPU)
        positions = torch.arange(SEQ)[None]
        mask = torch.full((SEQ, SEQ), float("-inf")).triu(1)[None, None]  # causal, additive
        out = layer(x[None], attention_mask=mask, position_ids=positions,
                    position_embeddings=rotary(x[None], positions))
        out = out[0] if isinstance(out, tuple) else out
        theirs = rms_norm(out[0], stack.final_norm, shape.eps)
    ours = reference_forward(shape, 1, 1, (SEQ,), seed=3)
    assert rel_err(ours, theirs) < 1e-5, f"{kind}: against transformers"


@pytest.mark.parametrize("kind", SHAPES)
def test_the_benchmarked_stack_is_our_reference_stack(kind):
    """Two layers through DecoderStack (what bench_layer times) against reference_forward."""
    shape = SHAPES[kind]
    stack = build_stack(shape, 2, 1, None, torch.float32, CPU, seed=5)
    theirs_stack = transformers_layer.DecoderStack(shape, stack.layers)
    with torch.no_grad():
        x = random_input(SEQ, shape.hidden, 5, torch.float32, CPU)
        theirs = rms_norm(theirs_stack(x, torch.arange(SEQ)), stack.final_norm, shape.eps)
    assert rel_err(reference_forward(shape, 2, 1, (SEQ,), seed=5), theirs) < 1e-5


def test_moe_shapes_are_refused_in_one_line():
    with pytest.raises(UserError, match="dense shapes only"):
        transformers_layer.kind_of(PRESETS["tiny-moe"])

"""The TP decoder layer and its parts: shapes, weights, token layout, attention, norms, RoPE, MLP/MoE, FLOPs."""

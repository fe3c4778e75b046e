"""The Triton kernels overlapbench runs; they import nothing of the package (what a kernel needs,
such as its symmetric memory, the caller hands in).

`rmsnorm`: RMSNorm, plain and with the residual add. `rope`: rotary embedding of q and k (with
the q/k norms). `swiglu`: SwiGLU of the gate|up GEMM's output. `lse_merge`: two attention
partials merged by their log-sum-exps (a chunk's attention over its prefix).
`allreduce_norm`: all-reduce + residual add + RMSNorm over symmetric memory on few CTAs (v1, the
residual replicated); `allreduce_norm_v2`: its token-sharded successor (push); `allreduce_norm_pull`:
v2's pull variants, the pull one the layer's kernel, and `FUSED_KERNELS`, the variants by name.
`copy_engine_norm`: reduce-scatter and all-gather by the copy engines around a few-CTA add + norm.
`copy_engine_pull`: the copy engines pull every peer's partial (a split's side stream), then one
full-width add + norm (its main stream).
`p2p`: the peer-to-peer copy kernel of flash_agrs's all-gather and reduce-scatter steps.

Nothing is imported here, so that importing the package costs no Triton or CUDA start-up.
"""

"""Triton kernels of overlapbench.

`kernels.rmsnorm`: fused residual add + RMSNorm and its torch reference.
`kernels.allreduce_norm`: all-reduce + residual add + RMSNorm over symmetric memory, few CTAs.

Nothing is imported here, so that importing the package costs no Triton or CUDA start-up.
"""

"""`overlapbench comm`: the communication under every overlap result, measured in nccl-tests' terms.

Before anyone believes an overlap number they check the collectives underneath it, and they
read them the way nccl-tests prints them: sizes from -b to -e by factor -f; per size the time,
the algorithm bandwidth (bytes / time) and the bus bandwidth (algbw x 2(n-1)/n for all-reduce,
x (n-1)/n for all-gather and reduce-scatter: what each rank's link carries), and #wrong, the
elements that differ from the exact expected result.

Every communication path the strategies use is measured: NCCL under each CTA budget
(`max_ctas`), on plain buffers and on registered symmetric windows (`nccl_symm`: NCCL's
symmetric kernels on exactly that many CTAs; rows record the kernel and channels NCCL's tuning
log shows), torch's symmetric-memory one-shot and two-shot all-reduce, our fused all-reduce +
residual + RMSNorm kernel under each CTA budget, and an all-gather done by the copy engines
(peer copies between symmetric buffers, no SMs). On CPU NCCL is replaced by gloo and the
symmetric-memory paths are skipped, with the reason. NVLink multicast is never used.

Inputs are small non-zero integers that differ per rank, per chunk and per case, so every sum is
exact in bf16 and a right collective has exactly zero wrong elements. A case with wrong elements
is a failed row, never a timing. Rows go to the same JSONL store as `sweep` (workload `comm`).

One module per concern: `sizes` (the -b/-e/-f ladder and the bandwidth formulas), `patterns`
(verifiable inputs), `cases` (what one row measures), `paths` (one record per path: its ops, CTA
settings, unit and skip rules, beside the builder that makes a case runnable on it), `spec` (what
a run measures: the options or a study's `comm:` section, checked), `buffers` (the run's symmetric
allocations), `run` (check, time, agree, rows), `output` (nccl-tests' columns as a table, CSV or
JSON) and `command` (options, launch, the per-rank main).

No torch at module top: `--help` and spec validation stay fast.
"""

from __future__ import annotations

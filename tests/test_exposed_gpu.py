"""On 2 GPUs: what torch.profiler gives the timeline (timing/timeline.py) is what the analysis
(report/exposed.py) assumes: device kernels with their streams, a GEMM linked to its aten op and
FLOPs, NCCL's kernel with its buffer's bytes (from the `nccl:all_reduce` range its launcher opens;
a blocking collective runs on the caller's stream on torch 2.11), no profiler range counted as a
kernel; and a blocking all-reduce after a GEMM is one exposed interval behind that GEMM."""

from __future__ import annotations

from tests import distributed

pytestmark = distributed.two_gpus()
M, N, K = 2048, 4096, 4096


def _profiled_forward(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from overlapbench.timing import timeline

    g = torch.Generator(device="cuda").manual_seed(rank + 1)
    a = torch.randn(M, K, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(K, N, generator=g, device="cuda", dtype=torch.bfloat16)

    def forward():
        out = torch.mm(a, w)
        dist.all_reduce(out)
        return torch.relu(out)

    for _ in range(2):  # NCCL's communicator and cuBLAS's handles set up before the profile
        forward()
    torch.cuda.synchronize()
    return timeline.record(forward, cuda=True)  # on every rank: the forward holds a collective


def test_a_blocking_all_reduce_after_a_gemm_is_exposed_behind_it(tmp_path):
    from overlapbench.report import exposed
    from overlapbench.timing import timeline

    data = distributed.run(_profiled_forward, backend="nccl")[0]
    path = tmp_path / f"p{timeline.SUFFIX}"
    timeline.write(data, path)
    kernels = exposed.read(path).kernels
    assert not any(k.name.startswith("nccl:") for k in kernels), [k.name for k in kernels]  # ranges are not kernels
    gemms = [k for k in kernels if k.kind == "gemm"]
    transfers = [k for k in kernels if k.is_transfer]
    assert gemms and transfers, [(k.name, k.kind) for k in kernels]
    assert any(k.flops == 2 * M * N * K for k in gemms), [(k.name, k.op, k.flops) for k in gemms]
    assert transfers[0].bytes == M * N * 2, transfers[0]
    e = exposed.analyze(kernels)
    assert e.exposed > 0 and e.intervals
    first = min(e.intervals, key=lambda i: i.start)
    assert first.transfer.is_transfer and first.after.kind == "gemm" and first.relation == "behind"

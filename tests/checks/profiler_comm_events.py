"""On 2 GPUs: what torch.profiler records around one NCCL all-reduce after a GEMM, every host event
with each field a _KinetoEvent offers (shapes, structured shapes, dtypes, concrete inputs, extra
meta) and every device event with its launching correlation id. timing/timeline.py links a kernel
to the op that launched it and takes a transfer's bytes from that op's tensors; this prints what it
has to work with on this torch and NCCL, as JSON lines (rank 0).

    torchrun --nproc-per-node 2 tests/checks/profiler_comm_events.py > events.jsonl
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

FIELDS = ("name", "correlation_id", "linked_correlation_id", "start_thread_id", "start_ns", "end_ns",
          "is_async", "shapes", "structured_input_shapes", "dtypes", "concrete_inputs", "extra_meta",
          "metadata_json", "nbytes", "device_resource_id", "activity_type", "is_user_annotation")


def _field(event, name: str):
    method = getattr(event, name, None)
    if not callable(method):
        return "<absent>"
    try:
        value = method()
    except Exception as error:  # a field this event cannot give: say so, keep going
        return f"<{type(error).__name__}>"
    return value if isinstance(value, (int, float, str, bool, list, dict, type(None))) else repr(value)


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    g = torch.Generator(device="cuda").manual_seed(rank + 1)
    a = torch.randn(2048, 4096, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, generator=g, device="cuda", dtype=torch.bfloat16)

    def forward():
        out = torch.mm(a, w)
        dist.all_reduce(out)
        return out

    for _ in range(2):
        forward()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        forward()
        torch.cuda.synchronize()
    if rank == 0:
        print(json.dumps({"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version()))}))
        for event in prof.profiler.kineto_results.events():
            record = {name: _field(event, name) for name in FIELDS}
            record["device_type"] = str(event.device_type())
            print(json.dumps(record, default=repr))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

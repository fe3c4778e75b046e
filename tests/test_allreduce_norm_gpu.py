"""The all-reduce + residual + RMSNorm engines on 2 and 4 GPUs, against NCCL + the torch reference:
the fused kernel v2 (kernels.allreduce_norm_v2, push; `fused_pull` and `fused_pull_push`: its
pull variants, kernels.allreduce_norm_pull) and the copy-engine path (kernels.copy_engine_norm), whose
residual is token-sharded (checked on the rows each rank owns; the other rows must stay as
they were; `copy_engine` cuts its rows into chunks by size, copy_engine_c1 is its serial
schedule with the kernel writing `out` (sm_out), _c3 and _c8 force 3 and 8 chunks), and v1
(kernels.allreduce_norm, every row of the residual replicated). v2's graph scenarios (push and
pull) take the output region's view (out=None); its other scenarios pass `out`.

At 4 ranks every engine runs its split-layer scenarios and its sweep at bf16 hidden 8192 (whose
token counts 1 and 3 leave ranks without rows): the other shapes' sweeps, most of the module's
time, vary the row width, which the number of ranks does not change.

One set of processes per world size (one per GPU, NCCL on a free localhost port) runs every
scenario in lockstep and reports failures per scenario, so a broken case fails its own test and
a hung kernel fails all of them after a timeout instead of hanging the session.
ALLREDUCE_NORM_ENGINES (a comma list, e.g. fused,fused_pull) runs only those engines' scenarios.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from overlapbench.distributed.runtime import SAFE_ENV, symmetric_buffer  # noqa: E402
from tests import distributed  # noqa: E402

pytestmark = distributed.two_gpus()

EPS = 1e-5
TOKENS = [1, 3, 1000, 4097, 32768]
CTAS = [1, 2, 3, 8, 16, 32, 64]
CASES = [("bfloat16", 4096), ("bfloat16", 5120), ("bfloat16", 8192), ("float32", 8192)]
ENGINES = ("fused", "fused_pull", "fused_pull_push", "fused_v1", "copy_engine")
CHUNKED = ("copy_engine_c1", "copy_engine_c3", "copy_engine_c8")  # the copy-engine path's chunk counts
SCENARIOS = [f"{e}-{s}" for e in ENGINES
             for s in [f"sweep-{d}-{h}" for d, h in CASES] + ["two_ranges_with_writer", "graph_replays"]]
SCENARIOS += [f"{e}-{s}" for e in CHUNKED for s in ("sweep-bfloat16-8192", "two_ranges_with_writer", "graph_replays")]
if os.environ.get("ALLREDUCE_NORM_ENGINES"):
    SCENARIOS = [s for s in SCENARIOS if s.split("-", 1)[0] in os.environ["ALLREDUCE_NORM_ENGINES"].split(",")]
SWEEP_AT_4 = "sweep-bfloat16-8192"
TIMEOUT_S = 540


def scenarios(world: int) -> list[str]:
    """The scenarios run at `world` ranks: every one at 2; at 4 the sweep at bf16 hidden 8192 and
    the split-layer scenarios of every engine."""
    if world == 2:
        return SCENARIOS
    return [s for s in SCENARIOS if "-sweep-" not in s or s.endswith(SWEEP_AT_4)]


def _tolerance(dtype) -> float:
    """bf16: grows with the ranks summed (distributed.bf16_tolerance); fp32: 1e-5 at any size."""
    import torch.distributed as dist

    return distributed.bf16_tolerance(dist.get_world_size()) if dtype == torch.bfloat16 else 1e-5


def _engine(kind: str, max_tokens: int, hidden: int, dtype, rank: int):
    import torch.distributed as dist

    args = (dist.group.WORLD, max_tokens, hidden, dtype, torch.device("cuda", rank))
    if kind.startswith("copy_engine"):
        from kernels.copy_engine_norm import CopyEngineNorm

        chunks = int(kind.rsplit("_c", 1)[1]) if "_c" in kind else None
        return CopyEngineNorm.allocate(*args, chunks=chunks, sm_out=chunks == 1, allocate=symmetric_buffer)
    from kernels.allreduce_norm_pull import FUSED_KERNELS

    fused = {"fused": "v2", "fused_pull": "v2pull", "fused_pull_push": "v2pullpush", "fused_v1": "v1"}
    return FUSED_KERNELS[fused[kind]](*args, allocate=symmetric_buffer)


def _kept(ar, a: int, b: int) -> slice:
    """The residual rows this rank keeps: all, or its own with a sharded residual."""
    return slice(*ar.own_rows(a, b)) if hasattr(ar, "own_rows") else slice(None)


class Checker:
    """Collects failures instead of raising: both ranks must keep issuing the same collectives."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def close(self, name: str, got, ref, tol: float, where: str) -> None:
        err = ((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()
        if not err < tol:  # NaN fails too
            self.errors.append(f"{name} rel err {err:.3g} >= {tol} ({where})")

    def same_on_all_ranks(self, name: str, t, where: str) -> None:
        import torch.distributed as dist

        theirs = t.clone()
        dist.broadcast(theirs, src=0)
        if not torch.equal(theirs, t):
            self.errors.append(f"{name} differs from rank 0 ({where})")


def _inputs(seed: int, rows: int, hidden: int, dtype, rank: int):
    """Fresh random partial (this rank's), residual and weight (the same on every rank)."""
    dev = torch.device("cuda", rank)
    shared = torch.Generator(device=dev).manual_seed(seed)
    mine = torch.Generator(device=dev).manual_seed(seed * 100 + 1 + rank)
    partial = torch.randn(rows, hidden, generator=mine, device=dev).to(dtype)
    residual = torch.randn(rows, hidden, generator=shared, device=dev).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared, device=dev)).to(dtype)
    return partial, residual, weight


def _reference(partial, residual, weight):
    """NCCL all-reduce in fp32, then the torch reference in fp32."""
    import torch.distributed as dist

    from kernels.rmsnorm import add_rmsnorm_reference

    total = partial.to(torch.float32, copy=True)  # never an alias of an fp32 input
    dist.all_reduce(total)
    res = residual.to(torch.float32, copy=True)
    out = add_rmsnorm_reference(total, res, weight.float(), EPS)
    return res, out


def _check_call(chk: Checker, ar, a: int, b: int, seed: int, ctas: int, dtype, hidden: int, rank: int) -> None:
    partial, residual, weight = _inputs(seed, b - a, hidden, dtype, rank)
    ref_res, ref_out = _reference(partial, residual, weight)
    before = residual.clone()
    ar.partial(a, b).copy_(partial)
    out = torch.full_like(residual, float("nan"))
    ar(a, b, residual, weight, EPS, out, ctas)
    torch.cuda.synchronize()
    where = f"{dtype} hidden {hidden}, rows [{a}, {b}), {ctas} CTAs"
    _check_result(chk, ar, a, b, (residual, out), (ref_res, ref_out), before, _tolerance(dtype), where)


def _check_result(chk: Checker, ar, a: int, b: int, got, ref, before, tol: float, where: str) -> None:
    """out everywhere; the residual on the rows this rank keeps (the others unchanged)."""
    (residual, out), (ref_res, ref_out), kept = got, ref, _kept(ar, a, b)
    if residual[kept].numel():
        chk.close("residual", residual[kept], ref_res[kept], tol, where)
    chk.close("out", out, ref_out, tol, where)
    if kept == slice(None):
        chk.same_on_all_ranks("residual", residual, where)
    else:
        untouched = torch.ones(b - a, dtype=torch.bool, device=residual.device)
        untouched[kept] = False
        if not torch.equal(residual[untouched], before[untouched]):
            chk.errors.append(f"residual rows of other ranks were written ({where})")
    chk.same_on_all_ranks("out", out, where)


def _sweep(chk: Checker, kind: str, rank: int, dtype_name: str, hidden: int) -> None:
    """Every token count x CTA budget, at a row offset (row_start > 0)."""
    from kernels.allreduce_norm import MAX_CTAS

    assert MAX_CTAS in CTAS
    dtype, offset = getattr(torch, dtype_name), 5
    ar = _engine(kind, max(TOKENS) + offset, hidden, dtype, rank)
    for i, tokens in enumerate(TOKENS):
        for j, ctas in enumerate(CTAS):
            _check_call(chk, ar, offset, offset + tokens, 1000 * i + j, ctas, dtype, hidden, rank)


def _two_ranges_with_writer(chk: Checker, kind: str, rank: int) -> None:
    """A token split as a layer runs it: halves A and B back to back on a comm stream, while a
    writer stream (the GEMMs) writes B's partial during A's kernel and the next round's A partial
    during B's kernel, as soon as A's kernel has returned. No host sync between rounds."""
    hidden, dtype, cut, n, rounds = 8192, torch.bfloat16, 2304, 4097, 4
    ar = _engine(kind, n, hidden, dtype, rank)
    ins = [(_inputs(10 * r + 1, cut, hidden, dtype, rank), _inputs(10 * r + 2, n - cut, hidden, dtype, rank))
           for r in range(rounds)]
    weight = ins[0][0][2]
    refs = [(_reference(pa, ra, weight), _reference(pb, rb, weight)) for (pa, ra, _), (pb, rb, _) in ins]
    outs = [(torch.empty_like(ra), torch.empty_like(rb)) for (_, ra, _), (_, rb, _) in ins]
    befores = [(ra.clone(), rb.clone()) for (_, ra, _), (_, rb, _) in ins]
    comm, writer = torch.cuda.Stream(), torch.cuda.Stream()
    ar.partial(0, cut).copy_(ins[0][0][0])
    comm.wait_stream(torch.cuda.current_stream())
    writer.wait_stream(torch.cuda.current_stream())
    for r, ((_, ra, _), (pb, rb, _)) in enumerate(ins):
        with torch.cuda.stream(comm):
            ar(0, cut, ra, weight, EPS, outs[r][0], 8)
            a_done = comm.record_event()
        with torch.cuda.stream(writer):
            torch.cuda._sleep(20_000)  # lands while A's kernel runs
            ar.partial(cut, n).copy_(pb)
            b_written = writer.record_event()
        with torch.cuda.stream(comm):
            comm.wait_event(b_written)
            ar(cut, n, rb, weight, EPS, outs[r][1], 3)
            b_done = comm.record_event()
        with torch.cuda.stream(writer):
            writer.wait_event(a_done)
            if r + 1 < rounds:
                ar.partial(0, cut).copy_(ins[r + 1][0][0])  # overlaps B's kernel
            writer.wait_event(b_done)  # B's rows are free again only after B's kernel
        comm.wait_stream(writer)
    torch.cuda.synchronize()
    for r in range(rounds):
        for half, (a, b), got, ref, before in zip("AB", ((0, cut), (cut, n)), ((ins[r][0][1], outs[r][0]),
                                                  (ins[r][1][1], outs[r][1])), refs[r], befores[r]):
            _check_result(chk, ar, a, b, got, ref, before, _tolerance(dtype), f"round {r}, half {half}")


def _graph_replays(chk: Checker, kind: str, rank: int) -> None:
    """Both halves captured in one CUDA graph; 20 replays on fresh inputs copied into the static
    partial and residual buffers."""
    hidden, dtype, cut, n = 8192, torch.bfloat16, 1000, 3001
    ar = _engine(kind, n, hidden, dtype, rank)
    _, _, weight = _inputs(7, 1, hidden, dtype, rank)
    res, out = torch.zeros(n, hidden, dtype=dtype, device=weight.device), torch.empty(n, hidden, dtype=dtype,
                                                                                        device=weight.device)
    views = getattr(ar, "returns_view", False)  # v2: the output region's rows, no copy
    got: dict = {}

    def step():
        got["A"] = ar(0, cut, res[:cut], weight, EPS, None if views else out[:cut], 8)
        got["B"] = ar(cut, n, res[cut:], weight, EPS, None if views else out[cut:], 16)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for rnd in range(20):
        partial, residual, _ = _inputs(100 + rnd, n, hidden, dtype, rank)
        ref_res, ref_out = _reference(partial, residual, weight)
        ar.partial(0, n).copy_(partial)
        res.copy_(residual)
        for half in "AB":
            got[half].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for half, (a, b) in zip("AB", ((0, cut), (cut, n))):
            _check_result(chk, ar, a, b, (res[a:b], got[half]), (ref_res[a:b], ref_out[a:b]), residual[a:b],
                          _tolerance(dtype), f"replay {rnd}, rows [{a}, {b})")


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.pop("TRITON_INTERPRET", None)  # the CPU tests may have set it in the parent
    os.environ.update(SAFE_ENV)
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    runs = {}
    for e in ENGINES + CHUNKED:
        runs |= {f"{e}-sweep-{d}-{h}": (lambda c, e=e, d=d, h=h: _sweep(c, e, rank, d, h)) for d, h in CASES}
        runs[f"{e}-two_ranges_with_writer"] = lambda c, e=e: _two_ranges_with_writer(c, e, rank)
        runs[f"{e}-graph_replays"] = lambda c, e=e: _graph_replays(c, e, rank)
    report = {}
    for name in scenarios(world):
        chk = Checker()
        try:
            runs[name](chk)
        except Exception:  # an exception is as symmetric as the code that raised it
            chk.errors.append(traceback.format_exc())
        report[name] = chk.errors
        torch.cuda.synchronize()
        dist.barrier()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def _launch(world: int, out_dir: Path) -> dict[str, list[str]]:
    """Every scenario of `world` on `world` GPUs: each scenario's failures, per rank."""
    import torch.multiprocessing as mp

    os.environ.update(SAFE_ENV)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.start_processes(_worker, args=(world, port, str(out_dir)), nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail(f"workers still running after {TIMEOUT_S} s: a barrier never met?")
    except (mp.ProcessExitedException, mp.ProcessRaisedException) as e:
        pytest.fail(f"a worker failed: {e}")
    merged: dict[str, list[str]] = {name: [] for name in scenarios(world)}
    for rank in range(world):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            pytest.fail(f"rank {rank} wrote no report")
        for name, errors in json.loads(path.read_text()).items():
            merged[name] += [f"rank {rank}: {e}" for e in errors]
    return merged


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> distributed.Launches:
    return distributed.Launches(lambda world: _launch(world, tmp_path_factory.mktemp(f"allreduce_norm_gpu_ws{world}")))


@pytest.mark.parametrize(("world", "scenario"), distributed.world_params(scenarios))
def test_allreduce_norm_on_gpus(report: distributed.Launches, world: int, scenario: str) -> None:
    errors = report(world)[scenario]
    assert not errors, f"{len(errors)} failures, first ones:\n" + "\n".join(errors[:10])

"""NCCL's symmetric windows on CPU: what this torch/NCCL must offer, the registration's order
(allocate in the pool, agree, then register), the runtime's groups and windows, and the comm
path nccl_symm, its collectives run on gloo over views of a stand-in window (a plain tensor:
no GPU here; tests/test_nccl_symm_gpu.py runs the real thing on 2 GPUs)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from overlapbench.comm import buffers, output, paths
from overlapbench.comm import run as comm_run
from overlapbench.comm.cases import Case
from overlapbench.comm.spec import CommSpec
from overlapbench.distributed import nccl_log, nccl_windows, runtime
from overlapbench.strategies.knobs import DEFAULT
from tests import distributed

K, M = 2**10, 2**20


# --- what the process must offer ---------------------------------------------------------------


def test_windows_need_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert nccl_windows.missing_support() == "needs CUDA GPUs"


class FakeNcclGroup:
    """ProcessGroupNCCL's class as a recent torch has it."""

    mem_allocator = property(lambda self: "allocator")

    def register_mem_pool(self, pool, symm=False):
        """register_mem_pool(self, pool: MemPool, symm: bool = False) -> None"""


@pytest.fixture
def gpu_torch(monkeypatch):
    """A torch with CUDA, ProcessGroupNCCL's window APIs and NCCL 2.28.9, NVLS off."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 28, 9))
    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNcclGroup, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    return monkeypatch


def test_a_recent_torch_and_nccl_with_nvls_off_have_windows(gpu_torch):
    assert nccl_windows.missing_support() is None


def test_what_is_missing_is_named(gpu_torch):
    gpu_torch.delattr(FakeNcclGroup, "mem_allocator")
    gpu_torch.delattr(torch.cuda, "use_mem_pool")
    reason = nccl_windows.missing_support()
    assert reason.startswith(f"torch {torch.__version__} lacks ")
    assert "torch.cuda.use_mem_pool" in reason and "ProcessGroupNCCL.mem_allocator" in reason
    assert "register_mem_pool" not in reason


def test_a_registration_without_symm_is_not_enough(gpu_torch):
    def register_mem_pool(self, pool):
        """register_mem_pool(self, arg0: MemPool) -> None"""

    gpu_torch.setattr(FakeNcclGroup, "register_mem_pool", register_mem_pool)
    assert "takes no symm argument" in nccl_windows.missing_support()


@pytest.mark.parametrize("version", [(2, 26, 5), 22605])  # a tuple, or the code older torch returns
def test_nccl_before_2_27_has_no_symmetric_kernels(gpu_torch, version):
    gpu_torch.setattr(torch.cuda.nccl, "version", lambda: version)
    assert nccl_windows.missing_support() == "NCCL 2.26.5 has no symmetric kernels (2.27 or later)"


@pytest.mark.parametrize("value", [None, "1"])
def test_windows_are_refused_while_nvls_may_run(gpu_torch, value):
    if value is None:
        gpu_torch.delenv("NCCL_NVLS_ENABLE")
    else:
        gpu_torch.setenv("NCCL_NVLS_ENABLE", value)
    assert nccl_windows.missing_support().startswith("refused: NVLink multicast is not disabled")


def test_env_says_whether_the_tools_runs_can_register_windows(gpu_torch):
    from overlapbench.launch import environment

    gpu_torch.delenv("NCCL_NVLS_ENABLE")  # the runs set it to 0 themselves (runtime.SAFE_ENV)
    assert environment.nccl_windows().startswith("torch and NCCL 2.28.9 offer them")
    gpu_torch.setenv("NCCL_NVLS_ENABLE", "1")  # the user's choice: kept, and windows refused
    assert environment.nccl_windows().startswith("no: refused: NVLink multicast is not disabled")
    gpu_torch.setattr(torch.cuda.nccl, "version", lambda: (2, 26, 5))
    gpu_torch.setenv("NCCL_NVLS_ENABLE", "0")
    assert environment.nccl_windows() == "no: NCCL 2.26.5 has no symmetric kernels (2.27 or later)"


# --- registration --------------------------------------------------------------------------------


class Recorder:
    """A stand-in for torch's pool machinery and an NCCL backend, logging what happens in order."""

    def __init__(self, fail_allocation: bool = False):
        self.events: list = []
        self.fail_allocation = fail_allocation
        self.in_pool = False

    def pool(self, allocator):
        self.events.append(("pool", allocator))
        return SimpleNamespace(allocator=allocator)

    @contextlib.contextmanager
    def use_mem_pool(self, pool):
        self.in_pool = True
        yield
        self.in_pool = False

    def empty(self, numel, dtype=None, device=None):
        self.events.append(("allocate", numel, self.in_pool))
        if self.fail_allocation:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return torch.zeros(numel, dtype=dtype)

    def backend(self, device):
        return SimpleNamespace(mem_allocator="nccl-allocator",
                               register_mem_pool=lambda pool, symm: self.events.append(("register", symm)))


@pytest.fixture
def recorder(monkeypatch):
    def make(fail_allocation=False):
        rec = Recorder(fail_allocation)
        monkeypatch.setattr(torch.cuda, "MemPool", rec.pool)
        monkeypatch.setattr(torch.cuda, "use_mem_pool", rec.use_mem_pool)
        monkeypatch.setattr(torch, "empty", rec.empty)
        monkeypatch.setattr(dist, "all_reduce", lambda t, group=None: rec.events.append(("all_reduce", group)))
        return rec
    return make


def test_a_window_is_allocated_in_the_groups_pool_then_registered_as_symmetric(recorder):
    rec = recorder()
    group = SimpleNamespace(_get_backend=rec.backend)
    agreed = []
    window = nccl_windows.register(group, torch.device("cpu"), 1000, torch.float32, lambda e: agreed.append(e))
    assert rec.events == [("all_reduce", group), ("pool", "nccl-allocator"), ("allocate", 1000, True), ("register", True)]
    assert agreed == [None] and window.numel == 1000 and window.group is group and window.pool is not None
    assert window.view(24, (2, 3)).shape == (2, 3)
    with pytest.raises(ValueError, match="no room"):
        window.view(999, (2,))


def test_no_rank_registers_when_one_could_not_allocate(recorder):
    rec = recorder(fail_allocation=True)
    group = SimpleNamespace(_get_backend=rec.backend)
    errors = []

    def agree(error):
        errors.append(error)
        return "rank 1: " + error  # as Runtime._first_error names the rank

    with pytest.raises(torch.OutOfMemoryError, match="rank 1: OutOfMemoryError: CUDA out of memory"):
        nccl_windows.register(group, torch.device("cpu"), 1000, torch.float32, agree)
    assert errors[0].startswith("OutOfMemoryError") and ("register", True) not in rec.events
    # a rank that allocated fine learns of the other's failure, and does not register either
    rec = recorder()
    with pytest.raises(RuntimeError, match="rank 0: boom"):
        nccl_windows.register(SimpleNamespace(_get_backend=rec.backend), torch.device("cpu"), 10, torch.float32,
                              lambda error: "rank 0: boom")
    assert ("register", True) not in rec.events


def test_regions_start_on_pages_and_the_window_holds_them_all():
    starts, total = nccl_windows.layout([3, 5000, 1], 2)  # bf16: 2048 elements a page
    assert starts == [0, 2048, 8192] and total == 10240
    assert nccl_windows.layout([4096], 4) == ([0], 4096)
    assert nccl_windows.layout([], 2) == ([], 0)


# --- the runtime's groups and windows -----------------------------------------------------------


class FakeOptions:
    def __init__(self, is_high_priority_stream=False):
        self.high_priority = is_high_priority_stream
        self.config = SimpleNamespace(max_ctas=None, min_ctas=None)


def fake_cuda_runtime(monkeypatch) -> runtime.Runtime:
    made = []
    monkeypatch.setattr(dist, "ProcessGroupNCCL", SimpleNamespace(Options=FakeOptions), raising=False)
    monkeypatch.setattr(dist, "new_group", lambda backend, pg_options: made.append(pg_options) or pg_options)
    rt = runtime.Runtime(0, 2, 0, torch.device("cuda", 0), "nccl")
    rt.made = made
    return rt


def test_an_exact_budget_sets_min_ctas_to_max_ctas(monkeypatch):
    rt = fake_cuda_runtime(monkeypatch)
    plain, exact = rt.group(8), rt.group(8, exact=True)
    assert (plain.config.max_ctas, plain.config.min_ctas) == (8, 1)  # a cap, as the nccl path has measured
    assert (exact.config.max_ctas, exact.config.min_ctas) == (8, 8)
    assert rt.group(8, exact=True) is exact and rt.group(8) is plain and len(rt.made) == 2  # made once each
    fast = rt.group(16, high_priority=True, exact=True)
    assert fast.high_priority and fast.config.min_ctas == 16
    assert rt.group(DEFAULT, exact=True) is None  # NCCL's own choice: the world group
    assert rt.group(DEFAULT, high_priority=True, exact=True).config.max_ctas is None


def test_windows_are_made_once_per_group_and_grow_keeping_the_old(monkeypatch):
    rt = fake_cuda_runtime(monkeypatch)
    made = []

    def register(group, device, numel, dtype, agree):
        made.append((group, numel, dtype))
        return nccl_windows.NcclWindow(torch.empty(numel, dtype=dtype), None, group)

    monkeypatch.setattr(nccl_windows, "register", register)
    monkeypatch.setattr(dist, "group", SimpleNamespace(WORLD="world"))
    first = rt.window(100, torch.bfloat16, 8)
    assert rt.window(50, torch.bfloat16, 8) is first and len(made) == 1
    assert made[0][0] is rt.group(8, exact=True)  # the exact group: NCCL runs on all 8 CTAs
    bigger = rt.window(200, torch.bfloat16, 8)
    assert bigger is not first and bigger.numel == 200
    assert rt._windows[(8, False, torch.bfloat16)] == [first, bigger]  # the old one is kept
    assert rt.window(10, torch.float32, 8) is not bigger  # per dtype
    assert rt.window(10, torch.bfloat16, DEFAULT).group == "world"
    assert rt.window(10, torch.bfloat16, DEFAULT, high_priority=True).group.high_priority


def test_gloo_runs_have_no_windows():
    rt = runtime.Runtime(0, 2, 0, torch.device("cpu"), "gloo")
    assert rt.nccl_windows_unavailable().startswith("needs NCCL on CUDA GPUs")


# --- the comm path ---------------------------------------------------------------------------------


def comm_bench(**overrides) -> CommSpec:
    values = dict(ops=paths.OPS, paths=("nccl", "nccl_symm"), sizes=(100, 4 * K, M), nccl_max_ctas=("default", 8),
                  comm_ctas=(4,), hidden=1024)
    return CommSpec(**(values | overrides))


def test_nccl_symm_runs_at_the_nccl_budgets_where_windows_can_be_registered():
    cases = paths.make_cases(comm_bench(), world=2, backend="nccl", dtype="bf16", hidden=1024)
    symm = [c for c in cases if c.path == "nccl_symm"]
    assert {(c.op, c.ctas) for c in symm} == {(op, b) for op in paths.OPS for b in ("default", 8)}
    assert all(c.window and c.skip is None for c in symm if c.size >= 4 * K)
    assert not any(c.window for c in cases if c.path == "nccl")


def test_nccl_symm_is_skipped_with_the_reason_windows_cannot_be_made():
    why = "NCCL 2.26.5 has no symmetric kernels (2.27 or later)"
    cases = paths.make_cases(comm_bench(), world=2, backend="nccl", dtype="bf16", hidden=1024, windows=why)
    assert {c.skip for c in cases if c.path == "nccl_symm"} == {why}
    assert not any(c.skip for c in cases if c.path == "nccl" and c.size >= 4 * K)
    gloo = paths.make_cases(comm_bench(), world=2, backend="gloo", dtype="fp32", hidden=1024)
    assert all("gloo on CPU" in c.skip for c in gloo if c.path == "nccl_symm")
    alone = paths.make_cases(comm_bench(), world=1, backend="nccl", dtype="bf16", hidden=1024)
    assert all("2..8 ranks" in c.skip for c in alone if c.path == "nccl_symm")  # NCCL copies locally at 1


def test_one_window_per_budget_sized_for_its_largest_case():
    cases = [Case("all_reduce", "nccl_symm", "nccl", 8, M, M // 2, "bf16", window=True),
             Case("all_gather", "nccl_symm", "nccl", 8, M, M // 2, "bf16", window=True),  # out + in: 1.5x
             Case("all_reduce", "nccl_symm", "nccl", "default", 4 * K, 2 * K, "bf16", window=True),
             Case("all_reduce", "nccl_symm", "nccl", 16, 4 * M, 2 * M, "bf16", window=True, skip="no"),
             Case("all_reduce", "nccl", "nccl", 8, 4 * M, 2 * M, "bf16")]
    asked = []
    rt = SimpleNamespace(world_size=2, device=torch.device("cpu"),
                         window=lambda numel, dtype, ctas, high: asked.append((numel, dtype, ctas, high)))
    bufs = buffers.Buffers(rt, cases)
    for case in cases[:3]:
        bufs.window(case)
    assert asked == [(3 * M // 4, torch.bfloat16, 8, False)] * 2 + [(2 * K, torch.bfloat16, "default", False)]


def _rank_symm(rank: int, world: int, op: str) -> tuple:
    from overlapbench.comm import patterns

    rt = runtime.init(timeout_s=60)
    # a stand-in window: a plain tensor on gloo (the regions and the checks are what is tested here)
    nccl_windows.register = lambda group, device, numel, dtype, agree: nccl_windows.NcclWindow(
        torch.full((numel,), -7.0, dtype=dtype), None, group)
    case = Case(op, "nccl_symm", "gloo", 4, 3 * K, 3 * K // 4, "fp32", seed=11, window=True)
    bufs = buffers.Buffers(rt, [case])
    bench = paths.build(rt, case, bufs)
    window = bufs.window(case).tensor
    out = bench.out()
    wrong = comm_run.check(bench, case.seed, rt)
    expected = patterns.op_expected(op, rank, world, case.count, case.seed, torch.float32, "cpu")
    inside = window.data_ptr() <= out.data_ptr() < window.data_ptr() + window.numel() * 4
    return wrong, patterns.count_wrong(out, expected), inside, out.data_ptr() - window.data_ptr(), window.numel()


@pytest.mark.slow
@pytest.mark.parametrize("op", paths.OPS)
def test_nccl_symm_collectives_run_on_views_of_their_window(op):
    results = distributed.run(_rank_symm, op)
    assert [r[:3] for r in results] == [(0, 0, True)] * 2
    assert results[0][3] == 0  # the output first, at the window's start (the input after it, on a page)
    assert results[0][4] == (1024 if op == "all_reduce" else 2048)  # fp32: whole pages of 1024 elements


def test_a_window_case_that_ran_a_ring_kernel_fails(tmp_path):
    log = nccl_log.TuningLog(tmp_path / "nccl.log")
    rt = SimpleNamespace(world_size=2)
    symm = Case("all_reduce", "nccl_symm", "nccl", 8, M, M // 2, "bf16", window=True)
    plain = Case("all_reduce", "nccl", "nccl", 8, M, M // 2, "bf16")
    head = "h:1:2 [0] NCCL INFO "
    log.path.write_text(head + "AllReduce: 8 Bytes -> Algo Ring proto LL channel{Lo..Hi}={0..0}\n")
    mark = log.mark()
    with log.path.open("a") as f:
        f.write(head + f"AllReduce [Symmetric]: {M} Bytes -> Kernel AllReduce_RSxLD_AGxST nchannels 8 nthreads 512 nWorks 1\n")
    assert comm_run._nccl_kernel(rt, symm, log, mark) == {
        "nccl_kernel": "AllReduce_RSxLD_AGxST", "nccl_channels": 8, "nccl_symmetric": True}
    with log.path.open("a") as f:
        f.write(head + f"AllReduce: {M} Bytes -> Algo Ring proto Simple channel{{Lo..Hi}}={{0..7}}\n")
    failed = comm_run._nccl_kernel(rt, symm, log, mark)
    assert failed["status"] == "failed" and failed["error"].startswith("NCCL ran Ring/Simple on 8 channels, not a symmetric")
    assert "status" not in comm_run._nccl_kernel(rt, plain, log, mark)  # the plain path records, never fails
    assert comm_run._nccl_kernel(rt, symm, None, 0) == {}  # no log (the user's NCCL_DEBUG): nothing recorded


def test_rows_and_outputs_carry_the_kernel_nccl_ran():
    env = {"world_size": 2, "device": "NVIDIA H200", "backend": "nccl", "hosts": ["h"], "versions": {}, "git": None}
    info = comm_run.RunInfo("comm", "run1", env, 1, 3, True)
    case = Case("all_reduce", "nccl_symm", "nccl", 8, M, M // 2, "bf16", seed=1, window=True)
    result = {"status": "ok", "error": None, "wrong": 0, "ms": 0.01, "cv": 0.01, "algbw": 100.0, "busbw": 100.0,
              "graphs": True, "nccl_kernel": "AllReduce_RSxLD_AGxST", "nccl_channels": 8, "nccl_symmetric": True}
    row = comm_run.make_row(case, result, info)
    assert (row["strategy"], row["nccl_kernel"], row["nccl_channels"], row["nccl_symmetric"]) == (
        "nccl_symm", "AllReduce_RSxLD_AGxST", 8, True)
    assert output.record(row)["nccl_kernel"] == "AllReduce_RSxLD_AGxST" and output.record(row)["nccl_channels"] == 8
    assert "NCCL AllReduce_RSxLD_AGxST x8" in output.summary_line(row).plain
    assert "nccl_kernel,nccl_channels" in output.to_csv([row]).splitlines()[0]
    table = output.to_table([row])
    assert "NCCL kernel" in [c.header for c in table.columns]
    plain = comm_run.make_row(Case("all_reduce", "nccl", "gloo", None, M, M // 4, "fp32", seed=2),
                              {k: v for k, v in result.items() if not k.startswith("nccl")}, info)
    assert "nccl_kernel" not in plain and "NCCL kernel" not in [c.header for c in output.to_table([plain]).columns]


class _Backend:
    def __init__(self, error: str | None):
        self.error = error

    @property
    def mem_allocator(self):
        if self.error:
            raise RuntimeError(self.error)
        return object()


class _Group:
    def __init__(self, error: str | None):
        self.backend = _Backend(error)

    def _get_backend(self, device):
        return self.backend


def test_a_backend_that_refuses_its_window_allocator_is_a_reason_to_skip():
    """torch 2.11 + NCCL 2.28.9 on a one-GPU H200 has every API and still raises at run time."""
    said = "NCCL mem allocator is not supported in this NCCL version\nmore"
    assert nccl_windows.allocator_refusal(_Group(said), "cuda:0") == (
        "torch's NCCL backend gives no window allocator here: NCCL mem allocator is not supported in this NCCL version")
    assert nccl_windows.allocator_refusal(_Group(None), "cuda:0") is None

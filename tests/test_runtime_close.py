"""The runtime gives back what a run holds in the order NCCL needs: windows are deregistered and
freed while their communicators live, then the process group goes (on GPUs a pool that outlived
its communicator aborted both ranks at exit: tests/test_clean_exit_gpu.py runs the real thing).
Here, on CPU, with a window whose group records what is done to it."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
import torch.distributed as dist

from overlapbench.distributed import nccl_windows, runtime
from overlapbench.distributed.nccl_windows import NcclWindow
from overlapbench.launch.session import session
from tests import distributed


@dataclass
class Journal:
    """What was done, in order, to the fake backend and the process group."""

    events: list[str] = field(default_factory=list)


class Backend:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def deregister_mem_pool(self, pool) -> None:
        self.journal.events.append(f"deregister {pool}")


class Group:
    def __init__(self, journal: Journal) -> None:
        self.backend = Backend(journal)

    def _get_backend(self, device):
        return self.backend


def _window(journal: Journal, name: str) -> NcclWindow:
    return NcclWindow(torch.randn(16), name, Group(journal))


def test_release_deregisters_the_pool_and_drops_the_memory_once():
    journal = Journal()
    window = _window(journal, "pool-a")
    nccl_windows.release(window, torch.device("cpu"))
    nccl_windows.release(window, torch.device("cpu"))  # a second release does nothing
    assert journal.events == ["deregister pool-a"]
    assert window.tensor is None and window.pool is None


def test_an_interrupted_close_releases_windows_without_collectives(monkeypatch):
    journal = Journal()
    rt = runtime.Runtime(0, 2, 0, torch.device("cpu"), "nccl")
    windows = [_window(journal, "pool-a"), _window(journal, "pool-b")]
    rt._windows[(8, False, torch.bfloat16)] = windows
    rt._resources["other"] = object()

    def collective(*args, **kwargs):
        raise AssertionError("a collective after an interrupt: a peer may be gone")

    monkeypatch.setattr(dist, "barrier", collective)
    monkeypatch.setattr(dist, "destroy_process_group", collective)
    rt.close(clean=False)
    assert journal.events == ["deregister pool-a", "deregister pool-b"]
    assert all(w.pool is None for w in windows) and not rt._resources and not rt._windows


def test_a_clean_close_releases_windows_before_the_group_goes(monkeypatch):
    journal = Journal()
    rt = runtime.Runtime(0, 2, 0, torch.device("cpu"), "nccl")
    rt._windows[("default", True, torch.bfloat16)] = [_window(journal, "pool-a")]
    monkeypatch.setattr(dist, "barrier", lambda group=None: journal.events.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: journal.events.append("destroy"))
    rt.close()
    assert journal.events == ["barrier", "deregister pool-a", "destroy"]


@pytest.mark.parametrize("fail", [False, True], ids=["finished", "raised"])
def test_a_session_leaves_the_group_only_when_the_run_finished(monkeypatch, fail):
    """A finished run closes cleanly (the group destroyed); one that raised releases what it holds
    and leaves the group to the exit, with no collective a lost peer could hang."""
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(distributed.free_port())}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        with session(timeout_s=60) as rt:
            total = torch.randn(3)
            dist.all_reduce(total, group=rt.control)
            if fail:
                raise KeyError("a failure inside the run")
    except KeyError:
        pass
    try:
        assert dist.is_initialized() == fail
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_an_interrupted_close_on_gpus_frees_nothing_and_leaves_the_process_to_end_at_once(monkeypatch):
    """On GPUs, kernels still queued may read the windows and symmetric buffers through peer
    mappings: nothing is deregistered or dropped, and the process is marked for os._exit."""
    journal = Journal()
    monkeypatch.setattr(runtime, "_abandoned", False)
    rt = runtime.Runtime(0, 2, 0, torch.device("cuda", 0), "nccl")  # no CUDA call is made: the device is never used
    windows = [_window(journal, "pool-a")]
    rt._windows[(8, False, torch.bfloat16)] = windows
    kept = object()
    rt._resources["buffers"] = kept

    def collective(*args, **kwargs):
        raise AssertionError("a collective after an interrupt: a peer may be gone")

    monkeypatch.setattr(dist, "barrier", collective)
    monkeypatch.setattr(dist, "destroy_process_group", collective)
    assert not runtime.abandoned()
    rt.close(clean=False)
    assert runtime.abandoned()
    assert journal.events == [] and windows[0].pool == "pool-a" and rt._resources == {"buffers": kept}

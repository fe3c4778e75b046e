"""A profiled forward starts on every rank at once (Runtime.in_step inside timeline.record), so
the ranks' timelines of one point start as the timed loop's iterations do, not as far apart as
each rank's profiler took to start: a transfer joining the ranks would read that skew as exposed
time on the rank that started first (results/h200x4/60ae8af/report-profile-70b-tp4-1k-2k.txt: the
1K replays started up to 2.6 ms apart)."""

from __future__ import annotations

import random
import time

from tests import distributed


def _recorded_starts(rank: int, world: int, late: int, delay_s: float, in_step: bool) -> dict:
    """On gloo processes, after a barrier: rank `late` waits `delay_s` before it profiles; each rank records one
    forward through timeline.record and says when it asked to start (monotonic clock, one per
    host), when its forward began, and whether the profiler was on while the ranks met."""
    import torch
    import torch.profiler

    from overlapbench.distributed import runtime
    from overlapbench.timing import timeline

    rt = runtime.Runtime(rank, world, rank, torch.device("cpu"), "gloo", None)
    seen: dict = {}

    def meet() -> None:
        seen["profiling"] = torch.autograd._profiler_enabled()
        rt.in_step()

    def forward() -> None:
        seen["forward"] = time.monotonic()
        torch.ones(8).add_(1)

    with torch.profiler.profile():  # the profiler's first start in a process takes about a second on CPU
        pass
    torch.distributed.barrier()  # the ranks start together here: only the delay sets them apart
    if rank == late:
        time.sleep(delay_s)
    seen["asked"] = time.monotonic()
    recorded = timeline.record(forward, cuda=False, rank=rank, world=world, in_step=meet if in_step else None)
    return seen | {"host_ops": recorded["host_ops"], "rank": recorded["rank"]}


def test_every_rank_s_profiled_forward_starts_after_the_last_rank_asked_to_profile():
    world = random.randrange(2, 4)
    late = random.randrange(world)
    got = distributed.run(_recorded_starts, late, 0.5, True, world=world)
    last_asked = max(r["asked"] for r in got)
    assert all(r["forward"] >= last_asked for r in got), [(r["asked"], r["forward"]) for r in got]
    assert all(r["profiling"] for r in got), "the ranks met outside the profiler: its start would skew them again"
    assert [r["rank"] for r in got] == list(range(world))


def test_without_the_meeting_a_rank_that_starts_first_profiles_first():
    """The control: with nothing joining them, the ranks not held back start their forwards
    before the late rank asks to, which is what the first test rules out."""
    world = random.randrange(2, 4)
    late = random.randrange(world)
    got = distributed.run(_recorded_starts, late, 0.5, False, world=world)
    early = [r for i, r in enumerate(got) if i != late]
    assert all(r["forward"] < got[late]["asked"] for r in early)

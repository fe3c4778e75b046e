"""The host's time as bench sees it (overlapbench.timing.bench's perf_counter: warm_up, and the
wall clock's marks on CPU), moved on only by the work a test hands it: every time and every
count a budget gives is known in advance, whatever else the machine runs."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace


class FakeTime:
    """`fn` takes `per_call_ms` per call; `piece(ms)` makes a stand-in of its own length."""

    def __init__(self, monkeypatch, per_call_ms: float = 0.0, start_s: float = 1000.0) -> None:
        from overlapbench.timing import bench

        self.now, self.per_call_ms, self.calls = start_s, per_call_ms, 0
        monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: self.now))

    def fn(self) -> None:
        self.calls += 1
        self.now += self.per_call_ms / 1e3

    def piece(self, ms: float, then: Callable[[], None] = lambda: None) -> Callable[[], None]:
        """A stand-in for work that lasts `ms`, calling `then` each time it runs."""
        def run() -> None:
            then()
            self.now += ms / 1e3
        return run

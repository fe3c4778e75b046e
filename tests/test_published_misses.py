"""Every figure docs/long-prompts.md publishes about the TP=2 misses profiled at 2026-11-28 (llama3-70b
at 8K and 64K, llama3-8b at 8K: `results/h200x2/b241e4c/`), computed again from the committed rows
and timelines it cites (the mechanism: tests/published.py). A figure changed in the text, or files
that no longer give it, fails with the passage as it should read."""

from __future__ import annotations

import functools

from overlapbench.report import exposed, twins
from overlapbench.timing import timeline
from tests import figures as f
from tests.published import Claim, bounds, claims_test
from tests.test_published_docs import _miss as docs_miss
from tests.test_published_order import hidden

DOC = "docs/long-prompts.md"
RUN = "results/h200x2/b241e4c/"
A, B = RUN + "profile-tp2-misses-70b-8k-64k", RUN + "profile-tp2-misses-8b-8k"  # each a folder and its .jsonl
SPLIT = "token_split-{tokens}-align=256-split_offset=0-split_ratio=balanced-comm="
POINTS = {"copy_engine": "copy_engine-comm_ctas_attn=32-comm_ctas_mlp=32-4layers",
          "nccl_symm": "nccl_symm-comm_ctas_attn=16-comm_ctas_mlp=16-reduce_start=after_next_gemm-4layers",
          "none": "none-4layers"}


def _miss(store: str, tokens: int, comm: str, target: float) -> dict:
    """The balanced split on `comm` at one point of a profile run, checked the fastest choice that
    communicates there, as a row of the misses table (tests/test_published_docs.py's `_miss`)."""
    rows = [r for r in f.rows(store + ".jsonl") if r["status"] == "ok" and r["tokens"] == tokens]
    choices = [r for r in rows if r["strategy"] not in ("baseline", "no_comm") and r["knobs"].get("comm") != "none"]
    assert min(choices, key=lambda r: r["ms"])["knobs"]["comm"] == comm, [(r["knobs"], r["ms"]) for r in choices]
    return docs_miss(store + ".jsonl", target, {"comm": comm, "split_ratio": "balanced"}, tokens)


def _alone(store: str, tokens: int) -> float:
    """The share the split with no transfers hides (%) in a profile run's timed rows, from their
    paired speedups (the document's definition): what the split costs before any transfer."""
    return hidden(store, tokens, comm="none")


def _name(tokens: int, what: str) -> str:
    return f"{what}-{tokens}-4layers" if what in ("baseline", "no_comm") else SPLIT.format(tokens=tokens) + POINTS[what]


@functools.cache
def _replay(folder: str, tokens: int, what: str, rank: int = 0) -> exposed.Timeline:
    """One rank's four graph replays of a point, back to back."""
    return exposed.read(f.path(folder) / timeline.file_name(_name(tokens, what), replay=True, rank=rank))


@functools.cache
def _exposure(folder: str, tokens: int, what: str) -> exposed.Exposure:
    """Rank 0's replays of a point, analyzed once: busy, exposed and idle time, the exposed intervals."""
    return exposed.analyze(_replay(folder, tokens, what).kernels)


def _against_free(folder: str, tokens: int, what: str) -> dict:
    """Rank 0's replays of a point against no_comm's, ms over the 16 layers: wall, compute busy,
    exposed, idle."""
    got, free = (_exposure(folder, tokens, w) for w in (what, "no_comm"))
    return {k: (getattr(got, k) - getattr(free, k)) / 1e3 for k in ("wall", "compute", "exposed", "idle")}


def _twin(folder: str, tokens: int, what: str) -> dict:
    """A split against its `comm: none` twin on both ranks (report/twins.py): the GEMMs' median
    stretch (%), their and attention's stretch per layer (ms), the share of the GEMMs' time with
    nothing of the transfer path beside it (%)."""
    found = [twins.compare(_replay(folder, tokens, what, r), _replay(folder, tokens, "none", r), 4) for r in (0, 1)]
    return {"pct": bounds(s.gemm_median_pct for s in found), "gemm": bounds(s.stretch["gemm"] for s in found),
            "attn": bounds(s.stretch["attention"] for s in found),
            "none": bounds(100 * s.beside["nothing"] / sum(s.beside.values()) for s in found)}


def _longest(folder: str, tokens: int, what: str, n: int) -> list[exposed.Interval]:
    """Rank 0's `n` longest exposed intervals of a point's replays (report --profile's table), longest first."""
    return sorted(_exposure(folder, tokens, what).intervals, key=lambda i: -i.exposed)[:n]


def _tails_64k() -> dict:
    """At 70B 64K, the `nccl_symm` split's four longest exposed intervals: each replay's last
    reduction, after the stack's last add + norm (checked), their sum and bytes."""
    tails = _longest(A, 65536, "nccl_symm", 4)
    assert {(i.after.kind, i.transfer.bytes) for i in tails} == {("norm", tails[0].transfer.bytes)}, tails
    total = _exposure(A, 65536, "nccl_symm").exposed
    return {"sum": sum(i.exposed for i in tails) / 1e3, "of": total / 1e3, "mib": tails[0].transfer.bytes / 2**20,
            "each": bounds(i.exposed / 1e3 for i in tails)}


def _behind_gemm(folder: str, tokens: int, what: str, n: int) -> dict:
    """A point's `n` longest exposed intervals, each after a GEMM (checked): their exposed ms, the
    GEMMs' GFLOP (largest first, joined by "and") and the transfer's MiB where the trace knows it."""
    longest = _longest(folder, tokens, what, n)
    assert {i.after.kind for i in longest} == {"gemm"}, longest
    sizes = {i.transfer.bytes for i in longest}
    gflops = sorted({round(i.after.flops / 1e9) for i in longest}, reverse=True)
    return {"ms": bounds(i.exposed / 1e3 for i in longest), "gflop": " and ".join(str(g) for g in gflops),
            "mib": next(iter(sizes)) / 2**20 if len(sizes) == 1 and None not in sizes else None}


@functools.cache  # two claims read it
def _long_70b() -> dict:
    return {"alone": _alone(A + ".jsonl", 65536), "symm": _against_free(A, 65536, "nccl_symm"),
            "tw": _twin(A, 65536, "nccl_symm"), "ce": _twin(A, 65536, "copy_engine")}


def _short_70b() -> dict:
    return {"alone": _alone(A + ".jsonl", 8192), "symm": _against_free(A, 8192, "nccl_symm"), "tw": _twin(A, 8192, "nccl_symm")}


def _split_8b() -> dict:
    alone = _alone(B + ".jsonl", 8192)
    return {"alone": alone, "cost": 100 - alone, "none": _against_free(B, 8192, "none")}


LEDGER = [  # the targets-stand table's rows: the label, the profile run's rows, its token count
    ("| llama3-70b TP=2, 2K, 90% |", "results/h200x2/f320f41/profile-70b-tp2-1k-2k.jsonl", 2048),
    ("| llama3-70b TP=2, 8K, 90% |", A + ".jsonl", 8192),
    ("| llama3-70b TP=2, 16K, 90% |", "results/h200x2/eccace6/profile-order-70b-tp2-4k-16k.jsonl", 16384),
    ("| llama3-70b TP=2, 32K, 80% |", "results/h200x2/f320f41/profile-tp2-misses-70b.jsonl", 32768),
    ("| llama3-70b TP=2, 64K, 80% |", A + ".jsonl", 65536),
    ("| llama3-8b TP=2, 2K, 75% |", "results/h200x2/f320f41/profile-tp2-misses-8b.jsonl", 2048),
    ("| llama3-8b TP=2, 8K, 85% |", B + ".jsonl", 8192),
    ("| llama3-70b TP=4, 2K, 85% |", "results/h200x4/f9d2080/profile-tp4-misses-70b.jsonl", 2048),
    ("| llama3-8b TP=4, 4K, 80% |", "results/h200x4/f9d2080/profile-tp4-misses-8b.jsonl", 4096),
]

ROWS = ("| llama3-70b, 2 | 8K | 6cd018d751b4 | `nccl_symm` split 16/16, balanced cut, after the next GEMM | "
        "{a8[hid]:.0f}% | 90% | {a8[cut]:.3f} | | llama3-70b, 2 | 64K | 6cd018d751b4 | `nccl_symm` split 16/16, balanced "
        "cut, after the next GEMM | {a64[hid]:.0f}% | 80% | {a64[cut]:.3f} | | llama3-8b, 2 | 8K | fa8dbd77bad0 | "
        "copy-engine split 32/32, balanced cut | {b8[hid]:.0f}% | 85% | {b8[cut]:.3f} |")

CLAIMS = [
    Claim(DOC, ROWS, lambda: {"a8": _miss(A, 8192, "nccl_symm", 0.90), "a64": _miss(A, 65536, "nccl_symm", 0.80),
                              "b8": _miss(B, 8192, "copy_engine", 0.85)}),
    Claim(DOC, "the balanced split with no transfers hides {alone:.0f}% in the timed rows. In rank 0's replays the "
               "`nccl_symm` split is {symm[wall]:.1f} ms behind `no_comm` over the 16 layers: {symm[compute]:.1f} ms more "
               "compute busy time, {symm[exposed]:.1f} ms exposed", _long_70b),
    Claim(DOC, "Against its twin with no transfers its GEMMs run "
               "{tw[pct][lo]:.1f}-{tw[pct][hi]:.1f}% longer (each rank's median; {tw[gemm][lo]:.1f}-{tw[gemm][hi]:.1f} ms "
               "per layer) and its attention {tw[attn][lo]:.1f}-{tw[attn][hi]:.1f} ms, though {tw[none][lo]:.0f}-"
               "{tw[none][hi]:.0f}% of the GEMMs' time has nothing of the transfer path beside it; the copy-engine split's "
               "GEMMs run {ce[pct][lo]:.1f}-{ce[pct][hi]:.1f}% longer with nothing beside them for {ce[none][lo]:.0f}-"
               "{ce[none][hi]:.0f}% of their time", _long_70b),
    Claim(DOC, "the split with no transfers hides {alone:.0f}%; the `nccl_symm` split's replays are {symm[wall]:.1f} ms "
               "behind `no_comm` ({symm[compute]:.1f} ms more compute busy time, {symm[exposed]:.1f} exposed), its GEMMs "
               "{tw[pct][lo]:.1f}-{tw[pct][hi]:.1f}% longer than its twin's with nothing beside them for "
               "{tw[none][lo]:.0f}-{tw[none][hi]:.0f}% of their time", _short_70b),
    Claim(DOC, "The balanced split with no transfers hides {alone:.0f}% in the timed rows: {cost:.0f}% of the exposed "
               "communication is gone before any transfer runs, where the target leaves 15%. In rank 0's replays that "
               "split is {none[wall]:.1f} ms behind `no_comm` over the 16 layers ({none[compute]:.1f} ms more compute "
               "busy time, {none[idle]:.1f} ms idle)", _split_8b),
    *[Claim(DOC, label + " {share:.0f}% |", lambda s=store, t=tokens: {"share": _alone(s, t)})
      for label, store, tokens in LEDGER],
    Claim(DOC, "{of:.1f} ms exposed, {sum:.1f} of them the four replays' last reductions ({mib:.0f} MiB each, "
               "{each[lo]:.1f}-{each[hi]:.1f} ms, after the stack's last add + norm with nothing left to hide behind)",
          _tails_64k),
    Claim(DOC, "its four longest exposed intervals are {mib:.0f} MiB reductions left with no compute after the MLP's "
               "{gflop}-GFLOP down projection "
               "({ms[lo]:.2f}-{ms[hi]:.2f} ms)", lambda: _behind_gemm(A, 8192, "nccl_symm", 4)),
    Claim(DOC, "The copy-engine split's four longest exposed intervals are barrier waits after GEMMs of {gflop} GFLOP "
               "({ms[lo]:.2f}-{ms[hi]:.2f} ms)", lambda: _behind_gemm(B, 8192, "copy_engine", 4)),
]


test_each_published_figure_follows_from_its_rows = claims_test(CLAIMS)

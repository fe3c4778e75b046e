"""Every figure the results READMEs publish, computed again from the committed files they cite.

Each claim is a passage as the document prints it, with its figures left as fields, and how to
compute them (tests/published.py, tests/figures.py). A number changed in the text, or rows that no
longer give it, fails with the passage as it should read. To publish a new figure, add a claim.
"""

from __future__ import annotations

import pytest

from tests import figures as f
from tests import published
from tests.published import Claim, bounds, claims_test

H = "results/h200x2/README.md"
R = "results/h200x2/"
K4 = 4096  # "at >= 4K": the token counts whose intervals the paired-timing acceptance bounds
UP_TO_8K = range(1, 8193)


def _software() -> dict:
    rows = f.sweep_rows(R)
    versions = f.the_one([r["versions"] for r in rows], "versions of the sweep and comm rows")
    multicast = f.the_one([r["multicast_env"] for r in rows], "multicast_env of the sweep and comm rows")
    days = sorted({r["time"][:10] for r in rows})
    return {**versions, **multicast, "days": ", ".join(days[:-1]) + " and " + days[-1] if len(days) > 1 else days[0]}


def _points(store: str, walls: tuple[str, str] | None = None) -> dict:
    (run,) = f.run_ids(R + store)
    out = {"run": run, "n": f.row_count(R + store)}
    if walls:
        out["wall"] = f.walls(R + walls[0])[walls[1]]
    return out


def _walls(a: tuple[str, str], b: tuple[str, str]) -> dict:
    return {"a": f.walls(R + a[0])[a[1]], "b": f.walls(R + b[0])[b[1]]}


def _half_widths(*stores: str) -> list[float]:
    return [w for s in stores for w in f.half_widths(R + s, K4)]


def _intervals_1017330() -> dict:
    widths = _half_widths("1017330/sp-llama3-70b-tp2-a.jsonl", "1017330/sp-llama3-70b-tp2-b.jsonl")
    wide = [w for w in widths if w > 0.005]
    return {"narrow": len(widths) - len(wide), "n": len(widths), "out": len(wide), **bounds(wide, 100)}


def _round_spread(figure, what: str) -> dict:
    """Over the two runs before the ranks were aligned (a034cb8) and the two after (3b4da9f)."""
    txt = R + "3b4da9f/round-spread.txt"
    before, after = ([v for x in "ab" for v in figure(txt, f"{when}/sp-llama3-70b-tp2-{x}.jsonl", *what)]
                     for when in ("a034cb8", "3b4da9f"))
    return {"blo": min(before), "bhi": max(before), "alo": min(after), "ahi": max(after)}


def _registers() -> dict:
    regs = f.registers(R + "486cebf/ptx.txt")
    fused = f.the_one([n for name, n in regs.items() if name.startswith(("v1", "v2"))], "registers of kernels v1/v2")
    return {"fused": fused, "local": regs["copy_engine local"], "sm_out": regs["copy_engine local sm_out"]}


def _flash_decode() -> dict:
    flash = f.reference_ms(R + "8f58a81/llama3-70b-mixed-tp2-flash-decode.jsonl")
    cudnn = f.reference_ms(R + "29d2e03/llama3-70b-mixed-tp2.jsonl")
    return bounds([flash[k] / cudnn[k] - 1 for k in flash], 100)


def _noise() -> dict:
    rows = f.rows(R + "llama3-70b-tp2-baseline.jsonl")
    cvs = [r["cv"] for r in rows]
    return {"min_time": f.the_one([r["min_time_s"] for r in rows], "min_time_s"),
            "warmup": f.the_one([r["warmup_s"] for r in rows], "warmup_s"),
            **bounds(cvs, 100), "above": sum(cv > 0.02 for cv in cvs), "n": len(cvs)}


def _tests(log: str) -> dict:
    return f.pytest_summary(R + log)


CLAIMS = [
    Claim(H, "Every sweep and `comm` row says the same software: torch {torch}, CUDA {cuda}, NCCL {nccl}, "
             "Triton {triton}, Python {python}, with NVLink multicast off (`NCCL_NVLS_ENABLE={NCCL_NVLS_ENABLE} "
             "TORCH_SYMM_MEM_DISABLE_MULTICAST={TORCH_SYMM_MEM_DISABLE_MULTICAST} "
             "NVSHMEM_DISABLE_NVLS={NVSHMEM_DISABLE_NVLS}`). The runs are of {days} (UTC).", _software),
    Claim(H, "`sweeps/sp-llama3-8b-tp2.yaml` ({n} points each;",
          lambda: {"n": f.the_one([f.row_count(R + f"sp-llama3-{m}-tp2.jsonl") for m in ("70b", "8b")], "SP points")}),
    Claim(H, "`python -m pytest -q tests/test_sequence_parallel_gpu.py` ({passed} passed, micro graph",
          lambda: _tests("test_sequence_parallel_gpu.log")),
    Claim(H, "walls {a:.0f} s and {b:.0f} s; `python kernels/check_paired_runs.py A B` (speedups then",
          lambda: dict(zip("ab", map(float, f.found_in(R + "paired/check-paired.txt", r"^sweep [ab] exit 0 wall (\d+) s$"))))),
    Claim(H, "walls {a:.0f} s and {b:.0f} s; `python kernels/check_paired_runs.py A B --sequential sp-llama3-70b-tp2.jsonl`",
          lambda: _walls(("a034cb8/walls-call1.txt", "sp-a"), ("a034cb8/walls-call2.txt", "sp-b"))),
    Claim(H, "(the first try: widest interval at >= 4K ±{widest:.2f}%), wall {wall:.0f} s",
          lambda: {"widest": 100 * max(_half_widths("dfd9c20/sp-llama3-70b-tp2-tf4.jsonl")),
                   "wall": f.walls(R + "dfd9c20/walls.txt")["sp-a"]}),
    Claim(H, "(`time_factor: 5`, rounds up to 400; walls {a:.0f} s and {b:.0f} s) and once with "
             "`measure.interleave: false` (`-seq.yaml`; wall {seq:.0f} s,",
          lambda: {**_walls(("1017330/walls.txt", "sp-a"), ("1017330/walls.txt", "sp-b")),
                   "seq": f.walls(R + "1017330/walls.txt")["sp-seq"]}),
    Claim(H, "{narrow} of {n} intervals at >= 4K within ±0.5%, the other {out} at ±{lo:.2f}-{hi:.2f}%", _intervals_1017330),
    Claim(H, "back to back in one device call (walls {a:.0f} s and {b:.0f} s)",
          lambda: _walls(("3b4da9f/walls.txt", "a"), ("3b4da9f/walls.txt", "b"))),
    Claim(H, "issue 17's acceptance ({within_1}/{points} points within 1%, {within_05}/{points} within 0.5%, "
             "{narrow}/{intervals} intervals at >= 4K within ±0.5%, picks the same at {same_picks}/{counts} token counts)",
          lambda: f.agreement(R + "3b4da9f/sp-llama3-70b-tp2-a.jsonl", R + "3b4da9f/sp-llama3-70b-tp2-b.jsonl", K4)),
    Claim(H, "the candidate run just after `no_comm` {blo:.1f}-{bhi:.1f}% slow at 1-8K tokens before the ranks were "
             "aligned (a034cb8), {alo:.1f}-{ahi:.1f}% after (3b4da9f)",
          lambda: _round_spread(f.after_candidate, ("no_comm#1", UP_TO_8K))),
    Claim(H, "the median sd of the per-round ratios at 1-8K tokens was {blo:.1f}-{bhi:.1f}% in the a034cb8 runs, "
             "{alo:.1f}-{ahi:.1f}% in the 3b4da9f runs",
          lambda: _round_spread(f.median_round_sd, (UP_TO_8K,))),
    Claim(H, "`df28d53/llama3-8b-tp2.{{jsonl,log}}` (run {run}, {n} points)",
          lambda: _points("df28d53/llama3-8b-tp2.jsonl")),
    Claim(H, "`df28d53/llama3-70b-tp2.{{jsonl,log}}` (run {run}, {n} of 156 points",
          lambda: _points("df28d53/llama3-70b-tp2.jsonl")),
    Claim(H, "tests/test_comm_gpu.py tests/test_sequence_parallel_gpu.py` ({passed} passed)",
          lambda: _tests("df28d53/gpu-tests.log")),
    Claim(H, "`0ea07d9/mixtral-8x7b-tp2.{{jsonl,log}}` (run {run}, {n} points, {wall:.0f} s)",
          lambda: _points("0ea07d9/mixtral-8x7b-tp2.jsonl", ("0ea07d9/walls.txt", "mixtral"))),
    Claim(H, "tests/test_moe_gpu.py` ({passed} passed)", lambda: _tests("0ea07d9/gpu-tests.log")),
    Claim(H, "`29d2e03/llama3-70b-mixed-tp2.{{jsonl,log}}` (run {run}, {n} points, {wall:.0f} s), "
             "`29d2e03/gpu-tests-mixed.log` ({passed} passed)",
          lambda: {**_points("29d2e03/llama3-70b-mixed-tp2.jsonl", ("29d2e03/walls.txt", "mixed")),
                   **_tests("29d2e03/gpu-tests-mixed.log")}),
    Claim(H, "(baselines {lo:.1f}-{hi:.1f}% slower than 29d2e03's)", _flash_decode),
    Claim(H, "tests/test_allreduce_norm_gpu.py` ({pull} passed), the same with "
             "`copy_engine,copy_engine_c1,copy_engine_c3,copy_engine_c8` ({ce} passed)",
          lambda: {"pull": _tests("486cebf/gpu-tests-pull.log")["passed"], "ce": _tests("486cebf/gpu-tests-ce.log")["passed"]}),
    Claim(H, "{fused} registers in kernels v1 and v2, {local} and {sm_out} in the copy-engine path's local kernels", _registers),
    Claim(H, "`python -m pytest -q tests/test_*_gpu.py -rs`: {passed} passed in {seconds:.0f} s",
          lambda: _tests("9f356d8/gpu-tests.log")),
    Claim(H, "(each point timed for at least {min_time:g} s after a {warmup:g} s warm-up) the per-iteration CV is "
             "{lo:.1f}-{hi:.1f}%, above 2% at {above} of {n} points", _noise),
]


test_published_figure_is_what_the_files_give = claims_test(CLAIMS)


# The mechanism itself ---------------------------------------------------------------------


def test_a_changed_figure_fails_and_shows_the_true_passage():
    claim = Claim("doc.md", "agree at {same} of {n} token counts", lambda: {"same": 6, "n": 6})
    assert claim.problem("Two runs\nagree at 6 of 6 token\ncounts.") is None  # markdown wraps lines
    problem = claim.problem("Two runs agree at 5 of 6 token counts.")
    assert "should say 'agree at 6 of 6 token counts'" in problem and "'agree at 5 of 6 token counts" in problem


def test_a_claims_test_fails_a_stale_passage_and_passes_a_true_one(tmp_path, monkeypatch):
    """The test `claims_test` makes: one case per claim, failing with the passage as it should read."""
    monkeypatch.setattr(published, "ROOT", tmp_path)
    (tmp_path / "doc.md").write_text("Two runs agree at 5 of 6\ntoken counts.")
    stale = Claim("doc.md", "agree at {same} of 6 token counts", lambda: {"same": 6})
    true = Claim("doc.md", "agree at {same} of 6 token counts", lambda: {"same": 5})
    test = claims_test([stale, true])
    (cases,) = [m for m in test.pytestmark if m.name == "parametrize"]
    assert cases.args[1] == [stale, true]
    test(true)
    with pytest.raises(pytest.fail.Exception, match="should say 'agree at 6 of 6 token counts'"):
        test(stale)


def test_every_claim_of_a_document_fails_on_a_changed_number():
    """Each figure is tied to the text: 48/48 becoming 47/48 in the README fails its claim."""
    claim = next(c for c in CLAIMS if "acceptance" in c.text)
    doc = (f.ROOT / H).read_text()
    assert claim.problem(doc) is None
    assert claim.problem(doc.replace("48/48 points within 1%", "47/48 points within 1%")) is not None


def test_bounds_are_of_the_values_given():
    assert bounds([1.02, 0.98, 1.0], 100) == {"lo": 98.0, "hi": 102.0}
    with pytest.raises(AssertionError):
        bounds([])

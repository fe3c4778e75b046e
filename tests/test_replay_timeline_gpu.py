"""On 2 GPUs: `sweep --profile` with CUDA graphs on writes, for each point it timed as a graph
replay, that replay's timeline (`<point>.replay.timeline.json`, timing/timeline.py) beside the
eager forward's: device kernels only, GEMMs with the FLOPs and transfers (NCCL, the copy engines'
peer copies) with the bytes their eager twins have (through the link), and a span no longer than
the eager forward's (a replay has no launch gaps); rank 1's beside rank 0's
(`<point>.rank1.replay.timeline.json`), its span overlapping rank 0's on the profiler's clock;
`report --profile` reads them. Both
timing modes: interleaved (the replay is the prepared candidate's) and sequential (the replay is
the one `time_step` timed).

If the profiler records no kernel of a graph replay on this torch (CUPTI's records of a graph's
kernels are what the replay timeline is made of), the test fails saying so, with the versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from overlapbench.tuning.results import profile_name, read_rows
from tests import distributed

pytestmark = distributed.two_gpus()
NOT_WORK = ("nccl:", "cuda", "aten::", "record_param_comms", "ProfilerStep", "Activity Buffer")  # ranges, host calls


def sweep_spec(tmp_path: Path, interleave: bool | str, profile_replays: int = 1) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump({
        "name": "replay-timeline", "model": "llama3-8b", "tp": 2, "layers": 2, "dtype": "bf16", "tokens": [2048],
        "strategies": {"baseline": {}, "no_comm": {}, "token_split": [
            {"comm": "none"}, {"comm": "copy_engine", "comm_ctas_attn": 32, "comm_ctas_mlp": 32}]},
        "measure": {"warmup": 1, "iters": 3, "graphs": True, "interleave": interleave, "timeout_s": 600,
                    "profile_replays": profile_replays},
    }))
    return path


def versions() -> str:
    import torch

    return f"torch {torch.__version__}, CUDA {torch.version.cuda}"


def carries_known_bytes(kernel) -> bool:
    """NCCL's kernels (their bytes from the `nccl:` range their launcher opens) and the copy
    engines' peer copies (from the profiler's own record). Not the symmetric-memory barriers,
    which move no payload, nor our Triton transfer kernels, whose launches record no shapes, in
    the eager forward either (the gemm/comm comparison above holds the replay to the eager's)."""
    return kernel.is_transfer and kernel.name.startswith(("nccl", "Memcpy PtoP"))


def span(data: dict) -> float:
    kernels = data["kernels"]
    return max(k["start"] + k["dur"] for k in kernels) - min(k["start"] for k in kernels)


@pytest.mark.parametrize("interleave", ["auto", False], ids=["interleaved", "sequential"])
def test_each_point_timed_as_a_replay_has_a_linked_replay_timeline(tmp_path: Path, interleave):
    from overlapbench.report import exposed, ranks
    from overlapbench.timing import timeline

    out, folder = tmp_path / "rows.jsonl", tmp_path / "profile"
    done = distributed.overlapbench("sweep", str(sweep_spec(tmp_path, interleave)), "--nproc", "2", "--output", str(out),
                                    "--profile", str(folder), timeout=600, cwd=tmp_path)  # 2 of however many GPUs
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_rows(out)
    assert rows and all(r["status"] == "ok" for r in rows), [(r["strategy"], r["status"], r["error"]) for r in rows]
    replayed = []
    for r in rows:
        point = profile_name(r["strategy"], r["tokens"], r["knobs"], layers=r["layers"])
        table = folder / f"{point}.txt"
        assert r.get("profile_error") is None, (point, r["profile_error"])  # the row kept its timing; its profile failed
        assert table.is_file(), (point, "every row is profiled, the interleaved mode's reference too")
        replay_path = timeline.beside(table, replay=True)
        assert replay_path.is_file() == bool(r["graphs"]), (point, r["graphs"], r["graph_error"])
        if r["graphs"]:
            replayed.append((point, table, replay_path))
    assert replayed, "no point was timed as a graph replay and profiled"
    for point, table, replay_path in replayed:
        data = json.loads(replay_path.read_text())
        eager = json.loads(timeline.beside(table).read_text())
        if not data["kernels"]:
            pytest.fail(f"{point}: the profiler recorded no kernel of a CUDA-graph replay ({versions()}; "
                        f"{data['host_ops']} host ops): CUPTI gives no graph kernels here, so no replay timeline")
        assert data["replay"] is True and data["schema"] == timeline.SCHEMA and data["device"] == "cuda"
        names = data["names"]
        assert not [n for n in names if n.startswith(NOT_WORK)], (point, names)
        assert all(k["dur"] >= 0 for k in data["kernels"])
        replay_kernels, eager_kernels = exposed.read(replay_path).kernels, exposed.read(timeline.beside(table)).kernels
        unlinked = data["unmatched"]
        for kind, what in (("gemm", "flops"), ("comm", "bytes")):  # as the eager forward's, through the link
            got = sorted((k.name, getattr(k, what) or 0) for k in replay_kernels if k.kind == kind)
            want = sorted((k.name, getattr(k, what) or 0) for k in eager_kernels if k.kind == kind)
            assert got == want, (point, kind, what, unlinked)
        assert any(k.flops for k in replay_kernels if k.kind == "gemm"), (point, "no GEMM with its FLOPs", names)
        assert [k.name for k in replay_kernels if carries_known_bytes(k) and k.bytes is None] == [], (point, unlinked)
        if point.startswith("baseline"):
            assert any(k.is_transfer for k in replay_kernels), (point, "no transfer", names)
        assert span(data) <= span(eager), (point, span(data), span(eager))
        print(f"{point}: replay {span(data):.1f} us, eager {span(eager):.1f} us; {data['linked']} of "
              f"{len(data['kernels'])} kernels linked; unmatched {data['unmatched']}")
        assert (data["rank"], data["world"]) == (0, 2) and data["origin_ns"] is not None
        other = json.loads(timeline.beside(table, replay=True, rank=1).read_text())  # rank 1's, beside rank 0's
        assert (other["rank"], other["world"], other["replay"]) == (1, 2, True) and other["kernels"], point
        if any(k.is_transfer for k in replay_kernels):
            # the same replay on both ranks, its transfers joining them: their spans overlap on the profiler's
            # clock (a point with no transfer, `no_comm` or `comm: none`, lets each rank run on by itself)
            ends = [t["origin_ns"] / 1e3 + span(t) for t in (data, other)]
            assert min(ends) > max(data["origin_ns"], other["origin_ns"]) / 1e3, (point, data["origin_ns"], other["origin_ns"])
        across = ranks.across([exposed.read(replay_path), exposed.read(timeline.beside(table, replay=True, rank=1))])
        print(f"{point}: rank 1 starts {across.totals[1].shift:+.1f} us; {across.matched} barriers matched, "
              f"{across.impossible} impossible (clocks off by >= {across.disagreement:.1f} us); {across.unmatched}")
    shown = distributed.overlapbench("report", str(out), "--profile", str(folder), env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    for point, _, _ in replayed:
        assert f"{point} (graph replay): wall" in shown.stdout, shown.stdout[-3000:]
    assert "across ranks (2 ranks' graph replays on one clock" in shown.stdout, shown.stdout[-3000:]


def test_profile_replays_records_that_many_replays_back_to_back_each_linked(tmp_path: Path):
    """`measure.profile_replays: 3`: each replay timeline holds 3 replays, one after the other:
    every GEMM and transfer of the eager forward three times, with its FLOPs and bytes, and the
    report names the count."""
    from collections import Counter

    from overlapbench.report import exposed
    from overlapbench.timing import timeline

    out, folder = tmp_path / "rows.jsonl", tmp_path / "profile"
    done = distributed.overlapbench("sweep", str(sweep_spec(tmp_path, "auto", profile_replays=3)), "--nproc", "2",
                                    "--output", str(out), "--profile", str(folder), timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in read_rows(out) if r["graphs"]]
    assert rows and all(r.get("profile_error") is None for r in rows), [r.get("profile_error") for r in rows]
    for r in rows:
        table = folder / f"{profile_name(r['strategy'], r['tokens'], r['knobs'], layers=r['layers'])}.txt"
        for rank in (0, 1):
            path = timeline.beside(table, replay=True, rank=rank)
            assert json.loads(path.read_text())["replays"] == 3, path
            replay, eager = exposed.read(path), exposed.read(timeline.beside(table, rank=rank))
            for kind, what in (("gemm", "flops"), ("comm", "bytes")):
                got = Counter((k.name, getattr(k, what) or 0) for k in replay.kernels if k.kind == kind)
                want = Counter((k.name, getattr(k, what) or 0) for k in eager.kernels if k.kind == kind)
                assert got == Counter({key: 3 * n for key, n in want.items()}), (path.name, kind)
    shown = distributed.overlapbench("report", str(out), "--profile", str(folder), env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    assert "(3 graph replays): wall" in shown.stdout, shown.stdout[-3000:]

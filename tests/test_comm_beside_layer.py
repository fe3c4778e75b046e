"""`comm --beside-layer MODEL`: its options, cases, rows and arithmetic on CPU (the timing itself
needs CUDA GPUs: it refuses on CPU in one line), and the layer stream it times, run eagerly on CPU."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rich.console import Console

from overlapbench.comm import command, output, paths
from overlapbench.comm.beside_layer import BesideStreams, LayerStream
from overlapbench.comm.cases import DEFAULT_LAYER_TOKENS, BesideLayer
from overlapbench.comm.contention import GemmStream, compute_loss
from overlapbench.comm.in_layer import FIELDS as IN_LAYER_FIELDS
from overlapbench.comm.in_layer import SPAN_MS, InLayer
from overlapbench.comm.pair import FIELDS as PAIR_FIELDS
from overlapbench.comm.pair import Pairs
from overlapbench.comm.paired_loss import LAYER, PairedLoss, one_call_fields, paired_fields
from overlapbench.comm.run import BESIDE_LAYER_FIELDS, RunInfo, make_row
from overlapbench.errors import UserError
from overlapbench.model.layer import attention_partial, mlp_partial
from overlapbench.model.models import PRESETS
from overlapbench.tuning.results import ResultStore, read_rows
from tests.fake_time import FakeTime

ROOT = Path(__file__).parents[1]


def parse(**given) -> command.Plan:
    options = dict(min_bytes=None, max_bytes=None, factor=2, ops=None, paths=None, dtype="auto", nccl_max_ctas="default,16",
                   comm_ctas="16,32", hidden=None, iters=10, warmup=3, graphs=True, fmt="csv", output=None,
                   resume=False, nproc=None)
    return command.Plan.parse(**(options | given))


def test_the_sizes_are_the_reductions_of_the_tokens_rows_and_forward_to_the_ranks():
    rng = random.Random()
    model = rng.choice(["llama3-8b", "llama3-70b", "qwen3-32b"])
    tokens = sorted(rng.sample(range(1, 40000), 4))
    opts = parse(beside_layer=model, tokens=",".join(map(str, reversed(tokens))), layer_tp=rng.choice([None, 2, 4]))
    hidden = PRESETS[model].hidden
    assert opts.ops == ("all_reduce",) and opts.hidden == hidden
    assert opts.sizes(cuda=True) == opts.sizes(cuda=False) == tuple(n * hidden * 2 for n in tokens)
    again = command.Plan.parse(**_back(opts.argv(cuda=True, output=Path("o.jsonl"))))
    assert again.beside_layer == model and again.tokens == opts.tokens and again.layer_tp == opts.layer_tp
    assert again.sizes(cuda=True) == opts.sizes(cuda=True)
    assert parse(beside_layer=model).tokens == DEFAULT_LAYER_TOKENS
    layer = opts.layer(world=4)
    assert layer == BesideLayer(model, opts.layer_tp or 4, hidden)
    assert (layer.settle_ms, layer.span_ms) == (0.0, SPAN_MS)  # the rounds' graphs share a clock unless told
    assert [layer.rows(b, "bf16") for b in opts.sizes(cuda=True)] == tokens


def test_the_windows_settling_and_span_forward_to_the_ranks_and_the_layer():
    rng = random.Random()
    settle, span = rng.choice([0.0, rng.uniform(1, 1000)]), rng.uniform(1, 3000)
    opts = parse(beside_layer="llama3-8b", settle_ms=settle, span_ms=span)
    again = command.Plan.parse(**_back(opts.argv(cuda=True, output=Path("o.jsonl"))))
    assert (again.settle_ms, again.span_ms) == (settle, span)
    assert (again.layer(world=2).settle_ms, again.layer(world=2).span_ms) == (settle, span)
    assert again.layer(world=2).label() == f"llama3-8b tp=2 settle_ms={settle:g} span_ms={span:g}"
    assert parse(beside_layer="llama3-8b").layer(world=2).label() == "llama3-8b tp=2"  # keys of earlier rows


def _back(argv: list[str]) -> dict:
    """The options a rank's `comm` parses from `argv` (as typer would hand them over)."""
    flags: dict = {}
    i = 1
    while i < len(argv):
        if argv[i] in ("--graphs", "--no-graphs", "--resume", "--beside-gemm"):
            flags[argv[i]] = True
            i += 1
        else:
            flags[argv[i]] = argv[i + 1]
            i += 2
    return dict(min_bytes=flags.get("-b"), max_bytes=flags.get("-e"), factor=int(flags.get("-f", 2)), ops=flags["--ops"],
                paths=flags["--paths"], dtype=flags["--dtype"], nccl_max_ctas=flags["--nccl-max-ctas"],
                comm_ctas=flags["--comm-ctas"], hidden=int(flags["--hidden"]), iters=int(flags["--iters"]),
                warmup=int(flags["--warmup"]), graphs="--graphs" in flags, fmt=flags["--format"],
                output=Path(flags["--output"]), resume="--resume" in flags, nproc=None,
                beside_gemm="--beside-gemm" in flags, ce_chunks=flags["--ce-chunks"],
                beside_layer=flags.get("--beside-layer"), tokens=flags.get("--tokens"),
                layer_tp=int(flags["--tp"]) if "--tp" in flags else None,
                settle_ms=float(flags["--settle-ms"]) if "--settle-ms" in flags else None,
                span_ms=float(flags["--span-ms"]) if "--span-ms" in flags else None)


@pytest.mark.parametrize("given, field", [
    (dict(beside_layer="llama3-7b"), "--beside-layer: 'llama3-7b' is not a model preset"),
    (dict(beside_layer="mixtral-8x7b"), "--beside-layer: mixtral-8x7b is a mixture-of-experts model"),
    (dict(beside_layer="llama3-8b", beside_gemm=True), "--beside-gemm: one compute beside the paths"),
    (dict(beside_layer="llama3-8b", ops="all_gather"), "--ops: --beside-layer times the layer's all-reduce only"),
    (dict(beside_layer="llama3-8b", max_bytes="64M"), "-b/-e: with --beside-layer the sizes are"),
    (dict(beside_layer="llama3-8b", dtype="fp32"), "--dtype: --beside-layer runs the layer in bf16"),
    (dict(beside_layer="llama3-8b", hidden=8192), "--hidden: llama3-8b's hidden is 4096, not 8192"),
    (dict(beside_layer="llama3-8b", layer_tp=3), "--tp: 3 does not divide"),
    (dict(beside_layer="llama3-8b", tokens="512,x"), "--tokens: 'x' is not a whole number >= 1"),
    (dict(beside_layer="llama3-8b", tokens="0"), "--tokens: '0' is not a whole number >= 1"),
    (dict(tokens="512"), "--tokens: the layer shard beside the paths; give it with --beside-layer"),
    (dict(layer_tp=2), "--tp: the layer shard beside the paths"),
    (dict(settle_ms=300.0), "--settle-ms: the layer shard beside the paths"),
    (dict(span_ms=200.0), "--span-ms: the layer shard beside the paths"),
    (dict(beside_layer="llama3-8b", settle_ms=-1.0), "--settle-ms: must be in [0, 60000]"),
    (dict(beside_layer="llama3-8b", span_ms=0.0), "--span-ms: must be in (0, 60000]"),
    (dict(beside_layer="llama3-8b", span_ms=float("nan")), "--span-ms: must be in (0, 60000]"),
])
def test_bad_beside_layer_options_are_one_line(given, field):
    with pytest.raises(UserError) as e:
        parse(**given)
    assert str(e.value).startswith(field) and "\n" not in str(e.value), str(e.value)


def test_a_tp_that_does_not_divide_the_world_default_is_refused_before_launch():
    opts = parse(beside_layer="llama3-70b")
    with pytest.raises(UserError, match="^--tp: 3 does not divide shape.heads=64"):
        opts.layer(world=3)


def test_on_a_machine_without_gpus_it_refuses_in_one_line(tmp_path):
    out = tmp_path / "c.jsonl"
    done = subprocess.run([sys.executable, "-m", "overlapbench", "comm", "--beside-layer", "llama3-8b", "--tokens", "512",
                           "-o", str(out)], capture_output=True, text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT),
                           "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--beside-layer: times each path beside the layer's bf16 kernels on CUDA GPUs" in lines[0]
    assert not out.exists()


def test_cases_carry_the_layer_in_their_keys_and_skip_on_gloo():
    opts = parse(beside_layer="llama3-8b", tokens="512,1024", paths="nccl,fused_norm")
    layer = opts.layer(world=2)
    cases = paths.make_cases(opts.bench(cuda=True), world=2, backend="gloo", dtype="bf16", hidden=opts.hidden,
                             beside_layer=layer)
    plain = paths.make_cases(opts.bench(cuda=True), world=2, backend="gloo", dtype="bf16", hidden=opts.hidden)
    assert cases and all(json.loads(c.key())["beside_layer"] == "llama3-8b tp=2" for c in cases)
    assert all("beside_layer" not in json.loads(c.key()) for c in plain), "the keys of plain runs do not name beside_layer"
    assert all(c.skip for c in cases) and any("--beside-layer needs CUDA GPUs" in c.skip for c in cases)
    assert sorted({layer.rows(c.nbytes, c.dtype) for c in cases}) == [512, 1024]


def _pairs(rng: random.Random, rounds: int, passes: list[float], op: float) -> Pairs:
    """Each round's attention and MLP pairs (shares of its pass), with one call of `op` ms and with the add + norm, and
    the call alone."""
    attention = [p * rng.uniform(0.2, 0.4) for p in passes]
    mlp = [p - a for p, a in zip(passes, attention)]
    return Pairs(*(tuple(x) for x in (
        [a + rng.uniform(0, op) for a in attention], attention, [m + rng.uniform(0, op) for m in mlp], mlp,
        [op * rng.uniform(1, 1.2) for _ in range(rounds)])), replays=rng.randrange(1, 20), graphs=True)


def _layer_row(rng: random.Random, tokens: int) -> tuple[dict, dict]:
    layer = BesideLayer("llama3-8b", 2, 4096)
    case = paths.make_cases(parse(beside_layer="llama3-8b", tokens=str(tokens), paths="nccl_symm").bench(cuda=True),
                            world=2, backend="nccl", dtype="bf16", hidden=4096, beside_layer=layer)[0]
    alone, beside, op = rng.uniform(0.5, 5), rng.uniform(5, 9), rng.uniform(0.05, 0.4)
    rounds = rng.randrange(3, 15)
    passes = [alone * rng.uniform(0.95, 1.05) for _ in range(rounds)]
    ops = [2 * op * rng.uniform(0.95, 1.05) for _ in range(rounds)]
    in_layer = InLayer(tuple(p + o + rng.uniform(-0.01, 0.1) for p, o in zip(passes, ops)), tuple(passes), tuple(ops),
                       replays=rng.randrange(1, 20), graphs=True)
    result = {"status": "ok", "error": None, "ms": op, "p10_ms": op, "p90_ms": op, "iqr_ms": 0.0, "cv": 0.01, "wrong": 0,
              "algbw": 1.0, "busbw": 1.0, "graphs": True, "beside_ms": op * 1.3, "beside_busbw": 0.8,
              "compute_ms_alone": alone, "compute_ms_beside": beside, "compute_loss": compute_loss(alone, beside),
              "compute_graphs": True,
              **PairedLoss(tuple(passes), tuple(p / (1 - rng.uniform(0, 0.3)) for p in passes),
                           tuple(p + rng.uniform(0, 0.2) for p in passes),
                           tuple(op * rng.uniform(1, 3) for _ in passes)).fields(LAYER),
              **in_layer.fields(), **_pairs(rng, rounds, passes, op).fields(),
              "beside_layer": {"model": "llama3-8b", "tp": 2, "tokens": tokens}}
    env = {"world_size": 2, "device": "Test GPU", "hosts": ["h"], "nodes": 1, "ranks": [], "gpus_per_host": 2,
           "backend": "nccl", "versions": {}, "git": "abc", "multicast_env": {}}
    return make_row(case, result, RunInfo("comm", "r1", env, 3, 10, True)), result


def test_a_beside_layer_row_holds_its_fields_and_reads_back(tmp_path):
    rng = random.Random()
    row, result = _layer_row(rng, rng.choice([512, 2048]))
    assert row["beside_layer"] == result["beside_layer"] and "beside_gemm" not in row
    assert (set(IN_LAYER_FIELDS) | set(paired_fields(LAYER)) | set(one_call_fields(LAYER)) | set(PAIR_FIELDS)
            <= set(BESIDE_LAYER_FIELDS))
    assert all(row[k] == result[k] for k in BESIDE_LAYER_FIELDS)
    assert "inline_extra_ms" not in row and "inline_ms" not in row  # the measurement before: not written
    store = ResultStore(tmp_path / "c.jsonl")
    store.open(resume=False, study="comm")
    store.append(row)
    store.close()
    back = read_rows(tmp_path / "c.jsonl")[0]
    assert back["compute_loss"] == row["compute_loss"]
    assert back["compute_loss_paired"] == pytest.approx(row["compute_loss_paired"])
    assert all(back[k] == pytest.approx(row[k]) for k in IN_LAYER_FIELDS if row[k] is not None)
    record = output.record(row)
    assert record["layer_tokens"] == row["beside_layer"]["tokens"] and record["compute_loss"] == pytest.approx(
        row["compute_loss"], rel=1e-3)
    assert record["in_layer_extra_us"] == pytest.approx(row["in_layer_extra_ms"] * 1e3, abs=1e-3)
    console = Console(width=250, record=True)
    console.print(output.to_table([row]))
    text = console.export_text()
    assert "beside layer (us)" in text and "compute loss" in text and f"{row['compute_loss']:.1%}" in text
    assert f"{row['in_layer_extra_ms'] * 1e3:+.1f}" in text
    line = str(output.summary_line(row))
    lo, hi = row["in_layer_extra_ci_ms"]
    assert f"compute loss {row['compute_loss']:.1%}" in line
    assert f"in line {row['in_layer_extra_ms'] * 1e3:+.1f} us [{lo * 1e3:+.1f}, {hi * 1e3:+.1f}]" in line
    assert (f"pair {row['pair_attention_extra_ms'] * 1e3:+.1f} us attention, {row['pair_mlp_extra_ms'] * 1e3:+.1f} us MLP"
            in line)


def test_the_arithmetic_of_the_contention():
    rng = random.Random()
    alone = rng.uniform(1, 10)
    beside = alone * rng.uniform(1.0, 2.0)
    assert compute_loss(alone, beside) == pytest.approx(1 - alone / beside) and compute_loss(alone, alone) == 0
    gemms = GemmStream.make("cpu", [(4, 8, 16)])
    gemms.alone_ms = alone
    fields = gemms.fields(beside)  # the beside-GEMM rows' loss is the same number, from TFLOP/s
    assert fields["gemm_loss"] == pytest.approx(1 - fields["gemm_tflops_beside"] / fields["gemm_tflops_alone"])
    assert fields["gemm_loss"] == pytest.approx(compute_loss(alone, beside))


def test_the_layer_stream_runs_the_shards_attention_then_mlp():
    """On CPU (eager, fp32): one pass is the shard's attention then MLP of `tokens` rows; each
    rank's shard differs; the streams of one run share one stack."""
    shape, tokens = PRESETS["tiny"], random.Random().randrange(5, 40)
    streams = BesideStreams()
    rt = SimpleNamespace(rank=1, device=torch.device("cpu"))
    layer = BesideLayer("tiny", 2, shape.hidden)
    case = SimpleNamespace(beside_layer=layer, nbytes=tokens * shape.hidden * 4, dtype="fp32")
    stream = streams.layer_for(rt, case)
    assert streams.layer_for(rt, case) is stream and stream.tokens == tokens
    other = streams.layer_for(rt, SimpleNamespace(beside_layer=layer, nbytes=(tokens + 3) * shape.hidden * 4, dtype="fp32"))
    assert other.stack is stream.stack and other.tokens == tokens + 3
    stream.run(2)
    got = stream.out.clone()
    expected = torch.empty_like(got)
    attention_partial(stream.stack, 0, stream.normed, stream.chunk, stream.rope, None, expected)
    mlp_partial(stream.stack, 0, stream.normed, expected)
    torch.testing.assert_close(got, expected)
    assert torch.isfinite(got).all() and got.abs().sum() > 0
    rank0 = LayerStream(shape, 2, 0, tokens, torch.float32, "cpu")
    rank0.run()
    assert not torch.allclose(rank0.out, got)
    stream.alone_ms = random.uniform(0.5, 2)
    assert stream.fields(2.5) == {"compute_ms_alone": stream.alone_ms, "compute_ms_beside": 2.5,
                                  "compute_loss": pytest.approx(1 - stream.alone_ms / 2.5), "compute_graphs": False}


@pytest.mark.parametrize("settled", [False, True])
def test_the_in_layer_rounds_run_the_three_graphs_eagerly_on_cpu(monkeypatch, settled):
    """The in-layer term's wiring, on CPU: no graphs (all three eager), one rank. Attention, MLP and
    the all-reduce stand in as pieces of known lengths that move a clock of their own (fake_time), which the
    timing reads for the host's time too (bench's perf_counter: warm_up and the wall clock's marks),
    so every time is exact whatever else the machine runs: the in-line pass runs the all-reduce
    twice, the two all-reduces alone twice, the pass never, each as often per round; the term is 0
    (the in-line pass is the pass and its two all-reduces), not +-d/2 (one missed or doubled).
    Settled (`comm --settle-ms`), each graph is warmed up too and runs untimed before its span,
    as often as the settling fills with its own replays, and the term is the same."""
    from overlapbench.comm.in_layer import MIN_ROUNDS, SPAN_MS, TERM
    from overlapbench.timing import bench, interleave

    rng = random.Random()
    attention_ms, mlp_ms, wait_ms = rng.uniform(1, 3), rng.uniform(1, 3), rng.uniform(4, 6)
    clock, calls = FakeTime(monkeypatch, start_s=rng.uniform(0, 1e3)), []
    monkeypatch.setattr(bench, "CudaClock", bench.WallClock)
    stream = LayerStream(PRESETS["tiny"], 2, 0, rng.randrange(16, 64), torch.float32, "cpu")
    stream.attention, stream.mlp = clock.piece(attention_ms), clock.piece(mlp_ms)
    rt = SimpleNamespace(world_size=1, rank=0, device=torch.device("cpu"))
    all_reduce = clock.piece(wait_ms, then=lambda: calls.append(1))
    span_ms, settle_ms = (rng.uniform(10, 40), rng.uniform(20, 60)) if settled else (SPAN_MS, 0.0)
    fields = stream.in_layer(rt, all_reduce, iters=rng.randrange(1, MIN_ROUNDS), span_ms=span_ms, settle_ms=settle_ms).fields()
    assert not fields["in_layer_graphs"] and fields["in_layer_rounds"] == MIN_ROUNDS
    assert fields[TERM] == pytest.approx(0, abs=1e-6), fields
    assert fields["in_layer_pass_ms"] == pytest.approx(attention_ms + mlp_ms)
    assert fields["in_layer_ops_ms"] == pytest.approx(2 * wait_ms)
    assert fields["in_layer_inline_ms"] == pytest.approx(attention_ms + mlp_ms + 2 * wait_ms)
    replays, per_replay = fields["in_layer_replays"], attention_ms + mlp_ms + 2 * wait_ms
    assert replays == interleave.repetitions(span_ms, per_replay)
    # per round, 2 all-reduces per replay of the in-line pass and of the all-reduces alone, each
    # graph settled for its own replays first; before the rounds, bench.warm_up's 2 replays of each
    # graph timed (the in-line pass; settled, the all-reduces alone too)
    inline_runs = replays + interleave.settling(settle_ms, per_replay)
    ops_runs = replays + interleave.settling(settle_ms, 2 * wait_ms)
    warm = 2 * 2 * (2 if settled else 1)
    per_round = 2 * (inline_runs + ops_runs)
    assert (len(calls) - warm) % per_round == 0 and (len(calls) - warm) // per_round >= MIN_ROUNDS

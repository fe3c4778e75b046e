"""Every figure docs/results-tp4.md publishes about the TP=4 runs on 4x H200 (their tables, the
long prompts, the profiles and every rank's replay), and the TP=4 replay's figures docs/predict.md
cites, computed again from the committed files they cite (the mechanism: tests/published.py; the
computations: tests/figures.py). A figure changed in the text, or rows that no longer give it,
fails with the passage as it should read."""

from __future__ import annotations

import functools
import statistics

from overlapbench.comm import paired_loss
from overlapbench.report.profile import tally
from overlapbench.tuning import tune
from tests import figures as f
from tests.published import Claim, bounds, claims_test

TP4_DOC = "docs/results-tp4.md"
LONG_TP4 = "results/h200x4/d273c63/long-llama3-70b-tp4.jsonl"


def _fastest_row(tokens: int) -> dict:
    return {"a": f.fastest_by_tokens(*f.TP4_STUDIES["llama3-70b"])[tokens],
            "b": f.fastest_by_tokens(*f.TP4_STUDIES["llama3-8b"])[tokens]}


def _busbw(store: str, op: str, strategy: str, ctas, size: int) -> float:
    (row,) = [r for r in f.rows(f.TP4 + store) if r["op"] == op and r["strategy"] == strategy
              and str(r["knobs"].get("ctas")) == str(ctas) and r["bytes"] == size]
    return row["busbw"]


def _tp4_comm() -> dict:
    paths = {"n": ("nccl", "default"), "s": ("nccl_symm", 16), "t": ("symm_two_shot", None), "o": ("symm_one_shot", None),
             "f": ("fused_norm", 32), "c": ("copy_engine_norm", 32)}
    out = {k + size: _busbw("comm.jsonl", "all_reduce", path, ctas, n) for k, (path, ctas) in paths.items()
           for size, n in (("64", 64 << 20), ("1g", 1 << 30))}
    sp = {"ag_n": ("all_gather", "nccl", "default"), "ag_s": ("all_gather", "nccl_symm", 16),
          "ag_c": ("all_gather", "copy_engine", None),
          "rs_n": ("reduce_scatter", "nccl", "default"), "rs_s": ("reduce_scatter", "nccl_symm", 16)}
    return out | {k: _busbw("comm-sp.jsonl", op, path, ctas, 64 << 20) for k, (op, path, ctas) in sp.items()}


def _over_free() -> dict:
    over = lambda stores: bounds(v["over_free"] for v in f.fastest_by_tokens(*stores).values())
    return {"a": over(f.TP4_STUDIES["llama3-70b"]), "b": over(f.TP4_STUDIES["llama3-8b"])}


PROFILES_TP4 = "results/h200x4/8203cf7/"
PROFILES_TP4_H100 = "results/h100x4/414380b/"  # the same specs on 4x H100
SPLIT = "token_split-{tokens}-align=256-split_offset=0-comm="


def _profiled(name: str, tokens: int, run: str = PROFILES_TP4) -> dict:
    """A TP=4 profile's points in the folder `run`: kernel GPU ms per layer by kind (tally), and
    each row's timed ms."""
    folder = f.path(run + name)
    rows = f.rows(run + name + ".jsonl")
    layers = f.the_one([r["layers"] for r in rows], "layers")
    timed = {r["strategy"] + ("" if r["strategy"] != "token_split" else "=" + r["knobs"]["comm"]): r["ms"] for r in rows}
    split = SPLIT.format(tokens=tokens)
    points = {"no_comm": f"no_comm-{tokens}", "none": f"{split}none",
              "fused": f"{split}fused-comm_ctas_attn=16-comm_ctas_mlp=16",
              "copy_engine": f"{split}copy_engine-comm_ctas_attn=32-comm_ctas_mlp=32",
              "nccl_symm": f"{split}nccl_symm-comm_ctas_attn=16-comm_ctas_mlp=16"}
    # a kernel table's name: the point's, with the stack's depth where the run's code writes it
    tables = {k: [folder / f"{v}.txt", folder / f"{v}-{layers}layers.txt"] for k, v in points.items()}
    kernels = {k: tally(table, layers) for k, found in tables.items() for table in found if table.is_file()}
    return {"kernels": kernels, "timed": timed}


def _where_the_rest_goes(run: str = PROFILES_TP4) -> dict:
    """The TP=4 profiles of one run (70B at 32K, 8B at 2K): what the split, its transfers and
    `flash_agrs` cost against `no_comm`, from the timed rows and the kernel tables."""
    big, small = _profiled("profile-70b-tp4", 32768, run), _profiled("profile-8b-tp4", 2048, run)
    bk, bt = big["kernels"], big["timed"]
    sk, st = small["kernels"], small["timed"]
    return {"split70": bt["token_split=none"] - bt["no_comm"], "base70": bt["baseline"] - bt["no_comm"],
            "fused70": bt["token_split=fused"] - bt["token_split=none"],
            "gemm_fused": bk["fused"]["gemm"] - bk["none"]["gemm"],
            "att_fused": bk["fused"]["attention"] - bk["none"]["attention"],
            "ce70": bt["token_split=copy_engine"] - bt["token_split=none"],
            "gemm_ce": bk["copy_engine"]["gemm"] - bk["none"]["gemm"], "norm_ce": bk["copy_engine"]["norm"] - bk["none"]["norm"],
            "fa70": bt["flash_agrs"] - bt["no_comm"],
            "split8": st["token_split=none"] / st["no_comm"], "gemm8": (sk["none"]["gemm"] / sk["no_comm"]["gemm"] - 1) * 100,
            "cap8": (st["baseline"] - st["token_split=none"]) / (st["baseline"] - st["no_comm"]) * 100,
            "best8": (st["baseline"] - st["token_split=nccl_symm"]) / (st["baseline"] - st["no_comm"]) * 100}


LONG_TP4_H100 = {m: f"results/h100x4/b71640f/long-{m}-tp4.jsonl" for m in ("llama3-70b", "llama3-8b")}  # 4x H100
LONG_TP4_AGAIN = {"llama3-70b": "results/h200x4/9ba11d6/long-llama3-70b-tp4.jsonl",
                  "llama3-8b": "results/h200x4/9ba11d6/long-llama3-8b-tp4.jsonl"}
PULL_TP4 = "results/h200x4/9ba11d6/copy-engine-pull-llama3-70b-tp4.jsonl"
REPLAYS_TP4 = "results/h200x4/9ba11d6/profile-70b-tp4/"


def _speedups(store: str, strategy: str, keep) -> list[float]:
    """The speedups of one setting (`keep(knobs)`) at the long sizes, in token order."""
    rows = sorted((r for r in f.rows(store) if r["strategy"] == strategy and keep(r["knobs"])), key=lambda r: r["tokens"])
    return [r["speedup"] for r in rows]


def _flash_agrs_again() -> dict:
    one = lambda knobs: knobs["chunks_per_rank"] == 1
    long, again = _speedups(LONG_TP4_AGAIN["llama3-70b"], "flash_agrs", one), _speedups(PULL_TP4, "flash_agrs", one)
    moving = lambda knobs: knobs["comm"] != "none"
    split = [max(r["speedup"] for r in f.rows(LONG_TP4_AGAIN["llama3-70b"]) if r["strategy"] == "token_split"
                 and moving(r["knobs"]) and r["tokens"] == t) for t in (16384, 32768, 65536)]
    return {"s": split, "a": again, "l": long, "apart": max(abs(x - y) for x, y in zip(long, again))}


def _replay(pattern: str):
    """The exposure of the one replay timeline at 32K whose file name matches `pattern`."""
    from overlapbench.report import exposed
    from overlapbench.timing import timeline

    (path,) = [p for p in f.path(REPLAYS_TP4).glob(timeline.file_name(pattern.format(tokens=32768), replay=True))
               if timeline.RANK_TAG not in p.name]  # rank 0's
    return exposed.analyze(exposed.read(path).kernels)


REPLAY_POINTS = {"no_comm": "no_comm-{tokens}-*", "baseline": "baseline-{tokens}-*",
                 "fused": SPLIT + "fused-*", "copy_engine": SPLIT + "copy_engine-*", "none": SPLIT + "none-*",
                 "flash_agrs": "flash_agrs-{tokens}-*"}


def _replay_row(name: str) -> dict:
    free, point = _replay(REPLAY_POINTS["no_comm"]), _replay(REPLAY_POINTS[name])
    barrier = sum(i.exposed for i in point.intervals if "barrier" in i.transfer.name)
    return {"wall": (point.wall - free.wall) / 1e3, "compute": (point.compute - free.compute) / 1e3,
            "exposed": point.exposed / 1e3, "barrier": barrier / 1e3, "idle": (point.idle - free.idle) / 1e3}


REPLAY_ROW = "| {label} | {{wall:+.2f}} | {{compute:+.2f}} | {{exposed:.2f}} | {{barrier:.2f}} | {{idle:+.2f}} |"
REPLAY_LABELS = {"baseline": "baseline", "fused": "`token_split` fused, 16/16 CTAs",
                 "copy_engine": "`token_split` copy_engine, 32/32 CTAs",
                 "flash_agrs": "`flash_agrs` copy_engine, 2 chunks/rank", "none": "`token_split` comm=none"}


def _replay_caveat() -> dict:
    rows = {r["strategy"]: r["ms"] for r in f.rows("results/h200x4/9ba11d6/profile-70b-tp4.jsonl")
            if r["strategy"] in ("no_comm", "flash_agrs")}
    free = _replay(REPLAY_POINTS["no_comm"])
    return {"replay": free.wall / 1e3, "timed4": 4 * rows["no_comm"], "free": rows["no_comm"], "fa": rows["flash_agrs"],
            "behind": (rows["flash_agrs"] / rows["no_comm"] - 1) * 100}



AGAIN_ROW = ("| {tokens} | {{a[speedup]:.3f}}x, {{a[hidden]:.0f}}% | {{b[speedup]:.3f}}x, {{b[hidden]:.0f}}% | "
             "{{c[speedup]:.3f}}x, {{c[hidden]:.0f}}% | {{d[speedup]:.3f}}x, {{d[hidden]:.0f}}% |")


def _two_runs() -> dict:
    """Each model's fastest choice per token count in the c1821fe and the a3860b5 study."""
    fastest = lambda folder, model: f.fastest_by_tokens(folder + f"{model}-tp4.jsonl")
    return {"a": fastest(f.TP4, "llama3-70b"), "b": fastest(f.AGAIN_TP4, "llama3-70b"),
            "c": fastest(f.TP4, "llama3-8b"), "d": fastest(f.AGAIN_TP4, "llama3-8b")}


def _again_row(tokens: int) -> dict:
    return {k: v[tokens] for k, v in _two_runs().items()}


def _again() -> dict:
    runs = _two_runs()
    apart = lambda x, y: max(abs(runs[x][t]["speedup"] - runs[y][t]["speedup"]) for t in f.TOKENS)
    same = sum(runs[x][t]["strategy"] == runs[y][t]["strategy"] for x, y in (("a", "b"), ("c", "d")) for t in f.TOKENS)
    return {"a": apart("a", "b"), "b": apart("c", "d"), "same": same, "n": 2 * len(f.TOKENS)}




def _shared_moves() -> dict:
    """How far each setting's speedup moved between the two runs, and async_tp's at 32K."""
    out = {}
    for tag, model in (("a", "llama3-70b"), ("b", "llama3-8b")):
        one, two = f.tp4_runs_by_setting(model)
        out[tag] = statistics.median(abs(one[k]["speedup"] - two[k]["speedup"]) for k in one.keys() & two.keys())
        (key,) = [k for k in one if k[0] == "async_tp" and k[1] == 32768]
        out[tag + "1"], out[tag + "2"] = one[key]["speedup"], two[key]["speedup"]
        out[tag + "ms1"], out[tag + "ms2"] = one[key]["ms"], two[key]["ms"]
    return out


def _async_tp_again() -> dict:
    """70B's async_tp in 60ae8af's async-tp-32k-tp4 run: speedup and ms per layer by token count."""
    rows = [r for r in f.rows("results/h200x4/60ae8af/async-tp-32k-tp4.jsonl") if r["strategy"] == "async_tp"]
    return {f"t{r['tokens'] // 1024}": r for r in rows}


def _rank_replays_of(folder, point: str, world: int = 4) -> list:
    """Every rank's replay timeline (rank order) of a profiled point (`point`: its file stem)."""
    from overlapbench.report import exposed
    from overlapbench.timing import timeline

    return [exposed.read(folder / timeline.file_name(point, replay=True, rank=k)) for k in range(world)]


RANK_REPLAYS = f.AGAIN_TP4 + "profile-70b-tp4/"  # a3860b5's every-rank replays (4x H200)
RANK_REPLAYS_H100 = PROFILES_TP4_H100 + "profile-70b-tp4/"  # the same points' on 4x H100


def _rank_replays(name: str, profiles: str = RANK_REPLAYS) -> list:
    """Every rank's replay timeline (rank order) of one profile point at 32K on llama3-70b."""
    from overlapbench.timing import timeline

    folder = f.path(profiles)
    point = REPLAY_POINTS[name].format(tokens=32768)
    (zero,) = [p for p in folder.glob(timeline.file_name(point, replay=True)) if timeline.RANK_TAG not in p.name]
    stem = zero.name.removesuffix(timeline.REPLAY_SUFFIX)
    return _rank_replays_of(folder, stem)


@functools.cache
def _ranks(name: str, profiles: str = RANK_REPLAYS):
    """One point's replays across ranks, read once: every row's figure against `no_comm` reads its."""
    from overlapbench.report import ranks

    return ranks.across(_rank_replays(name, profiles))


def _walls(name: str, profiles: str = RANK_REPLAYS) -> list[float]:
    return [t.wall / 1e3 for t in _ranks(name, profiles).totals]


def _rank_row(name: str, profiles: str = RANK_REPLAYS) -> dict:
    walls = _walls(name, profiles)
    return {"w": walls, "vs": max(walls) - max(_walls("no_comm", profiles))}


def _h100_replays() -> dict:
    """The 4x H100 replays against the 4x H200 ones: each card's spread at no_comm, and
    flash_agrs's and the split alone's slowest rank against no_comm's on each kind."""
    spread = lambda profiles: (max(w := _walls("no_comm", profiles)) / min(w) - 1) * 100
    return {"h": spread(RANK_REPLAYS_H100), "r": spread(RANK_REPLAYS),
            "fa": _rank_row("flash_agrs", RANK_REPLAYS_H100)["vs"], "fa_r": _rank_row("flash_agrs")["vs"],
            "none": -_rank_row("none", RANK_REPLAYS_H100)["vs"], "none_r": -_rank_row("none")["vs"]}


RANK_ROW = "| {label} | {{w[0]:.2f}} | {{w[1]:.2f}} | {{w[2]:.2f}} | {{w[3]:.2f}} | {{vs:+.2f}} |"
RANK_LABELS = {"no_comm": "`no_comm`", **REPLAY_LABELS}
JOINED = ("baseline", "fused", "copy_engine", "flash_agrs")  # the points whose transfers join the ranks


def _slowest_card() -> dict:
    free, split = _walls("no_comm"), _walls("none")
    slow = lambda walls: (max(walls) / walls[0] - 1) * 100
    fa = _ranks("flash_agrs")
    lasts = [w.last for w in fa.waits]
    return {"free": slow(free), "split": slow(split), "slowest": free.index(max(free)),
            "spread": max(max(_walls(n)) - min(_walls(n)) for n in JOINED),
            "barrier": fa.totals[0].barrier / 1e3, "bexp": fa.totals[0].barrier_exposed / 1e3, "n": len(lasts),
            "last": f.the_one([a.rank for a in lasts], "last to arrive"),
            "late": bounds((a.late for a in lasts), 1e-3),
            "before": f.the_one([a.before.kind for a in lasts], "kernel before").upper(),
            "fa": _rank_row("flash_agrs")["vs"], "none": -_rank_row("none")["vs"]}

def _copy_engine_waits() -> dict:
    """The copy-engine split's rank 0 at 32K: its exposed time, and its longest barrier waits' last arrivals."""
    ce = _ranks("copy_engine")
    lasts = [w.last for w in ce.waits]
    return {"exposed": ce.totals[0].exposed / 1e3, "n": len(lasts), "late": bounds((a.late for a in lasts), 1e-3),
            "before": f.the_one([a.before.name.split(" (")[0] for a in lasts], "copy before")}


SMALL_SPLITS = "results/h200x4/60ae8af/profile-70b-tp4-1k-2k"  # llama3-70b TP=4's splits at 1K and 2K


def _replays_apart(run: str, tokens: int) -> float:
    """How far apart (ms) the ranks' graph replays of a profile run's `nccl_symm` 16/16 split started."""
    from overlapbench.report import ranks

    layers = f.the_one([r["layers"] for r in f.rows(run + ".jsonl")], "layers")
    name = f"{SPLIT.format(tokens=tokens)}nccl_symm-comm_ctas_attn=16-comm_ctas_mlp=16-{layers}layers"
    replays = _rank_replays_of(f.path(run), name)
    return max(abs(t.shift) for t in ranks.across(replays).totals) / 1e3


IN_STEP = "results/h200x4/1968c70/profile-70b-tp4-1k-2k"  # the same points, the ranks in step


def _in_step(tokens: int, run: str = IN_STEP, comm: str = "nccl_symm") -> dict:
    """llama3-70b's split on `comm` 16/16 against the split with `comm: none` in a profile run whose
    ranks were in step (default: 1968c70's at TP=4), at one token count: timed ms per layer; per
    rank of the graph replays, the stack's cost per layer (`wall`), the middle layers' (each
    replay's layer 2's first GEMM to its layer 4's, per layer: `mid`) and the GEMMs' extra GPU time
    per layer (`gemm`), ms; how far apart the ranks' replays started (ms, over all points); and the
    all-reduce beside each gate-up GEMM (the layer's largest): where it started into the GEMM (us)
    and how much longer the GEMM ran than its twin in the split with `comm: none` (us), split into
    those that started with the GEMM (within 10 us) and those that started later."""
    from overlapbench.report import exposed, ranks

    rows = [r for r in f.rows(run + ".jsonl") if r["tokens"] == tokens]
    layers, tp = f.the_one([r["layers"] for r in rows], "layers"), f.the_one([r["tp"] for r in rows], "tp")
    shape = f.the_one([r["shape"] for r in rows], "shape")
    timed = {r["knobs"].get("comm", r["strategy"]): r["ms"] for r in rows}
    half = tokens // 2  # the split's two chunks (align 256, no offset)
    qkv = 2 * half * shape["hidden"] * (shape["heads"] + 2 * shape["kv_heads"]) * shape["head_dim"] // tp
    gate_up = 2 * half * shape["hidden"] * 2 * shape["ffn"] // tp
    split = SPLIT.format(tokens=tokens)
    names = {"none": f"{split}none-{layers}layers", "no_comm": f"no_comm-{tokens}-{layers}layers",
             **{k: f"{split}{k}-comm_ctas_attn=16-comm_ctas_mlp=16-{layers}layers" for k in ("nccl_symm", "fused")}}
    folder = f.path(run)
    replays = {k: _rank_replays_of(folder, v, tp) for k, v in names.items()}
    back_to_back = f.the_one([t.replays for v in replays.values() for t in v], "replays")
    gemms = lambda t, flops: sorted((k for k in t.kernels if k.kind == "gemm" and k.flops == flops), key=lambda k: k.start)
    gemm_us = lambda t: sum(k.end - k.start for k in t.kernels if k.kind == "gemm")
    out = {"wall": [], "mid": [], "gemm": [], "with": [], "later": []}
    for symm, none in zip(replays[comm], replays["none"]):
        starts = [[k.start for k in gemms(t, qkv)][::2] for t in (symm, none)]  # each layer's first QKV GEMM
        assert all(len(s) == layers * back_to_back for s in starts), "a layer's QKV GEMMs not found by their FLOPs"
        for r in range(back_to_back):
            first = r * layers
            out["mid"].append(((starts[0][first + 3] - starts[0][first + 1]) - (starts[1][first + 3] - starts[1][first + 1]))
                              / 2 / 1e3)
        stack = layers * back_to_back
        out["wall"].append((exposed.analyze(symm.kernels).wall - exposed.analyze(none.kernels).wall) / stack / 1e3)
        out["gemm"].append((gemm_us(symm) - gemm_us(none)) / stack / 1e3)
        for g, twin in zip(gemms(symm, gate_up), gemms(none, gate_up), strict=True):
            first = min((k for k in symm.kernels if k.is_transfer and k.start < g.end and k.end > g.start), key=lambda k: k.start)
            case = (first.start - g.start, (g.end - g.start) - (twin.end - twin.start))
            out["with" if case[0] <= 10 else "later"].append(case)
    apart = max(abs(t.shift) for v in replays.values() for t in ranks.across(v).totals) / 1e3
    into = lambda cases, i: bounds(c[i] for c in cases) if cases else {"lo": 0, "hi": 0}
    return {"timed": timed[comm] - timed["none"], "fused": timed["fused"] - timed["none"],
            "wall": bounds(out["wall"]), "mid": bounds(out["mid"]), "gemm": bounds(out["gemm"]), "apart": apart,
            "n": len(out["with"]) + len(out["later"]), "n_with": len(out["with"]), "n_later": len(out["later"]),
            "with_at": into(out["with"], 0), "with_len": into(out["with"], 1),
            "later_at": into(out["later"], 0), "later_len": into(out["later"], 1)}


@functools.cache
def _in_steps() -> dict:
    return {"a": _in_step(1024), "b": _in_step(2048), "old": _replays_apart(SMALL_SPLITS, 1024)}


FOUR_REPLAYS = {4: "results/h200x4/f9d2080/profile-70b-tp4-1k-2k", 2: "results/h200x2/f320f41/profile-70b-tp2-1k-2k"}


@functools.cache
def _four_replays(tp: int, comm: str) -> dict:
    """`_in_step` at 1K (`a`) and 2K (`b`) of the profile at `tp` with four replays back to back; and
    how far the transfer started before the GEMM (us) where it started with it, over both sizes (`ahead`)."""
    a, b = (_in_step(t, FOUR_REPLAYS[tp], comm) for t in (1024, 2048))
    return {"a": a, "b": b, "ahead": bounds(-v for x in (a, b) for v in x["with_at"].values())}


def _charge(model: str, commit: str, tokens: int, path: str) -> float:
    """What the beside-layer rows of TP=4's layer charge a transfer on `path` (16 CTAs) beside a
    layer pass of `tokens` rows: the compute's loss x the transfer's stretch."""
    (row,) = [r for r in f.rows(f"results/h200x4/{commit}/comm-beside-layer-{model}.jsonl")
              if r["status"] == "ok" and r["strategy"] == path and str(r["knobs"]["ctas"]) == "16"
              and r["beside_layer"]["tokens"] == tokens]
    return paired_loss.loss_of(row, paired_loss.LAYER) * row["beside_ms"] / row["ms"]


def _small_charges() -> dict:
    out = {}
    for tag, model in (("a", "llama3-70b"), ("b", "llama3-8b")):
        for name, path in (("symm", "nccl_symm"), ("fused", "fused_norm")):
            out[f"{tag}_{name}"] = _charge(model, "60ae8af", 512, path)
            out[f"{tag}_{name}1"] = _charge(model, "9ba11d6", 1024, path)
    return out


def _worst_sm_points() -> dict:
    """The TP=4 validation's errors of the SM-based splits at the token counts docs/predict.md names."""
    split = "token_split comm={} comm_ctas_attn=16 comm_ctas_mlp=16"
    errors = lambda model, comm: f.validation_errors("results/predicted-h200/validation.md",
                                                     f"{model} TP=4, measured on 4x H200, with --in-layer none",
                                                     split.format(comm))
    return {"a": errors("llama3-70b", "nccl_symm"), "b": errors("llama3-8b", "nccl_symm"),
            "c": errors("llama3-8b", "fused")}



CE_ROW = ("| {tokens} | `{{a[strategy]}}` {{a[how]}} | {{a[speedup]:.3f}}x, {{a[hidden]:.0f}}% | "
          "`{{b[strategy]}}` {{b[how]}} | {{b[speedup]:.3f}}x, {{b[hidden]:.0f}}% |")
CE_STUDIES = {"a": f.CE_OUT_TP4 + "llama3-70b-tp4.jsonl", "b": f.CE_OUT_TP4 + "llama3-8b-tp4.jsonl"}


def _fastest_pair(studies: dict[str, str], tokens: int) -> dict:
    """One row of a two-model table of a run's fastest choices (CE_ROW): each study's at `tokens`."""
    return {k: f.fastest_by_tokens(store)[tokens] for k, store in studies.items()}


FOURTH = {"a": "results/h200x4/2112bbf/llama3-70b-tp4.jsonl", "b": "results/h200x4/2112bbf/llama3-8b-tp4.jsonl"}
FIFTH = {"a": "results/h100x4/b71640f/llama3-70b-tp4.jsonl", "b": "results/h100x4/b71640f/llama3-8b-tp4.jsonl"}  # 4x H100


def _run_against(now_stores: dict[str, str], then_stores: dict[str, str]) -> dict:
    """One run's two studies (`a` 70B, `b` 8B) against another's: the points whose fastest choice
    is of the same strategy and of the same path and knobs, the largest difference of the fastest
    speedup per model, and the hidden shares against issue 46's TP=4 targets."""
    now = {k: f.fastest_by_tokens(store) for k, store in now_stores.items()}
    then = {k: f.fastest_by_tokens(store) for k, store in then_stores.items()}
    hidden = lambda k, tokens: [now[k][t]["hidden"] for t in tokens]
    same = lambda key: sum(now[k][t][key] == then[k][t][key] for k in now for t in f.TOKENS)
    return {"same": same("strategy"), "same_how": same("how"),
            "n": 2 * len(f.TOKENS),
            **{k: max(abs(now[k][t]["speedup"] - then[k][t]["speedup"]) for t in f.TOKENS) for k in now},
            "a2": now["a"][2048]["hidden"], "a_met": bounds(hidden("a", f.TOKENS[2:])),
            "b4": now["b"][4096]["hidden"], "b_met": bounds(hidden("b", f.TOKENS[3:]))}


_fourth_against_third = functools.cache(lambda: _run_against(FOURTH, CE_STUDIES))
_fifth_against_fourth = functools.cache(lambda: _run_against(FIFTH, FOURTH))


def _where_the_fastest_differs() -> dict:
    """The points where the H100 run's fastest setting is not the H200 run's, and in each run the
    paired gain of that run's fastest over the other run's (tune.gain): all within the noise on
    H100, and the one H200 point beyond it."""
    where, h100_gains, h200_beyond = [], [], []
    for k, model in (("a", "70B"), ("b", "8B")):
        runs = [{sum(c[0]): f.communicating(at) for _, c, at in f.batches_of(store)} for store in (FIFTH[k], FOURTH[k])]
        for t in f.TOKENS:
            h100_all, h200_all = runs[0][t], runs[1][t]
            h100, h200 = (min(among, key=lambda m: m.ms) for among in (h100_all, h200_all))
            if (h100.strategy, h100.knobs) == (h200.strategy, h200.knobs):
                continue
            where.append(f"{model} {t // 1024}K")
            # each run's fastest against the other run's fastest setting, timed in the same run
            h100_gains.append(tune.gain(h100, f.measured_choice(h100_all, h200.strategy, **h200.knobs)))
            g = tune.gain(h200, f.measured_choice(h200_all, h100.strategy, **h100.knobs))
            if not g.lo <= 1 <= g.hi:
                h200_beyond.append((f"{model} {t // 1024}K", g))
    assert all(g.lo <= 1 <= g.hi for g in h100_gains), h100_gains
    ((at, g),) = h200_beyond
    return {"at": ", ".join(where[:-1]) + " and " + where[-1], "beyond": at, "d": (g.speedup - 1) * 100, "lo": g.lo, "hi": g.hi}


def _against_free(store: str, tokens: int) -> tuple[float, float, float]:
    """The fastest correct choice's paired gain over `no_comm` at one point: speedup and 95% interval."""
    _, _, g = f.against_no_comm(store)[tokens]
    return g.speedup, g.lo, g.hi


def _ce_out_against_copy() -> dict:
    out = {}
    for k, store in CE_STUDIES.items():
        kernel, copy = f.ce_split_ms(store, "kernel"), f.ce_split_ms(store, None)
        ratio = {t: kernel[t] / copy[t] for t in f.TOKENS}
        fastest = f.fastest_by_tokens(store)
        out[k] = bounds(ratio.values())
        out[k + "_at"] = min(ratio, key=ratio.get)
        out[k + "_span"] = f.token_span(t for t, v in fastest.items() if v["how"].endswith("ce_out kernel"))
    return out


def _ce_out_run_against_a3860b5() -> dict:
    out = {}
    for k, model in (("a", "llama3-70b"), ("b", "llama3-8b")):
        before = f.fastest_by_tokens(f.AGAIN_TP4 + f"{model}-tp4.jsonl")
        now = f.fastest_by_tokens(f.CE_OUT_TP4 + f"{model}-tp4.jsonl")
        out[k] = max(abs(now[t]["speedup"] - before[t]["speedup"]) for t in f.TOKENS)
        out.update({f"{k}{t // 1024}": (before[t]["speedup"], now[t]["speedup"]) for t in (8192, 16384)})
    return out


def _ties_no_comm() -> dict:
    """70B at 8K in the ce_out run: its fastest choice, the split with `ce_out: kernel`, against
    `no_comm`, paired."""
    best, free, g = f.against_no_comm(CE_STUDIES["a"])[8192]
    assert best.strategy == "token_split" and best.knobs.get("ce_out") == "kernel", best.describe()
    return {"kernel": best.ms, "free": free.ms, "g": g.speedup, "lo": g.lo, "hi": g.hi}


def _long_h100_hidden() -> dict:
    """The 4x H100 long-prompt runs: the fastest choice's hidden share per model and size (checked
    to be the split with one piece per reduction at 70B 16K and 64K), and how many points one piece
    hides over `auto` pieces at 70B."""
    fastest = {k: f.fastest_by_tokens(LONG_TP4_H100[m]) for k, m in (("a", "llama3-70b"), ("b", "llama3-8b"))}
    assert all(fastest["a"][t]["how"].endswith("1 piece per reduction") for t in (16384, 65536)), fastest["a"]
    rows = [r for r in f.rows(LONG_TP4_H100["llama3-70b"]) if r["status"] == "ok"]
    split = lambda t, pieces: f.the_row([r for r in rows if r["tokens"] == t], "token_split", comm="copy_engine",
                                        ce_out="kernel", split_ratio=None, chunks=None, ce_chunks=pieces)["speedup"]
    free = lambda t: f.the_row([r for r in rows if r["tokens"] == t], "no_comm")["speedup"]
    share = lambda s, t: (1 - 1 / s) / (1 - 1 / free(t)) * 100
    return {k: {t: v["hidden"] for t, v in by.items()} for k, by in fastest.items()} | {
        "d": bounds(share(split(t, 1), t) - share(split(t, None), t) for t in (16384, 32768, 65536))}


TP4_ROW = "| {tokens} | `{{a[strategy]}}` {{a[how]}} | {{a[hidden]:.0f}}% | `{{b[strategy]}}` {{b[how]}} | {{b[hidden]:.0f}}% |"
LONG_ROW = "| {tokens} | {{exposed:.1f}}% | `{{strategy}}` {{how}} | {{speedup:.3f}}x | {{hidden:.0f}}% |"
TP4_CLAIMS = [
    Claim(TP4_DOC, "takes {a[lo]:.1f}-{a[hi]:.1f}% of a Llama-3-70B layer's time from 32K down to 1K tokens, and "
                   "{b[lo]:.1f}-{b[hi]:.1f}% of a Llama-3-8B layer's",
          lambda: {"a": bounds(f.comm_shares(*f.TP4_STUDIES["llama3-70b"]), 100),
                   "b": bounds(f.comm_shares(*f.TP4_STUDIES["llama3-8b"]), 100)}),
    *[Claim(TP4_DOC, TP4_ROW.format(tokens=t), lambda t=t: _fastest_row(t)) for t in f.TOKENS],
    Claim(TP4_DOC, "the fastest choice takes {a[lo]:.3f}-{a[hi]:.3f}x `no_comm`'s time on 70B and {b[lo]:.3f}-{b[hi]:.3f}x on 8B",
          _over_free),
    *[Claim(TP4_DOC, LONG_ROW.format(tokens=t), lambda t=t: f.fastest_by_tokens(LONG_TP4)[t]) for t in (16384, 32768, 65536)],
    Claim(TP4_DOC, "NCCL's ring at its default {n64:.0f} / {n1g:.0f}, its symmetric kernel on 16 CTAs {s64:.0f} / {s1g:.0f}, "
                   "PyTorch's two-shot {t64:.0f} / {t1g:.0f} and one-shot {o64:.0f} / {o1g:.0f}, our fused all-reduce + RMSNorm "
                   "on 32 CTAs {f64:.0f} / {f1g:.0f}, the copy-engine path on 32 CTAs {c64:.0f} / {c1g:.0f}. At 64 MiB the "
                   "all-gather runs at {ag_n:.0f} (NCCL's ring), {ag_s:.0f} (symmetric, 16 CTAs) and {ag_c:.0f} (copy engine), "
                   "the reduce-scatter at {rs_n:.0f} and {rs_s:.0f}", _tp4_comm),
    Claim(TP4_DOC, "At 32K tokens on 70B the split itself costs nothing ({split70:+.2f} ms per layer against `no_comm`, of "
                   "{base70:.2f} ms of exposed communication). On our fused kernel (16 CTAs) the split takes {fused70:.2f} ms "
                   "more per layer than with no communication: its GEMMs take {gemm_fused:.2f} ms more and its attention "
                   "{att_fused:.2f} ms more, the SMs the kernel holds. On the copy engine it takes {ce70:.2f} ms more: its GEMMs "
                   "{gemm_ce:.2f} ms more, and the path's add + RMSNorm kernel on 32 CTAs runs {norm_ce:.2f} ms of GPU time "
                   "beside them. `flash_agrs` on the copy engine ends {fa70:.2f} ms behind `no_comm`", _where_the_rest_goes),
    *[Claim(TP4_DOC, LONG_ROW.format(tokens=t), lambda m=m, t=t: f.fastest_by_tokens(LONG_TP4_AGAIN[m])[t])
      for m in LONG_TP4_AGAIN for t in (16384, 32768, 65536)],
    *[Claim(TP4_DOC, LONG_ROW.format(tokens=t), lambda m=m, t=t: f.fastest_by_tokens(LONG_TP4_H100[m])[t])
      for m in LONG_TP4_H100 for t in (16384, 32768, 65536)],
    Claim(TP4_DOC, "the best split setting of the same run reaches {s[0]:.3f}x, {s[1]:.3f}x and {s[2]:.3f}x", _flash_agrs_again),
    Claim(TP4_DOC, "gave {a[0]:.3f}x, {a[1]:.3f}x and {a[2]:.3f}x against this run's {l[0]:.3f}x, {l[1]:.3f}x and {l[2]:.3f}x",
          _flash_agrs_again),
    *[Claim(TP4_DOC, REPLAY_ROW.format(label=label), lambda name=name: _replay_row(name))
      for name, label in REPLAY_LABELS.items()],
    Claim(TP4_DOC, "This replay's `no_comm` takes {replay:.2f} ms for the 4 layers, where the timed rows of the same run say "
                   "{timed4:.2f} (4 x {free:.2f}", _replay_caveat),
    Claim(TP4_DOC, "The timed rows put `flash_agrs` {behind:.1f}% behind `no_comm` ({fa:.2f} against {free:.2f} ms per layer)",
          _replay_caveat),
    *[Claim(TP4_DOC, AGAIN_ROW.format(tokens=t), lambda t=t: _again_row(t)) for t in f.TOKENS],
    Claim(TP4_DOC, "The best speedups of the two runs are at most {a:.3f} apart on 70B and {b:.3f} on 8B, and the fastest "
                   "family is the same at {same} of the {n} points", _again),
    Claim(TP4_DOC, "a speedup moved by a median of {a:.3f} on 70B and {b:.3f} on 8B. One setting did not reproduce: "
                   "`async_tp` at 32K went from {a1:.3f}x to {a2:.3f}x on 70B and from {b1:.3f}x to {b2:.3f}x on 8B (its "
                   "time per layer from {ams1:.2f} to {ams2:.2f} ms and from {bms1:.2f} to {bms2:.2f})", _shared_moves),
    *[Claim(TP4_DOC, RANK_ROW.format(label=label), lambda name=name: _rank_row(name)) for name, label in RANK_LABELS.items()],
    Claim(TP4_DOC, "with nothing to wait for, rank {slowest} takes {free:.1f}% longer than rank 0 for the same work "
                   "(`no_comm`; {split:.1f}% with the split and no transfers)", _slowest_card),
    Claim(TP4_DOC, "its ranks' walls agree within {spread:.1f} ms", _slowest_card),
    Claim(TP4_DOC, "rank 0 spends {barrier:.2f} ms in barriers, {bexp:.2f} ms of them with no compute beside it: at each of "
                   "its {n} longest waits rank {last} arrived last, {late[lo]:.2f}-{late[hi]:.2f} ms after rank 0, out of a "
                   "{before}", _slowest_card),
    Claim(TP4_DOC, "`flash_agrs` ends {fa:.2f} ms behind `no_comm` and the split with no transfers {none:.2f} ms ahead of it",
          _slowest_card),
    Claim(TP4_DOC, "put 70B's `async_tp` back at {t32[speedup]:.3f}x at 32K ({t32[ms]:.2f} ms per layer) and "
                   "{t16[speedup]:.3f}x at 16K", _async_tp_again),
    Claim("docs/predict.md", "`nccl_symm` at 70B 1K ({a[1024]}) and 8B 1K-2K ({b[1024]}, {b[2048]}), the fused kernel at 8B 1K "
                             "({c[1024]}) and 4K-8K ({c[4096]}, {c[8192]})", _worst_sm_points),
    Claim("docs/predict.md", "charge about as much: at 70B `nccl_symm` 16 CTAs {a_symm:.2f} (the 1K rows: {a_symm1:.2f}) "
                             "and the fused kernel {a_fused:.2f} ({a_fused1:.2f}); at 8B {b_symm:.2f} ({b_symm1:.2f}) and "
                             "{b_fused:.2f} ({b_fused1:.2f})", _small_charges),
    Claim("docs/predict.md", "their replays started within {apart:.2f} ms of each other, where those of 60ae8af's profile "
                             "began up to {old:.1f} ms apart). Timed, the `nccl_symm` 16/16 split cost {a[timed]:.3f} ms per "
                             "layer over the split with `comm: none` at 1K and {b[timed]:.3f} at 2K. In the graph replays the "
                             "4-layer stack cost {a[wall][lo]:.3f}-{a[wall][hi]:.3f} ms per layer more on the four ranks at 1K, "
                             "its middle layers (layer 2's first GEMM to layer 4's) {a[mid][lo]:.3f}-{a[mid][hi]:.3f}",
          lambda: _in_steps() | {"apart": max(_in_steps()["a"]["apart"], _in_steps()["b"]["apart"])}),
    Claim("docs/predict.md", "At 2K the middle layers cost {b[mid][lo]:.3f}-{b[mid][hi]:.3f} ms per layer, nearly all of it "
                             "GEMM time (the GEMMs ran {b[gemm][lo]:.3f}-{b[gemm][hi]:.3f} ms per layer longer on the four "
                             "ranks, {a[gemm][lo]:.3f}-{a[gemm][hi]:.3f} at 1K)", _in_steps),
    Claim("docs/predict.md", "at 1K it started {a[later_at][lo]:.0f}-{a[later_at][hi]:.0f} us into the GEMM in {a[n_later]} of "
                             "{a[n]} cases and left the GEMM's time as it was ({a[later_len][lo]:+.0f} to "
                             "{a[later_len][hi]:+.0f} us against its twin in the split alone); at 2K it started with the GEMM "
                             "(within {b_within:.0f} us of its start) in {b[n_with]} of {b[n]} and lengthened it by "
                             "{b[with_len][lo]:.0f}-{b[with_len][hi]:.0f} us, and in the other {b[n_later]} it started "
                             "{b[later_at][lo]:.0f}-{b[later_at][hi]:.0f} us in",
          lambda: _in_steps() | {"b_within": max(abs(v) for v in _in_steps()["b"]["with_at"].values())}),
    Claim("docs/predict.md", "The timed loop's {a[timed]:.3f} is about the middle layers'", _in_steps),
    Claim("docs/predict.md", "at 1K the all-reduce beside the gate-up GEMM started "
                             "{a[later_at][lo]:.0f}-{a[later_at][hi]:.0f} us into it in {a[n_later]} of {a[n]} cases and "
                             "left it as it was ({a[later_len][lo]:+.0f} to "
                             "{a[later_len][hi]:+.0f} us); at 2K it started with the GEMM in {b[n_with]} of {b[n]} and "
                             "lengthened it by {b[with_len][lo]:.0f}-{b[with_len][hi]:.0f} us, and in the other {b[n_later]} "
                             "it started {b[later_at][lo]:.0f}-{b[later_at][hi]:.0f} us in. Timed, `nccl_symm` cost "
                             "{a[timed]:.3f} ms per layer over the split alone at 1K and {b[timed]:.3f} at 2K",
          lambda: _four_replays(4, "nccl_symm")),
    Claim("docs/predict.md", "is launched {ahead[lo]:.0f}-{ahead[hi]:.0f} us before the gate-up GEMM beside it (and just before "
                             "the QKV GEMM) in {a[n_with]} of {a[n]} cases at 1K and {b[n_with]} of {b[n]} at 2K, and the "
                             "GEMM runs {a[with_len][lo]:.0f}-{a[with_len][hi]:.0f} us longer than its twin at 1K",
          lambda: _four_replays(2, "fused")),
    Claim("docs/predict.md", "So the fused split costs {a[timed]:.3f} ms per layer over the split alone at 1K",
          lambda: _four_replays(2, "fused")),
    Claim("docs/predict.md", "`nccl_symm` 16/16 started with the gate-up GEMM in {a[n_with]} of {a[n]} cases at 1K "
                             "({a[with_len][lo]:+.0f} to {a[with_len][hi]:+.0f} us) and {a[later_at][lo]:.0f}-"
                             "{a[later_at][hi]:.0f} us into it in {a[n_later]} ({a[later_len][lo]:+.0f} to "
                             "{a[later_len][hi]:+.0f} us): {a[timed]:.3f} ms per layer", lambda: _four_replays(2, "nccl_symm")),
    Claim("docs/predict.md", "32/32 leaves rank 0 with {exposed:.1f} ms exposed over 4 layers, and at each of rank 0's {n} "
                             "longest barrier waits the last rank arrived {late[lo]:.2f}-{late[hi]:.2f} ms after it, out "
                             "of a `{before}`", _copy_engine_waits),
    Claim(TP4_DOC, "At 2K tokens on 8B the split alone takes {split8:.3f}x `no_comm`'s time, its half-size GEMMs "
                   "{gemm8:.0f}% more GPU time than the whole batch's: no split can hide more than {cap8:.0f}% of the exposed "
                   "communication there, and NCCL's symmetric kernel under it hides {best8:.0f}% in this run",
          _where_the_rest_goes),
    *[Claim(TP4_DOC, CE_ROW.format(tokens=t), functools.partial(_fastest_pair, CE_STUDIES, t)) for t in f.TOKENS],
    Claim(TP4_DOC, "`kernel` takes {a[lo]:.3f}-{a[hi]:.3f} of `copy`'s time on 70B and {b[lo]:.3f}-{b[hi]:.3f} on 8B "
                   "over 1K-32K, the least at {a_at} tokens on 70B and {b_at} on 8B. It makes the split the fastest "
                   "choice at {a_span} on 70B and {b_span} on 8B", _ce_out_against_copy),
    Claim(TP4_DOC, "the fastest choice's speedup moved by at most {a:.3f} on 70B and {b:.3f} on 8B: up at 70B's 8K "
                   "({a8[0]:.3f}x to {a8[1]:.3f}x) and 8B's 8K and 16K ({b8[0]:.3f}x to {b8[1]:.3f}x, {b16[0]:.3f}x to "
                   "{b16[1]:.3f}x)", _ce_out_run_against_a3860b5),
    Claim(TP4_DOC, "At 70B 8K the split with `kernel` ties `no_comm`: {kernel:.3f} against {free:.3f} ms per layer, "
                   "paired {g:.3f}x (95% interval {lo:.3f}-{hi:.3f})", _ties_no_comm),
    *[Claim(TP4_DOC, CE_ROW.format(tokens=t), functools.partial(_fastest_pair, FOURTH, t)) for t in f.TOKENS],
    Claim(TP4_DOC, "Against the 1968c70 run the fastest choice is of the same strategy at {same} of the {n} points and "
                   "has the same path and knobs at {same_how}", _fourth_against_third),
    Claim(TP4_DOC, "speedup moved by at most {a:.3f} on 70B and {b:.3f} on 8B.", _fourth_against_third),
    Claim(TP4_DOC, "70B's 85% is met at 4K-32K ({a_met[lo]:.0f}-{a_met[hi]:.0f}%) and missed at 2K ({a2:.0f}%); 8B's 80% "
                   "is met at 8K-32K ({b_met[lo]:.0f}-{b_met[hi]:.0f}%) and missed at 4K ({b4:.0f}%)", _fourth_against_third),
    Claim("README.md", "the fastest choice is of the same strategy at {same} of the {n} points and its speedup moved by at "
                       "most {m:.3f}", lambda: (d := _fourth_against_third()) | {"m": max(d["a"], d["b"])}),
    *[Claim(TP4_DOC, CE_ROW.format(tokens=t), functools.partial(_fastest_pair, FIFTH, t)) for t in f.TOKENS],
    Claim(TP4_DOC, "Against the 2112bbf run on 4x H200 the fastest choice is of the same strategy at {same} of the {n} "
                   "points and has the same path and knobs at {same_how}; its speedup is within {a:.3f} of the H200's on "
                   "70B and {b:.3f} on 8B", _fifth_against_fourth),
    Claim(TP4_DOC, "70B's 85% is met at 4K-32K ({a_met[lo]:.0f}-{a_met[hi]:.0f}%) and missed at 2K ({a2:.0f}%); 8B's 80% "
                   "is met at 8K-32K ({b_met[lo]:.0f}-{b_met[hi]:.0f}%) and missed at 4K ({b4:.0f}%)", _fifth_against_fourth),
    Claim(TP4_DOC, "Where the fastest setting differs ({at}), the two settings are within the paired noise of each other "
                   "on H100; on H200 at {beyond} `nccl_symm` led by {d:.1f}% (95% interval {lo:.3f}-{hi:.3f}), elsewhere "
                   "within it", _where_the_fastest_differs),
    Claim(TP4_DOC, "at 70B 8K the `kernel` split against `no_comm`, paired, {a[0]:.3f}x (95% interval {a[1]:.3f}-{a[2]:.3f}), "
                   "at 8B 16K {b[0]:.3f}x ({b[1]:.3f}-{b[2]:.3f})", lambda: {
                       k: _against_free(FIFTH[k], t) for k, t in (("a", 8192), ("b", 16384))}),
    Claim("docs/long-prompts.md", "70B hides {a2:.0f}% at 2K and {a_met[lo]:.0f}-{a_met[hi]:.0f}% at 4K-32K, 8B {b4:.0f}% at "
                                  "4K and {b_met[lo]:.0f}-{b_met[hi]:.0f}% at 8K-32K: as at 1968c70", _fourth_against_third),
    Claim("docs/long-prompts.md", "70B hides {a2:.0f}% at 2K and {a_met[lo]:.0f}-{a_met[hi]:.0f}% at 4K-32K, 8B {b4:.0f}% at "
                                  "4K and {b_met[lo]:.0f}-{b_met[hi]:.0f}% at 8K-32K: as on H200", _fifth_against_fourth),
    Claim("docs/long-prompts.md", "The long-prompt runs: 70B {a[16384]:.0f}%, {a[32768]:.0f}% and {a[65536]:.0f}% at 16K, "
                                  "32K and 64K (one piece per reduction at 16K and 64K), 8B {b[16384]:.0f}%, {b[32768]:.0f}% and "
                                  "{b[65536]:.0f}%", _long_h100_hidden),
    Claim("docs/long-prompts.md", "hides {d[lo]:.0f}-{d[hi]:.0f} points more on 4x H100", _long_h100_hidden),
    Claim("README.md", "the fastest choice is of the same strategy as on the 2112bbf H200s at {same} of the {n} points and its "
                       "speedup is within {m:.3f} of theirs",
          lambda: (d := _fifth_against_fourth()) | {"m": max(d["a"], d["b"])}),
    Claim(TP4_DOC, "At 70B 32K the split alone costs {split70:.2f} ms per layer against `no_comm` (of {base70:.2f} ms exposed). "
                   "On the fused kernel it takes {fused70:.2f} ms more than with no communication: its GEMMs {gemm_fused:.2f} "
                   "ms more GPU time, its attention {att_fused:.2f} ms more. On the copy engine it takes {ce70:.2f} ms more: "
                   "its GEMMs {gemm_ce:.2f} ms more ({h200_gemm_ce:.2f} on H200), and the add + RMSNorm kernel runs "
                   "{norm_ce:.2f} ms of GPU time beside them. `flash_agrs` ends {fa70:.2f} ms behind `no_comm`. At 8B 2K the "
                   "split alone takes {split8:.3f}x `no_comm`'s time, its half-size GEMMs {gemm8:.0f}% more GPU time: no "
                   "split can hide more than {cap8:.0f}% there, and `nccl_symm` under it hides {best8:.0f}%",
          lambda: _where_the_rest_goes(PROFILES_TP4_H100) | {"h200_gemm_ce": _where_the_rest_goes()["gemm_ce"]}),
    *[Claim(TP4_DOC, RANK_ROW.format(label=label), lambda name=name: _rank_row(name, RANK_REPLAYS_H100))
      for name, label in RANK_LABELS.items()],
    Claim(TP4_DOC, "at `no_comm` the slowest rank takes {h:.1f}% longer than the fastest ({r:.1f}% on the H200s above)",
          _h100_replays),
    Claim(TP4_DOC, "On the slowest card `flash_agrs` ends level with `no_comm` ({fa:+.2f} ms over 4 layers; {fa_r:+.2f} on "
                   "H200) and the split with no transfers {none:.2f} ms ahead of it ({none_r:.2f} on H200)", _h100_replays),
    Claim(TP4_DOC, "in the fifth run's timed rows `flash_agrs` is {g[0]:.3f}x `no_comm` at 70B 32K, paired "
                   "({g[1]:.3f}-{g[2]:.3f})",
          lambda: {"g": _against_free(FIFTH["a"], 32768)}),
]


test_each_published_figure_follows_from_its_rows = claims_test(TP4_CLAIMS)

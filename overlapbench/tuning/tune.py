"""Selection: the best strategy and knobs per token range, written as tuned YAML configs.

Configs are chosen from rows of the layer workload only: an engine runs layers, and a micro
workload (one GEMM) informs the choice but never configures it (`report` compares those).
The rule, per (device, world size, measured or predicted, tp, model shape, dtype) and token count:

1. Each strategy's candidate is its fastest knob setting there (lowest median), within one batch:
   batches of that size but another make-up or stack depth (`layers: [4, 8]`) are judged apart,
   and a strategy is chosen for the token count only where every batch chose it, else the
   reference stays (`pick`). `no_comm` is never a candidate: it computes the wrong result.
2. The incumbent starts as the reference: `baseline` with default knobs (else the fastest
   baseline row). Candidates challenge it in order of simplicity (each strategy's `simplicity` rank); a challenger
   replaces the incumbent only when it is faster by more than the noise, so ties go to the
   simpler strategy.
3. "Faster by more than the noise": the 95% confidence interval of the speedup lies entirely
   above 1 + min_gain. Rows timed interleaved in the same rounds (one pairing, see interleave.py)
   are paired: the speedup is the 10%-trimmed geometric mean over their common rounds of
   t_incumbent / t_challenger, its interval the trimmed-t interval of those log ratios. Otherwise
   it is incumbent median / challenger median, its interval the exact rank-sum interval of the
   shift between the two rows' log times, over block means of about sqrt(n) consecutive samples
   (drifting clocks correlate neighbours); where the samples are too few for a 95% interval at
   all (fewer than 4 a side), the challenger is "too few samples" and never replaces the
   incumbent (intervals.py). A row without at least two samples falls back to its p10/p90: the
   interval is [p10_inc / p90_ch, p90_inc / p10_ch], so the challenger must be faster with their
   central 80% ranges not overlapping. Predicted rows: each time +- half the model's error.
4. Every pick also says its speedup over the fastest setting of the reference strategy at that
   batch (`vs best baseline`): a baseline knob setting (allreduce, nccl_max_ctas, ...) may beat
   the default, and no verdict should rest on a weak reference.

Ranges: neighbouring measured token counts with the same choice (strategy and knobs) merge.
Between two measured counts a and b with different choices the boundary is floor(sqrt(a * b)),
the geometric midpoint rounded down (token counts are swept in powers of two): a's range ends
there and b's starts one above. The first range starts at 1; the last ends at the largest
measured count (above it, an engine gets the last rule, flagged `clamped`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from overlapbench import strategies, tuned
from overlapbench.errors import UserError, shown
from overlapbench.timing import intervals
from overlapbench.tuning import analysis, batches, origin
from overlapbench.tuning.analysis import Group, Measured
from overlapbench.tuning.settling import unsettled_note
from overlapbench.tuning.tuned_names import file_names

LEVEL = intervals.LEVEL  # the 95% interval a challenger must clear
# A challenger must be at least this much faster, beyond the noise, to replace a simpler choice.
# Switching for less buys little, and the best few settings are often within 1% of each other:
# there a rule of "beats it at all" picks by the noise. On two paired runs of sp-llama3-70b-tp2
# picks agreed at 4 of 6 token counts with no margin, 6 of 6 with 1% (results/h200x2/a034cb8/);
# with the ranks aligned and +-0.5% intervals, 5 of 6 with none (the sixth a near-tie of two
# flash_agrs settings, 0.1-0.3% apart), 6 of 6 with 1% (results/h200x2/3b4da9f/).
MIN_GAIN = 0.01  # `tune --min-gain`


def method(min_gain: float = MIN_GAIN) -> str:
    """How the picks were made, for the tuned YAML's provenance."""
    return (
        f"per token count, a strategy's fastest knob setting replaces the simpler choice only if the "
        f"{LEVEL:.0%} CI of its speedup lies above {1 + min_gain:g} (rows timed interleaved: the 10%-trimmed "
        f"geometric mean of per-round ratios, trimmed-t interval; else the ratio of medians, exact rank-sum "
        f"interval over block means, too few samples never replace; no samples: p10/p90 ranges must not overlap); "
        f"speedups over the default reference and over its fastest setting (vs best); boundaries at "
        f"floor(sqrt(a*b)) between measured counts"
    )


def simplicity(strategy: str) -> tuple[float, str]:
    """Sort key: each strategy's own `simplicity` rank; names no registered strategy has (a plugin
    not loaded) last; equal ranks alphabetically, for a stable order."""
    cls = strategies.find(strategy)
    return (cls.simplicity if cls is not None else math.inf), strategy


@dataclass(frozen=True)
class Gain:
    """How much faster a challenger is than an incumbent: the speedup and its interval."""

    speedup: float  # incumbent median / challenger median
    lo: float | None  # None: too few samples for an interval at the level
    hi: float | None
    method: str  # "paired" (same rounds), "rank-sum" (medians), "p10/p90", or "predicted" (the model's error)

    @property
    def decided(self) -> bool:
        return self.lo is not None and self.hi is not None

    def beats(self, min_gain: float = MIN_GAIN) -> bool:
        """Faster by more than `min_gain` across the whole interval: worth switching for."""
        return self.decided and self.lo > 1.0 + min_gain

    def text(self) -> str:
        if not self.decided:
            return f"{self.speedup:.3f}x (too few samples to tell)"
        return f"{self.speedup:.3f}x [{self.lo:.3f}, {self.hi:.3f}]"


@dataclass(frozen=True)
class Pick:
    """The choice at one measured token count, and why."""

    tokens: int
    chosen: Measured
    reference: Measured
    gain: Gain | None  # chosen over the reference; None when the reference itself is chosen
    why: str
    best: Measured | None = None  # the reference strategy's fastest setting here (analysis.best_reference)

    @property
    def speedup(self) -> float:
        return self.gain.speedup if self.gain is not None else self.reference.ms / self.chosen.ms

    @property
    def speedup_vs_best(self) -> float | None:
        """Over the fastest reference setting, round by round where both were timed together."""
        return None if self.best is None else analysis.speedup(self.chosen, self.best)


@dataclass(frozen=True)
class Span:
    """Neighbouring measured token counts with the same choice, and the range they answer for."""

    lo: int
    hi: int
    picks: tuple[Pick, ...]


def gain(challenger: Measured, incumbent: Measured, level: float = LEVEL) -> Gain:
    if challenger.predicted or incumbent.predicted:
        return _predicted_gain(challenger, incumbent, level)
    ratios = analysis.paired_ratios(incumbent, challenger)
    if ratios is not None:  # timed in the same rounds: the drift cancels round by round
        lo, hi = intervals.paired_ci(ratios, level)
        return Gain(intervals.paired_estimate(ratios), lo, hi, "paired")
    stored = analysis.stored_speedup(challenger, incumbent)
    if stored is not None and level == LEVEL:  # paired with a re-timed reference (a resumed sweep)
        return Gain(stored[0], *stored[1], "paired")
    point = incumbent.ms / challenger.ms
    if len(challenger.samples) >= 2 and len(incumbent.samples) >= 2:
        shift = intervals.shift_interval(incumbent.samples, challenger.samples, level)
        if shift is None:
            return Gain(point, None, None, "rank-sum")
        # the interval is of the shift between locations; the point is the ratio of medians
        return Gain(point, min(math.exp(shift[0]), point), max(math.exp(shift[1]), point), "rank-sum")
    inc_lo, inc_hi = _spread(incumbent)
    ch_lo, ch_hi = _spread(challenger)
    return Gain(point, inc_lo / ch_hi, inc_hi / ch_lo, "p10/p90")


def _predicted_gain(challenger: Measured, incumbent: Measured, level: float) -> Gain:
    """The speedup a predicted row holds over its default baseline, +- the model's error (predict
    --error); else each time +- half that error, whose ranges must not overlap."""
    stored = analysis.stored_speedup(challenger, incumbent)
    if stored is not None and level == LEVEL:
        return Gain(stored[0], *stored[1], origin.PREDICTED)
    def spread(m: Measured) -> tuple[float, float]:
        half = m.ms * (m.model_error or 0.0) / 2
        return m.ms - half, m.ms + half

    (inc_lo, inc_hi), (ch_lo, ch_hi) = spread(incumbent), spread(challenger)
    return Gain(incumbent.ms / challenger.ms, inc_lo / ch_hi, inc_hi / ch_lo, origin.PREDICTED)


def _spread(m: Measured) -> tuple[float, float]:
    """p10 and p90; a row with neither counts as noise-free (a single iteration, say)."""
    return (m.p10_ms if m.p10_ms is not None else m.ms), (m.p90_ms if m.p90_ms is not None else m.ms)


def pick(rows: list[Measured], min_gain: float = MIN_GAIN) -> Pick | None:
    """The choice at one token count of one group; None without a row of the group's reference
    strategy (baseline for the layer) to compare to.

    Each batch of that size is judged on its own; a strategy is chosen for the token count only
    where every measured batch chose it, else the reference stays (the engine sees only the count).
    """
    picks = [p for b in batches.by_batch(rows).values() if (p := _pick_in_batch(b, min_gain)) is not None]
    if not picks:
        return None
    if len({p.chosen.setting for p in picks}) == 1:
        first = picks[0]
        why = first.why if len(picks) == 1 else "; ".join(f"{batches.batch_text(p.reference)}: {p.why}" for p in picks)
        return Pick(first.tokens, first.chosen, first.reference, first.gain, why, first.best)
    ref = picks[0].reference
    choices = "; ".join(f"{batches.batch_text(p.reference)}: {p.chosen.describe()}" for p in picks)
    why = f"batches disagree ({choices}); {_ref_name(ref)} kept"
    return Pick(ref.tokens, ref, ref, None, why, picks[0].best)


def settled_per_strategy(rows: list[Measured], min_gain: float = MIN_GAIN) -> dict[str, Measured]:
    """Each strategy's knob setting for the pick: its default setting, unless its fastest
    setting beats the default beyond the noise. The fastest of several near-equal settings is
    a coin toss between two runs of the same code; the default is not, so picks repeat."""
    best = analysis.best_per_strategy(rows)
    for name, fastest in best.items():
        default = _default_setting(name, rows)
        if default is not None and default is not fastest and not gain(fastest, default).beats(min_gain):
            best[name] = default
    return best


def _default_setting(strategy: str, rows: list[Measured]) -> Measured | None:
    """The row of `strategy` at its declared default knobs, if measured (and a correct result)."""
    cls = strategies.find(strategy)
    if cls is None:
        return None
    defaults = cls.check_knobs({}, strategy)
    return next((m for m in rows if m.strategy == strategy and m.checked and m.knobs == defaults), None)


def _pick_in_batch(rows: list[Measured], min_gain: float) -> Pick | None:
    ref = analysis.reference(rows)
    if ref is None:
        return None
    best = settled_per_strategy([m for m in rows if m.strategy != analysis.BOUND], min_gain)
    challengers = sorted((m for m in best.values() if m is not ref), key=lambda m: simplicity(m.strategy))
    winner = ref
    for challenger in challengers:
        if gain(challenger, winner).beats(min_gain):
            winner = challenger
    best = analysis.best_reference(rows)
    if winner is ref:
        return Pick(ref.tokens, ref, ref, None, _kept_why(ref, challengers) + _vs_best_text(ref, ref, best), best)
    g = gain(winner, ref)
    why = f"{g.text()} over {_ref_name(ref)}, beats noise{_vs_best_text(winner, ref, best)}"
    return Pick(ref.tokens, winner, ref, g, why, best)


def _vs_best_text(chosen: Measured, ref: Measured, best: Measured | None) -> str:
    """What the choice is against the fastest reference setting, where that is not the default."""
    if best is None or best is ref:
        return ""
    if best is chosen:
        return f"; it is the fastest {best.strategy} setting"
    return f"; {analysis.speedup(chosen, best):.3f}x vs best {best.strategy} ({best.describe()})"


def _ref_name(ref: Measured) -> str:
    return ref.strategy if analysis.default_knobs(ref.knobs) else ref.describe()


def _kept_why(ref: Measured, challengers: list[Measured]) -> str:
    if not challengers:
        return f"{_ref_name(ref)}: nothing else measured"
    closest = min(challengers, key=lambda m: m.ms)
    g = gain(closest, ref)
    verdict = "too few samples to tell" if not g.decided else "within noise" if g.speedup > 1 else "slower"
    return f"{_ref_name(ref)} kept; best challenger {closest.describe()} {g.text()}, {verdict}"


def merge(picks: list[Pick]) -> list[Span]:
    """Merge neighbours with equal choices; ranges cover 1..max (see the module docstring)."""
    picks = sorted(picks, key=lambda p: p.tokens)
    runs: list[list[Pick]] = []
    for p in picks:
        if runs and runs[-1][-1].chosen.setting == p.chosen.setting:
            runs[-1].append(p)
        else:
            runs.append([p])
    spans, lo = [], 1
    for run, following in zip(runs, runs[1:] + [None]):
        hi = boundary(run[-1].tokens, following[0].tokens) if following else run[-1].tokens
        spans.append(Span(lo, hi, tuple(run)))
        lo = hi + 1
    return spans


def boundary(a: int, b: int) -> int:
    """The last token count answered like `a` when `b` (> a) is measured next: the geometric
    midpoint rounded down; it is at least a and below b, so each measured count keeps its choice."""
    return math.isqrt(a * b)


def rule(span: Span) -> tuned.Rule:
    """A tuned rule; ms and speedup are those at the span's largest measured token count (of its
    first batch there: rows of several depths, the shallowest, whose depth `layers` names)."""
    last = span.picks[-1]
    vs_best = last.speedup_vs_best
    best = {} if vs_best is None else {"speedup_vs_best": round(vs_best, 4), "best_reference": last.best.describe()}
    if last.chosen.depth_named:
        best |= {"layers": last.chosen.layers}
    return tuned.Rule(
        span.lo, span.hi, last.chosen.strategy, dict(last.chosen.knobs),
        ms=_sig(last.chosen.ms), speedup=round(last.speedup, 4),
        extra={"measured": [p.tokens for p in span.picks]} | best
        | {"why": "; ".join(f"{p.tokens}: {p.why}" for p in span.picks)},
    )


def _sig(x: float) -> float:
    return float(f"{x:.5g}")


def config(group: Group, picks: list[Pick], rows: list[Measured], min_gain: float = MIN_GAIN) -> tuned.TunedConfig:
    spans = merge(picks)
    provenance = {
        "sources": sorted({m.source for m in rows}),
        "run_ids": sorted({m.run_id for m in rows if m.run_id}),
        "git": sorted({m.git for m in rows if m.git}),
        "method": method(min_gain),
    }
    return tuned.TunedConfig(
        device=group.device, world_size=group.world_size, tp=group.tp, model=group.model,
        shape=group.shape_dict, dtype=group.dtype, rules=tuple(rule(s) for s in spans),
        extra={"provenance": provenance},
    )


def picks_of(points: dict[int, list[Measured]], min_gain: float = MIN_GAIN) -> tuple[list[Pick], list[int]]:
    """Picks per measured token count, and the counts skipped for lack of a baseline row."""
    picks, skipped = [], []
    for tokens, rows in points.items():
        p = pick(rows, min_gain)
        if p is None:
            skipped.append(tokens)
        else:
            picks.append(p)
    return picks, skipped


def run(paths: list[Path], out_dir: Path, console: Console, min_gain: float = MIN_GAIN) -> list[Path]:
    """Tune every layer group in the stores; write one YAML each; return the paths written."""
    if not 0 <= min_gain < 1:
        raise UserError(f"--min-gain: must be a fraction in [0, 1) such as 0.01 for 1%, got {shown(min_gain)}")
    check_out_dir(Path(out_dir))
    store = analysis.read(paths)
    grouped = analysis.by_point(layer_rows(store, console))
    note = unsettled_note(store.rows)
    if note:
        console.print(Text(note, style="yellow"))
    names = file_names(list(grouped))
    written = []
    for group, points in grouped.items():
        picks, skipped = picks_of(points, min_gain)
        if skipped:
            console.print(Text(f"{group.label()}: no baseline row at {_join(skipped)} tokens; skipped there", style="yellow"))
        if not picks:
            continue
        rows = [m for ms in points.values() for m in ms]
        cfg = config(group, picks, rows, min_gain)
        console.print(explain(group, cfg, picks))
        written.append(_save(cfg, Path(out_dir) / names[group]))
    if not written:
        raise UserError(f"{_join(map(str, paths))}: no token count has a baseline row; sweep 'baseline' to tune against it")
    return written


def layer_rows(store: analysis.Store, console: Console) -> list[Measured]:
    """The rows tune chooses from; a store of micro runs alone is a UserError (it would write
    nothing), micro rows beside layer rows are left out with a note, as are rows of several setups
    (devices, or measured and predicted) said to be kept apart."""
    layer = [m for m in store.measured if m.group.workload == analysis.LAYER]
    if not layer:
        raise UserError(f"{_join(store.sources)}: no ok rows of the layer workload; "
                        f"tune writes layer configs (micro runs: use report)")
    if len(layer) < len(store.measured):
        console.print(Text(f"{len(store.measured) - len(layer)} ok rows of micro workloads left out: "
                           f"tune writes layer configs (report compares them)", style="dim"))
    for note in filter(None, [analysis.separated(layer, "a config each")]):
        console.print(Text(note, style="dim"))
    return layer


def check_out_dir(out_dir: Path) -> None:
    """A file where the folder (or one above it) should be: refused before any work."""
    file = next((p for p in (out_dir, *out_dir.parents) if p.exists() and not p.is_dir()), None)
    if file is not None:
        raise UserError(f"--out-dir: {file} is a file, not a folder; give a folder for the tuned YAMLs")


def _save(cfg: tuned.TunedConfig, path: Path) -> Path:
    try:
        return tuned.save(cfg, path)
    except OSError as e:
        raise UserError(f"--out-dir: cannot write {path} ({e.strerror or e}); choose another --out-dir") from None


def _join(items) -> str:
    return ", ".join(str(i) for i in items)


def explain(group: Group, cfg: tuned.TunedConfig, picks: list[Pick]) -> Text:
    """Each range, its choice, and why each measured token count in it got that choice."""
    by_tokens = {p.tokens: p for p in picks}
    text = Text(group.label(), style="bold")
    for r in cfg.rules:
        choice = by_tokens[r.extra["measured"][-1]]
        text.append(f"\n  {r.lo}..{r.hi} tokens: ")
        text.append(choice.chosen.describe(), style="bold green" if choice.gain else "bold")
        for tokens in r.extra["measured"]:
            text.append(f"\n    {tokens}: {by_tokens[tokens].why}", style="" if by_tokens[tokens].gain else "dim")
    return text

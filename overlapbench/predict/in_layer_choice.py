"""`predict --in-layer`: which in-layer term a serial plan's blocking all-reduces are charged:
`measured` (the beside-layer rows' term), `none`, or `auto` (the default), which follows how the
spec predicted is timed."""

from __future__ import annotations

# What a serial plan's blocking all-reduce costs beyond its time in the comm table (`--in-layer`):
# NO_IN_LAYER charges nothing more; MEASURED_IN_LAYER charges the beside-layer rows' in-layer term
# (`in_layer_extra_ms`: the in-line pass less the pass less the all-reduces, per all-reduce, in
# paired rounds; rows of the measurement before those rounds are flagged and charged nothing).
# Charged alone (with the splits' transfers charged as `--transfer-beside auto` charges them), the
# term is what the TP=4 baselines pay at 1K-4K but up to 385 us per all-reduce more than they pay
# from 8K at llama3-70b; with the splits charged their pairs (`--transfer-beside pair`), it narrows
# every validation's worst point (docs/predict.md, The pair window).
#
# The term is timed with the layer's graphs sharing one clock (rounds of short spans), as `sweep`
# timed every choice before it settled each: studies timed so are what it was validated against. At
# each choice's own clock (sweep's default now: measure.settle_ms > 0) the baseline's compute runs
# faster beside its all-reduces, which draw a third to a half of the power cap, and at every study
# timed so the term made predict worse (llama3-70b at TP=2, median and worst 0.015 and 0.077 with
# it, 0.006 and 0.040 without; llama3-8b at TP=2 0.028 and 0.141 against 0.018 and 0.082; llama3-70b
# at TP=4 0.040 and 0.138 against 0.028 and 0.099: docs/predict.md, "At each choice's own clock").
# AUTO_IN_LAYER, the default, charges the term where the spec predicted is timed in shared spans
# (measure.settle_ms 0) and not where each choice settles (in_layer_for).
NO_IN_LAYER, MEASURED_IN_LAYER, AUTO_IN_LAYER = "none", "measured", "auto"
CHARGED_IN_LAYER = (NO_IN_LAYER, MEASURED_IN_LAYER)  # what a prediction charges, `auto` resolved
IN_LAYER = (AUTO_IN_LAYER, *CHARGED_IN_LAYER)


def in_layer_for(choice: str, settle_ms: float) -> str:
    """What `--in-layer choice` charges for a spec whose choices settle for `settle_ms` before their
    spans: `auto` is `measured` where they share one clock (0 ms), else `none`."""
    if choice != AUTO_IN_LAYER:
        return choice
    return MEASURED_IN_LAYER if settle_ms == 0 else NO_IN_LAYER


DEFAULT_IN_LAYER = AUTO_IN_LAYER

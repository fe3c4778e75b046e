"""Predicted against measured: every point of a measured TP=k study, its predicted speedup over
the default baseline beside the measured one, the picks per token count, the errors.

    python tests/checks/predict_validation.py --measured M.jsonl [M2.jsonl ...] --predicted P.jsonl [--markdown]

A predicted pick is "within 0.01" where its measured speedup is at most 0.01 below the measured
pick's (the target of docs/predict.md), and "agrees" where it is the measured pick, or its measured
speedup's 95% interval reaches the measured pick's speedup (within the measured noise). Picks are
among correct settings (no `no_comm`, no `comm: none`).

Beside the errors, the study's compute against the pieces': its `no_comm` ms per layer over the
predicted `no_comm` (the pieces' serial chain, which predict gives `no_comm` as it is) at each token
count. A study of other layer code, another GPU or clock state than its pieces is off there, and
its errors then mix the model's with that difference (COMPUTE_OFF)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.tuning.results import read_rows
from overlapbench.tuning.settling import at_own_clock

PICK_WITHIN = 0.01  # a predicted pick within this much speedup of the measured best counts as right
# A study's no_comm more than this fraction off its pieces' chain at some token count is flagged: a
# study and pieces of one layer code agree within 1-6% (2x H100: the 331cb63 studies and the d604491
# pieces; 4x H200: c1821fe and a9c1a0e; 2x H200: the bbc1676 steady rows at 16K-32K), where the 2x
# H200 9f356d8 studies, of older layer code than their bbc1676 pieces, ran 10-28% slower
# (docs/predict.md; tests/test_published_in_layer.py computes both ranges again).
COMPUTE_OFF = 0.08


def _key(row: dict) -> tuple:
    return row["strategy"], json.dumps(row["knobs"], sort_keys=True), tuple(row["batch"]), json.dumps(row.get("decode"))


def _label(row: dict) -> str:
    knobs = {k: v for k, v in row["knobs"].items() if v not in (None, "default") and k not in ("align", "split_offset")}
    return row["strategy"] + (" " + " ".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "")


def compare(measured: list[dict], predicted: list[dict]) -> dict:
    measured_by = {_key(r): r for r in measured if r["status"] == "ok" and r.get("speedup")}
    points, picks = [], []
    for p in predicted:
        m = measured_by.get(_key(p))
        if p["status"] != "ok" or m is None:
            continue
        points.append({"tokens": p["tokens"], "what": _label(p), "checked": p["checked"],
                       "measured": m["speedup"], "ci": m.get("speedup_ci"), "predicted": p["speedup"],
                       "error": p["speedup"] - m["speedup"]})
    for tokens in sorted({q["tokens"] for q in points}):
        here = [q for q in points if q["tokens"] == tokens and q["checked"]]
        best_m = max(here, key=lambda q: q["measured"])
        best_p = max(here, key=lambda q: q["predicted"])
        within = best_p is best_m or (best_p["ci"] is not None and best_p["ci"][1] >= (best_m["ci"] or [best_m["measured"]])[0])
        picks.append({"tokens": tokens, "measured_pick": best_m["what"], "measured_speedup": best_m["measured"],
                      "predicted_pick": best_p["what"], "its_measured_speedup": best_p["measured"],
                      "same": best_p is best_m, "within_noise": within,
                      "within": best_p["measured"] >= best_m["measured"] - PICK_WITHIN})
    errors = sorted(abs(q["error"]) for q in points)
    return {"points": points, "picks": picks,
            "median_abs_error": statistics.median(errors) if errors else None,
            "p90_abs_error": errors[int(0.9 * (len(errors) - 1))] if errors else None,
            "max_abs_error": errors[-1] if errors else None,
            "picks_agree": sum(p["within_noise"] for p in picks), "picks_same": sum(p["same"] for p in picks),
            "picks_within": sum(p["within"] for p in picks),
            "token_counts": len(picks), "compute": compute_vs_pieces(measured, predicted)}


def layer_ms(rows: list[dict], strategy: str, knobs: dict, layers: int | None = None) -> dict[int, float]:
    """Token count -> the ms per layer of the ok rows of `strategy` at exactly `knobs` (and
    `layers` where given); a token count whose rows give different times is an error."""
    found: dict[int, set[float]] = {}
    for r in rows:
        if r["status"] == "ok" and r["strategy"] == strategy and r["knobs"] == knobs and layers in (None, r["layers"]):
            found.setdefault(r["tokens"], set()).add(r["ms"])
    several = {t: sorted(v) for t, v in found.items() if len(v) > 1}
    if several:
        raise ValueError(f"{strategy} {knobs}: several times at one token count: {several}")
    return {t: v.pop() for t, v in sorted(found.items())}


def chain_ms(pieces: list[dict]) -> dict[int, float]:
    """Token count -> the pieces' serial chain (the stack with no communication, on one GPU:
    `sweep --pieces`'s "chain" rows, not pipelined) per layer: what predict gives `no_comm`."""
    out = {}
    for r in pieces:
        key = json.loads(r["key"])
        if r["status"] == "ok" and key["piece"] == "chain" and not key["pipelined"]:
            out[r["tokens"]] = r["ms"] / key["layers"]
    return out


def over(measured: dict[int, float], reference: dict[int, float]) -> dict[int, float]:
    """Token count -> how much longer `measured` took than `reference` there, as a fraction."""
    return {t: measured[t] / reference[t] - 1 for t in sorted(reference) if t in measured}


def compute_vs_pieces(measured: list[dict], predicted: list[dict]) -> dict:
    """The measured `no_comm` per layer over the predicted one (the pieces' chain) per token
    count, their median, the token counts off by more than COMPUTE_OFF, the measured rows' code,
    and whether they were timed each at its own clock (settled before its span, docs/timing.md)."""
    ratios = over(layer_ms(measured, "no_comm", {}), layer_ms(predicted, "no_comm", {}))
    no_comm = [r for r in measured if r["strategy"] == "no_comm" and r["status"] == "ok"]
    return {"by_tokens": ratios, "median": statistics.median(ratios.values()) if ratios else None,
            "off": [t for t, v in ratios.items() if abs(v) > COMPUTE_OFF],
            "code": sorted({r["git"] for r in no_comm if r.get("git")}),
            "own_clock": any(at_own_clock(r) for r in no_comm)}


def compute_why(compute: dict, chains_own_clock: bool | None) -> str:
    """What a flagged compute difference likely is: the clock where the study timed each choice at
    its own clock and the pieces' chains shared rounds (they run at the round's mean clock, above
    a heavy chain's own at the power cap: docs/predict.md), else other code."""
    return "chains in shared rounds" if compute["own_clock"] and chains_own_clock is False else "other code?"


def percent(fraction: float) -> str:
    """A fraction as the tables print it: "+22%", "-2%"."""
    return f"{round(fraction * 100):+d}%"


def compute_cell(compute: dict, why: str = "other code?") -> str:
    """The summary table's cell: the median, and a flag saying `why` where a token count is off."""
    if compute["median"] is None:
        return "no no_comm to compare"
    return percent(compute["median"]) + (f" ⚠ ({why})" if compute["off"] else "")


def compute_lines(compute: dict, pieces_code: str | None = None, chains_own_clock: bool | None = None) -> list[str]:
    """A section's account of its compute against the pieces: the ratio per token count, and where
    flagged, one sentence naming the study's and the pieces' code and clocks (`chains_own_clock`:
    whether the pieces' chains were timed each at its own clock; None where not known)."""
    ratios = compute["by_tokens"]
    if not ratios:
        return ["No `no_comm` both measured and predicted: the compute is not compared with the pieces'."]
    out = ["Compute against the pieces: the measured `no_comm` ms per layer over the predicted (the pieces' chain): "
           + ", ".join(f"{percent(v)} at {t}" for t, v in ratios.items()) + f"; median {percent(compute['median'])}."]
    if compute["off"]:
        study_clock = ", each choice at its own clock" if compute["own_clock"] else ", in shared spans"
        chains = {None: "", True: ", their chains each at its own clock", False: ", their chains in shared rounds"}
        pieces = f"; the pieces' of {pieces_code}{chains[chains_own_clock]}" if pieces_code else ""
        out += ["", f"⚠ These errors mix the model's with a compute difference: the study's `no_comm` is more than "
                f"{COMPUTE_OFF:.0%} off the pieces' chain at {len(compute['off'])} of {len(ratios)} token counts (the "
                f"study's rows are of {', '.join(compute['code']) or 'no named commit'}{study_clock}{pieces})."]
    return out


def markdown(name: str, result: dict, pieces_code: str | None = None, chains_own_clock: bool | None = None) -> str:
    """A comparison in full: its errors and picks, its compute against the pieces (`pieces_code`:
    the commit the pieces' rows name; `chains_own_clock`: whether their chains were timed each at
    its own clock), every point."""
    out = [f"## {name}", "",
           f"{len(result['points'])} points; |predicted - measured| speedup: median {result['median_abs_error']:.4f}, "
           f"90th percentile {result['p90_abs_error']:.4f}, worst {result['max_abs_error']:.4f}. "
           f"Picks: within 0.01 of the measured best at {result['picks_within']} of {result['token_counts']} token "
           f"counts, the same at {result['picks_same']}, within the measured noise at {result['picks_agree']}.", "",
           *compute_lines(result["compute"], pieces_code, chains_own_clock), "",
           "| tokens | measured pick | speedup | predicted pick | its measured speedup | agrees |",
           "|---:|---|---:|---|---:|---|"]
    for p in result["picks"]:
        agree = "same" if p["same"] else ("within noise" if p["within_noise"] else "no")
        out.append(f"| {p['tokens']} | {p['measured_pick']} | {p['measured_speedup']:.3f} | {p['predicted_pick']} | "
                   f"{p['its_measured_speedup']:.3f} | {agree} |")
    out += ["", "| tokens | strategy | measured | predicted | error |", "|---:|---|---:|---:|---:|"]
    for q in sorted(result["points"], key=lambda q: (q["tokens"], q["what"])):
        out.append(f"| {q['tokens']} | {q['what']} | {q['measured']:.3f} | {q['predicted']:.3f} | {q['error']:+.3f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", nargs="+", type=Path, required=True)
    parser.add_argument("--predicted", type=Path, required=True)
    parser.add_argument("--name", default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    measured = [r for path in args.measured for r in read_rows(path)]
    result = compare(measured, read_rows(args.predicted))
    if args.markdown:
        print(markdown(args.name or args.predicted.stem, result))
    else:
        print(json.dumps({k: v for k, v in result.items() if k != "points"}, indent=1))


if __name__ == "__main__":
    main()

"""Predicted against measured: every point of a measured TP=k study, its predicted speedup over
the default baseline beside the measured one, the picks per token count, the errors.

    python tests/checks/predict_validation.py --measured M.jsonl [M2.jsonl ...] --predicted P.jsonl [--markdown]

A predicted pick is "within 0.01" where its measured speedup is at most 0.01 below the measured
pick's (the target of docs/predict.md), and "agrees" where it is the measured pick, or its measured
speedup's 95% interval reaches the measured pick's speedup (within the measured noise). Picks are
among correct settings (no `no_comm`, no `comm: none`)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from overlapbench.tuning.results import read_rows

PICK_WITHIN = 0.01  # a predicted pick within this much speedup of the measured best counts as right


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
            "token_counts": len(picks)}


def markdown(name: str, result: dict) -> str:
    out = [f"## {name}", "",
           f"{len(result['points'])} points; |predicted - measured| speedup: median {result['median_abs_error']:.4f}, "
           f"90th percentile {result['p90_abs_error']:.4f}, worst {result['max_abs_error']:.4f}. "
           f"Picks: within 0.01 of the measured best at {result['picks_within']} of {result['token_counts']} token "
           f"counts, the same at {result['picks_same']}, within the measured noise at {result['picks_agree']}.", "",
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

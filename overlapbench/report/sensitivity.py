"""`--sensitivity S --tokens N`: one strategy's knob grid at one token count."""

from __future__ import annotations

import json
from collections import Counter

from overlapbench.errors import UserError, did_you_mean
from overlapbench.report.cells import NOISY, Grid, Shown, fmt_ms, sensitivity_legend, text_cell
from overlapbench.strategies.knobs import show_value
from overlapbench.tuning import analysis, batches, origin
from overlapbench.tuning.analysis import Group, Measured, Store

# -- sensitivity: one strategy's knob grid at one token count -------------------------------


def sensitivity_rows(store: Store, strategy: str, tokens: int) -> list[dict]:
    compared = [r for r in store.rows if analysis.compared(r)]
    measured = sorted({r["strategy"] for r in compared})
    if strategy not in measured:
        raise UserError(f"--sensitivity: '{strategy}' is not in the results{did_you_mean(strategy, measured)}; "
                        f"measured: {', '.join(measured)}")
    rows = [r for r in compared if r["strategy"] == strategy and r.get("tokens") == tokens]
    if not rows:
        counts = sorted({r.get("tokens") for r in compared if r["strategy"] == strategy})
        raise UserError(f"--tokens: {strategy} was measured at {', '.join(map(str, counts))} tokens, not at {tokens}")
    return rows


def varying(knob_sets: list[dict]) -> list[str]:
    """The knobs whose value differs between settings: the grid's axes."""
    names = list(dict.fromkeys(k for knobs in knob_sets for k in knobs))
    return [k for k in names if len({json.dumps(knobs.get(k)) for knobs in knob_sets}) > 1]


def _value_order(v) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) and not isinstance(v, bool) else (1, 0, str(v))


def sensitivity_grid(group: Group, rows: list[dict], ref: Measured | None, depth: str = "") -> Grid:
    """A line per combination of the varying knobs but the last, a column per value of the
    last (one `ms` column when only one knob varies, one cell when none does); `depth`: the
    title's ` (8 layers)` where the group was timed at several depths."""
    axes = varying([r["knobs"] for r in rows])
    outer, inner = (axes[:-1], axes[-1:]) if len(axes) > 1 else (axes, [])
    # a bound (comm: none, checked false) is not a correct result: tune never picks it, so it is never the star
    fastest = min((r["ms"] for r in rows if r.get("status") == "ok" and analysis.is_checked(r)), default=None)
    cols = _sorted_coords({_coord(r, inner) for r in rows})
    grid_rows = []
    for line in _sorted_coords({_coord(r, outer) for r in rows}):
        label = _label(outer, line) or analysis.knob_text(rows[0]["knobs"]) or "defaults"
        cells = [_knob_cell([r for r in rows if _coord(r, outer) == line and _coord(r, inner) == col], ref, fastest)
                 for col in cols]
        grid_rows.append([text_cell(label), *cells])
    header = [" / ".join(outer) or "knobs", *(f"{inner[0]}={_label(inner, col)}" if inner else "ms" for col in cols)]
    title = f"{group.label()}: {rows[0]['strategy']} at {rows[0]['tokens']} tokens{depth}"
    return Grid(title, header, grid_rows, _stacked(title, rows, axes, ref, fastest))


def _stacked(title: str, rows: list[dict], axes: list[str], ref: Measured | None, fastest: float | None) -> Grid:
    """The grid a line per knob setting, its figures first: what fits a narrow console (80 columns)."""
    lines = []
    for coord in _sorted_coords({_coord(r, axes) for r in rows}):
        match = [r for r in rows if _coord(r, axes) == coord]
        best, starred, noisy = _best(match, fastest)
        setting = " ".join(f"{k}={show_value(json.loads(v))}" for k, v in zip(axes, coord))
        setting = setting or analysis.knob_text(rows[0]["knobs"]) or "defaults"
        if best is None:
            figures = [match[0]["status"], "-"]
        else:
            figures = [fmt_ms(best["ms"]), "-" if ref is None else f"{ref.ms / best['ms']:.3f}x"]
            setting += "" if analysis.is_checked(best) else " (bound)"
        lines.append([*(Shown((text,), right=True) for text in figures),
                      Shown((setting,), starred, NOISY if noisy else "")])
    return Grid(title, ["ms", "speedup", "setting"], lines, compact=True)


def _coord(row: dict, names: list[str]) -> tuple[str, ...]:
    """A row's position along some knob axes (JSON text, so any value type compares)."""
    return tuple(json.dumps(row["knobs"].get(k)) for k in names)


def _sorted_coords(coords: set[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return sorted(coords, key=lambda c: [_value_order(json.loads(v)) for v in c])


def _label(names: list[str], coord: tuple[str, ...]) -> str:
    """`128` on a single axis (its name is in the header), `a=1 b=2` on several."""
    values = [show_value(json.loads(v)) for v in coord]
    return values[0] if len(names) == 1 else " ".join(f"{k}={v}" for k, v in zip(names, values))


def _best(match: list[dict], fastest: float | None) -> tuple[dict | None, bool, bool]:
    """The fastest ok row of a setting (None: none ok), whether it is the starred one, whether noisy."""
    ok = [r for r in match if r.get("status") == "ok"]
    if not ok:
        return None, False, False
    best = min(ok, key=lambda r: r["ms"])
    noisy = best.get("cv") is not None and best["cv"] > analysis.NOISY_CV
    return best, best["ms"] == fastest and analysis.is_checked(best), noisy


def _knob_cell(match: list[dict], ref: Measured | None, fastest: float | None) -> Shown:
    best, starred, noisy = _best(match, fastest)
    if best is None:
        return text_cell(match[0]["status"] if match else "-")
    speedup = [] if ref is None else [f"{ref.ms / best['ms']:.3f}x"]
    bound = [] if analysis.is_checked(best) else ["bound"]
    return Shown((f"{fmt_ms(best['ms'])} ms", *speedup, *bound), starred, NOISY if noisy else "")


def sensitivity_record(row: dict, ref: Measured | None) -> dict:
    """A setting's record; a predicted row's `timing` says so and its cv is null (never measured)."""
    ok, predicted = row.get("status") == "ok", origin.kind_of(row) == origin.PREDICTED
    return Group.of(row).fields() | {
        "tokens": row["tokens"], "layers": row.get("layers"), "strategy": row["strategy"], "knobs": row["knobs"],
        "status": row["status"],
        "timing": row.get("timing"), "ms": row.get("ms"), "cv": None if predicted else row.get("cv"),
        "run_id": row.get("run_id"),
        "speedup": ref.ms / row["ms"] if ok and ref is not None else None, "error": row.get("error"),
    }


def sensitivity_view(store: Store, strategy: str, tokens: int) -> tuple[list[Grid], list[dict], str]:
    """The grids, their records and their legend."""
    rows = sensitivity_rows(store, strategy, tokens)
    points = analysis.by_point(store.measured)
    grids, records = [], []
    # a grid per group and stack depth (rows of two depths are two workloads), the depth named
    # where a group has several
    grid_keys = sorted({(Group.of(r), r.get("layers")) for r in rows}, key=lambda k: (k[0].label(), k[1] or 0))
    depths = Counter(group for group, _ in grid_keys)
    for group, layers in grid_keys:
        mine = [r for r in rows if Group.of(r) == group and r.get("layers") == layers]
        # the reference must be of the same batch composition and depth
        composition = (tuple(mine[0].get("batch") or (tokens,)), batches.decode_of(mine[0]), layers)
        ref = analysis.reference(m for m in points.get(group, {}).get(tokens, []) if m.composition == composition)
        grids.append(sensitivity_grid(group, mine, ref, f" ({layers} layers)" if depths[group] > 1 else ""))
        records += [sensitivity_record(r, ref) for r in mine]
    return grids, records, sensitivity_legend(depths)



"""Output in nccl-tests' columns: progress lines, the table, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING

from overlapbench.comm.in_layer import TERM as IN_LAYER_TERM
from overlapbench.comm.pair import ATTENTION, MLP
from overlapbench.comm.pair import extra_field as pair_extra_field

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

FORMATS = ("table", "csv", "json")


def summary_line(row: dict) -> Text:
    """One progress line per row (literal text; our colours as styles)."""
    from overlapbench.printing import styled

    if row["status"] == "skipped":  # printed once per op and path
        return styled("  ", ("skipped", "yellow"), f" {row['op']} {row['strategy']}: {row['error']}")
    ctas = row["knobs"]["ctas"]
    what = f"{row['op']} {path_label(row)}{'' if ctas is None else f' ctas={ctas}'} {row['bytes']} B"
    if row["status"] != "ok":
        return styled("  ", (f"{row['status']:>7}", "red"), f" {what}: {row['error']}")
    kernel = f", NCCL {nccl_kernel(row)}" if row.get("nccl_kernel") else ""
    layer = ""
    if row.get("compute_loss") is not None:
        layer = (f"; beside the layer ({row['beside_layer']['tokens']} rows): {row['beside_ms'] * 1e3:.1f} us, "
                 f"compute loss {row['compute_loss']:.1%}, in line {_in_layer_us(row)}{_pairs_us(row)}")
    return styled("  ", (f"{'ok':>7}", "green"), f" {what}: {row['ms'] * 1e3:.1f} us, "
                  f"busbw {row['busbw']:.1f} GB/s, cv {row['cv']:.1%}{kernel}{layer}")


def _in_layer_us(row: dict) -> str:
    """The in-layer term per all-reduce with its 95% interval: +12.3 us [+9.8, +14.1]."""
    lo, hi = row.get("in_layer_extra_ci_ms") or (None, None)
    interval = "" if lo is None else f" [{lo * 1e3:+.1f}, {hi * 1e3:+.1f}]"
    return f"{row[IN_LAYER_TERM] * 1e3:+.1f} us{interval}" if row.get(IN_LAYER_TERM) is not None else "-"


def _pairs_us(row: dict) -> str:
    """Each block's pair extra beside one call (comm/pair.py), where the row holds them:
    ", pair +5.1 us attention, +12.0 us MLP"."""
    if row.get(pair_extra_field(ATTENTION)) is None:
        return ""
    return (f", pair {row[pair_extra_field(ATTENTION)] * 1e3:+.1f} us attention, "
            f"{row[pair_extra_field(MLP)] * 1e3:+.1f} us MLP")


COLUMNS = ("size", "count", "type", "op", "path", "ctas", "time_us", "algbw", "busbw", "wrong",
           "p10_us", "p90_us", "cv", "status", "error", "beside_us", "beside_busbw", "gemm_loss", "chunks",
           "nccl_kernel", "nccl_channels", "layer_tokens", "compute_loss", "in_layer_extra_us")


def nccl_kernel(row: dict) -> str:
    """The kernel NCCL's tuning log showed, with its channels: AllReduce_RSxLD_AGxST x8."""
    return f"{row['nccl_kernel']} x{row['nccl_channels']}"


def path_label(row: dict) -> str:
    """The path, with copy_engine_norm's chunk count where one was asked for."""
    chunks = row["knobs"].get("chunks")
    return row["strategy"] if chunks is None else f"{row['strategy']} chunks={chunks}"


def record(row: dict) -> dict:
    """One flat record per row, in nccl-tests' terms (GB/s for the bandwidths)."""
    us = lambda ms: None if ms is None else round(ms * 1e3, 3)
    sig = lambda x: None if x is None else float(f"{x:.4g}")
    return {
        "size": row["bytes"], "count": row["count"], "type": row["dtype"], "op": row["op"],
        "path": row["strategy"], "ctas": row["knobs"]["ctas"],
        "time_us": us(row.get("ms")), "algbw": sig(row.get("algbw")), "busbw": sig(row.get("busbw")),
        "wrong": row.get("wrong"), "p10_us": us(row.get("p10_ms")), "p90_us": us(row.get("p90_ms")),
        "cv": sig(row.get("cv")), "status": row["status"], "error": row.get("error"),
        # --beside-gemm: the path's time and busbw next to the GEMM stream, the GEMMs' TFLOP/s lost
        "beside_us": us(row.get("beside_ms")), "beside_busbw": sig(row.get("beside_busbw")),
        "gemm_loss": sig(row.get("gemm_loss")),
        "chunks": row["knobs"].get("chunks"),  # copy_engine_norm's, where asked for
        # NCCL paths: the kernel and channels its tuning log showed (a symmetric kernel's name, or algo/proto)
        "nccl_kernel": row.get("nccl_kernel"), "nccl_channels": row.get("nccl_channels"),
        # --beside-layer: the layer's rows, the share of its throughput the path took, and what
        # the blocking all-reduce cost in line with it beyond its time alone (comm/in_layer.py)
        "layer_tokens": (row.get("beside_layer") or {}).get("tokens"), "compute_loss": sig(row.get("compute_loss")),
        "in_layer_extra_us": us(row.get(IN_LAYER_TERM)),
    }


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if v is None else v for k, v in record(row).items()})
    return buf.getvalue()


def to_json(rows: list[dict]) -> str:
    return json.dumps([record(r) for r in rows], indent=1)


TEXT_COLUMNS = ("type", "op", "path", "NCCL kernel")


def _columns(rows: list[dict]) -> tuple[str, ...]:
    """The table's columns: nccl-tests' and ours, the NCCL kernel and beside-GEMM ones where any row has them."""
    names = ("size (B)", "count", "type", "op", "path", "ctas", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")
    names += ("NCCL kernel",) if any(r.get("nccl_kernel") for r in rows) else ()
    if any(r.get("beside_layer") for r in rows):
        return names + ("beside layer (us)", "busbw beside", "compute loss", "in line +us")
    beside = any(r.get("beside_ms") is not None for r in rows)
    return names + (("beside GEMM (us)", "busbw beside", "GEMM loss") if beside else ())


def _cells(row: dict, names: tuple[str, ...]) -> dict[str, str | Text]:
    """A measured (or failed) row's cells by column name."""
    from rich.text import Text

    ok = row["status"] == "ok"
    failed = Text("failed", style="red")
    ctas, wrong, b = row["knobs"]["ctas"], row.get("wrong"), row.get("beside_ms")
    cells = {
        "size (B)": str(row["bytes"]), "count": str(row["count"]), "type": row["dtype"], "op": row["op"],
        "path": path_label(row), "ctas": "-" if ctas is None else str(ctas),
        "time (us)": f"{row['ms'] * 1e3:.2f}" if ok else failed, "algbw (GB/s)": f"{row['algbw']:.2f}" if ok else failed,
        "busbw (GB/s)": f"{row['busbw']:.2f}" if ok else failed, "#wrong": "-" if wrong is None else str(wrong),
        "NCCL kernel": nccl_kernel(row) if row.get("nccl_kernel") else "-",
        "beside GEMM (us)": "-" if b is None else f"{b * 1e3:.2f}",
        "busbw beside": "-" if b is None else f"{row['beside_busbw']:.2f}",
        "GEMM loss": "-" if row.get("gemm_loss") is None else f"{row['gemm_loss']:.1%}",
        "beside layer (us)": "-" if b is None else f"{b * 1e3:.2f}",
        "compute loss": "-" if row.get("compute_loss") is None else f"{row['compute_loss']:.1%}",
        "in line +us": "-" if row.get(IN_LAYER_TERM) is None else f"{row[IN_LAYER_TERM] * 1e3:+.1f}",
    }
    return {name: cells[name] for name in names}


def _reasons(rows: list[dict]) -> Text | None:
    """One line per distinct reason a case did not run (literal: errors may hold brackets)."""
    from rich.text import Text

    reasons: dict[str, list[str]] = {}
    for row in rows:
        what = f"{row['op']}/{row['strategy']}"
        if row["status"] == "skipped":
            reasons.setdefault(row["error"], []).append(what)
        elif row["status"] != "ok":
            reasons.setdefault(f"failed: {row['error']}", []).append(f"{what}@{row['bytes']}")
    notes = [f"{', '.join(dict.fromkeys(where))}: {why}" for why, where in reasons.items()]
    return Text("\n".join(notes)) if notes else None


def to_table(rows: list[dict]) -> Table:
    """The rich table: measured rows, and one line per distinct reason a case did not run."""
    from rich.table import Table

    table = Table(title="overlapbench comm", title_justify="left", caption_justify="left", show_edge=False)
    names = _columns(rows)
    for name in names:
        table.add_column(name, justify="left" if name in TEXT_COLUMNS else "right")
    for row in rows:
        if row["status"] != "skipped":
            table.add_row(*_cells(row, names).values())
    table.caption = _reasons(rows)
    return table


NARROW = {"size (B)": "size (B)", "time (us)": "time", "algbw (GB/s)": "algbw", "busbw (GB/s)": "busbw",
          "#wrong": "#wrong", "NCCL kernel": "NCCL kernel"}  # the narrow form's headers: units in the title
NARROW_BESIDE = {"size (B)": "size (B)", "beside GEMM (us)": "time beside", "busbw beside": "busbw beside",
                 "GEMM loss": "GEMM loss", "beside layer (us)": "time beside", "compute loss": "compute loss",
                 "in line +us": "in line +us"}


def narrow_tables(rows: list[dict]) -> list[Table | Text]:
    """The table for a narrow console (a pipe counts as 80 columns): per case (op, path, CTAs,
    type: its title) a table of its sizes, and where it was timed beside the GEMMs a second one
    of those figures, each under its heading; no cell is wrapped or cut. The reasons a case did
    not run come last."""
    from rich.table import Table
    from rich.text import Text

    from overlapbench.printing import COMPACT

    cases: dict[str, list[dict]] = {}
    for row in rows:
        if row["status"] != "skipped":
            ctas = row["knobs"]["ctas"]
            title = f"{row['op']} {path_label(row)}{'' if ctas is None else f' ctas={ctas}'} {row['dtype']}"
            cases.setdefault(title, []).append(row)
    tables = []
    for title, members in cases.items():
        kinds = [(NARROW, f"{title}: time in us, bandwidths in GB/s")]
        if any(r.get("beside_layer") for r in members):
            units = ("time in us, busbw in GB/s, compute loss: the share of its throughput lost, in line +us: "
                     "the all-reduce's extra cost in line with it")
            kinds.append((NARROW_BESIDE, f"{title} beside the layer: {units}"))
        elif any(r.get("beside_ms") is not None for r in members):
            units = "time in us, busbw in GB/s, GEMM loss: the share of their TFLOP/s lost"
            kinds.append((NARROW_BESIDE, f"{title} beside the GEMMs: {units}"))
        for headers, heading in kinds:
            names = [n for n in headers if n in _columns(members)]
            tables.append(Text(heading, style="bold"))
            table = Table(**COMPACT)
            for name in names:
                table.add_column(headers[name], justify="left" if name in TEXT_COLUMNS else "right", no_wrap=True)
            for row in members:
                table.add_row(*_cells(row, tuple(names)).values())
            tables.append(table)
    reasons = _reasons(rows)
    return tables + ([reasons] if reasons is not None else [])


def render(rows: list[dict], fmt: str, console: Console) -> None:
    if fmt == "table":
        from overlapbench.printing import fits

        table = to_table(rows)
        for part in [table] if fits(console, table) else narrow_tables(rows):
            console.print(part, soft_wrap=False)  # the reasons wrap at the width
    else:
        console.file.write(to_csv(rows) if fmt == "csv" else to_json(rows) + "\n")
        console.file.flush()


def totals(rows: list[dict]) -> str:
    """nccl-tests' closing line: the wrong elements over all rows, and the row counts."""
    wrong = sum(r.get("wrong") or 0 for r in rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "skipped")}
    verdict = "OK" if not counts["failed"] else "FAILED"
    return f"# #wrong total: {wrong} ({verdict}); {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped"


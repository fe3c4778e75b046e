"""Output in nccl-tests' columns: progress lines, the table, CSV and JSON."""

from __future__ import annotations

import csv
import io
import json
from typing import TYPE_CHECKING

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
    return styled("  ", (f"{'ok':>7}", "green"), f" {what}: {row['ms'] * 1e3:.1f} us, "
                  f"busbw {row['busbw']:.1f} GB/s, cv {row['cv']:.1%}{kernel}")


COLUMNS = ("size", "count", "type", "op", "path", "ctas", "time_us", "algbw", "busbw", "wrong",
           "p10_us", "p90_us", "cv", "status", "error", "beside_us", "beside_busbw", "gemm_loss", "chunks",
           "nccl_kernel", "nccl_channels")


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


def to_table(rows: list[dict]) -> Table:
    """The rich table: measured rows, and one line per distinct reason a case did not run."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="overlapbench comm", title_justify="left", caption_justify="left", show_edge=False)
    beside = any(r.get("beside_ms") is not None for r in rows)
    kernels = any(r.get("nccl_kernel") for r in rows)
    extra = ("beside GEMM (us)", "busbw beside", "GEMM loss") if beside else ()
    names = ("size (B)", "count", "type", "op", "path", "ctas", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "#wrong")
    names += ("NCCL kernel",) if kernels else ()
    for name in names + extra:
        table.add_column(name, justify="left" if name in ("type", "op", "path", "NCCL kernel") else "right")
    reasons: dict[str, list[str]] = {}
    for row in rows:
        what = f"{row['op']}/{row['strategy']}"
        if row["status"] == "skipped":
            reasons.setdefault(row["error"], []).append(what)
            continue
        ok = row["status"] == "ok"
        if not ok:
            reasons.setdefault(f"failed: {row['error']}", []).append(f"{what}@{row['bytes']}")
        failed = [Text("failed", style="red")] * 3
        timed = [f"{row['ms'] * 1e3:.2f}", f"{row['algbw']:.2f}", f"{row['busbw']:.2f}"] if ok else failed
        ctas, wrong = row["knobs"]["ctas"], row.get("wrong")
        contention = []
        if beside:
            b = row.get("beside_ms")
            contention = ["-"] * 3 if b is None else [f"{b * 1e3:.2f}", f"{row['beside_busbw']:.2f}", f"{row['gemm_loss']:.1%}"]
        kernel = [nccl_kernel(row) if row.get("nccl_kernel") else "-"] if kernels else []
        table.add_row(str(row["bytes"]), str(row["count"]), row["dtype"], row["op"], path_label(row),
                      "-" if ctas is None else str(ctas), *timed, "-" if wrong is None else str(wrong), *kernel,
                      *contention)
    notes = [f"{', '.join(dict.fromkeys(where))}: {why}" for why, where in reasons.items()]
    table.caption = Text("\n".join(notes)) if notes else None  # literal: errors may hold brackets
    return table


def render(rows: list[dict], fmt: str, console: Console) -> None:
    if fmt == "table":
        from overlapbench.printing import print_table

        print_table(console, to_table(rows))  # a pipe or a file: no 80-column squeeze
    else:
        console.file.write(to_csv(rows) if fmt == "csv" else to_json(rows) + "\n")
        console.file.flush()


def totals(rows: list[dict]) -> str:
    """nccl-tests' closing line: the wrong elements over all rows, and the row counts."""
    wrong = sum(r.get("wrong") or 0 for r in rows)
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "failed", "skipped")}
    verdict = "OK" if not counts["failed"] else "FAILED"
    return f"# #wrong total: {wrong} ({verdict}); {counts['ok']} ok, {counts['failed']} failed, {counts['skipped']} skipped"


"""Report: strategies compared per token count, in the terminal and in machine-readable forms.

Four views of the same rows (read as tune reads them, `analysis`):
- the overview: per group (a layer workload, or a micro workload's GEMM), one line per token
  count, a column per strategy at its best knob setting: ms per layer (per GEMM), speedup over the
  group's reference (baseline; micro: sp_baseline), share of the exposed communication hidden
  (layer: against no_comm); the choice by tune's rule starred, noisy cells flagged; failed and
  skipped rows counted below;
- `--sensitivity S --tokens N`: one strategy's knob grid at one token count;
- `--compare OLD NEW`: per point, NEW/OLD with its interval, and with `--fail-above PCT` exit 1
  on a regression (above PCT and beyond the noise of both runs);
- `--plot FILE.png`: time per layer or GEMM (or speedup) against tokens, one line per strategy.
Under the overview, a line where one card computes slower than the others beyond the noise
(`cards`: every rank's own time of no_comm), and where points were timed through stacks of several
depths (`layers: [4, 8]`), the cost of one more layer (`steady`): marginal ms, speedup and share
hidden, with intervals.
Formats: `table` (rich), `markdown`, `csv` (pandas) and `json` (a list of records).

One module per view (`overview`, `cards`, `steady`, `sensitivity`, `compare`, `plot`), what a cell shows (`cells`),
rendering (`render`) and the command (`command`).
"""

from overlapbench.report.command import FORMATS, PLOT_METRICS, run

__all__ = ["FORMATS", "PLOT_METRICS", "run"]

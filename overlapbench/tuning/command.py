"""`overlapbench tune`: the results files to read, the tuned YAMLs written, and what each replaced."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from overlapbench import printing
from overlapbench.errors import UserError


@dataclass(kw_only=True)
class Options:
    """Choose the best strategy and knobs per token range; write one tuned YAML per
    (device, world size, tp, shape, dtype) of the layer workload (micro runs: see report). A
    strategy replaces a simpler one only if it is faster by --min-gain beyond the noise (95%
    interval of the speedup above 1 + min-gain; too few samples never replace); ties go to the
    simpler strategy. Each pick is also said against the fastest baseline setting (vs best)."""

    results: Annotated[list[Path] | None, typer.Argument(metavar="RESULTS.jsonl", help="Results files, read in order (a later row for a point wins). Default: the newest in results/ holding a sweep's rows (layer or micro; not comm's).")] = None
    out_dir: Annotated[Path, typer.Option("--out-dir", help="Where the tuned YAMLs go.")] = Path("results/tuned")
    min_gain: Annotated[float, typer.Option("--min-gain", metavar="FRACTION", help="How much faster, beyond the noise, a strategy must be to replace a simpler one (0.01: 1%; 0: any gain).")] = 0.01


def main(options: Options) -> int:
    """Tune the files given (or the newest sweep's), saying each YAML written and what it replaced."""
    from overlapbench.tuning import results as results_mod
    from overlapbench.tuning import tune as tune_mod
    from overlapbench.tuning.rows import WORKLOADS

    console, err_console = printing.console(), printing.console(stderr=True)
    say = lambda text: err_console.print(text, soft_wrap=True)
    paths = [results_mod.given_or_newest(p, WORKLOADS, say) for p in options.results or [None]]
    for path in paths:
        kinds = results_mod.workloads_in(path)
        if kinds and not kinds & set(WORKLOADS):
            raise UserError(f"{path}: holds {'/'.join(sorted(kinds))} rows, which tune does not choose from; tune reads a "
                            f"sweep's results (`overlapbench report {path}` shows these)")
    out_dir = options.out_dir
    before = {p: _tuned_summary(p) for p in out_dir.glob("*.yaml")} if out_dir.is_dir() else {}
    for path in tune_mod.run(paths, out_dir, console, options.min_gain):
        replaced = f" (replacing the config it held: {before[path]})" if path in before else ""
        console.print(f"wrote {path}{replaced}", soft_wrap=True)
    return 0


def _tuned_summary(path: Path) -> str:
    """What a tuned YAML chose, in one line: `runs c3fa158d765c: 1-1448 fused_norm, 1449-16384 token_split`."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
        runs = ", ".join(map(str, data["provenance"]["run_ids"]))
        picks = ", ".join(f"{r['tokens'][0]}-{r['tokens'][1]} {r['strategy']}" for r in data["rules"])
        return f"runs {runs}: {picks}"
    except (OSError, yaml.YAMLError, KeyError, TypeError, IndexError):
        return "a file that is not a tuned config"

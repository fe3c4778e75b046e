"""What a split's transfers cost its compute, per rank: a profiled point against its twin (the
same split with `comm: none`), from the graph-replay timelines `overlapbench sweep --profile`
writes. The comparison is report/twins.py's (what `report --profile` prints under a point whose
twin was profiled, for rank 0); this prints it for every rank asked.

Run: python tests/checks/twin_stretch.py FOLDER POINT TWIN [--ranks all] [--layers N]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from overlapbench.errors import UserError
from overlapbench.report import twins
from overlapbench.report.exposed import Timeline, read
from overlapbench.timing.timeline import file_name


def layers_of(point: str, layers: int | None) -> int:
    if layers is not None:
        return layers
    found = re.search(r"-(\d+)layers$", point)
    if not found:
        raise UserError(f"--layers: {point} does not end in -<N>layers; pass --layers N")
    return int(found.group(1))


def load(folder: Path, point: str, rank: int) -> Timeline:
    path = folder / file_name(point, replay=True, rank=rank)
    if not path.is_file():
        raise UserError(f"POINT/TWIN: no timeline {path}; name a point whose replay timeline the folder holds")
    return read(path)


def ranks_of(folder: Path, point: str, which: str) -> list[int]:
    if which == "all":
        return list(range(load(folder, point, 0).world or 1))
    try:
        return [int(r) for r in which.split(",")]
    except ValueError:
        raise UserError(f"--ranks: {which!r} is not 'all' or a list like 0,1") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("point")
    parser.add_argument("twin")
    parser.add_argument("--ranks", default="0", help="'all', or ranks like 0,1 (default 0)")
    parser.add_argument("--layers", type=int, default=None, help="layers per forward (default: the -<N>layers suffix)")
    args = parser.parse_args(argv)
    try:
        layers = layers_of(args.point, args.layers)
        found = [(rank, twins.compare(load(args.folder, args.point, rank), load(args.folder, args.twin, rank), layers))
                 for rank in ranks_of(args.folder, args.point, args.ranks)]
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"{args.point}\n  vs twin {args.twin}  ({layers} layers per forward)")
    for rank, stretch in found:
        (p, t) = stretch.wall
        print(f"rank {rank}: wall {p:.3f} ms per layer, its twin {t:.3f}")
        print("\n".join(twins.lines(stretch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

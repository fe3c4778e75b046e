"""A point's identity, and where a row came from: the device and world size it ran on, and whether
it was measured or predicted. Two rows of one point from different origins are two points: another
GPU's time, or a prediction, never stands for a measurement (tune, report, export and `--compare`
keep them apart). No torch, no pandas."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

PREDICTED = "predicted"  # a row's `timing` when `overlapbench predict` made it: no measurement behind it
MEASURED = "measured"
PREDICTED_MARK = " (predicted)"  # how a device name says so (predict writes it into the rows' `device`)
# An older row without a `key`: the fields that make its point (`row_key`).
_KEY_FIELDS = ("workload", "shape", "tp", "dtype", "layers", "seed", "batch", "decode", "strategy", "knobs")


def kind_of(row: dict) -> str:
    """`predicted` for a row `overlapbench predict` made, else `measured`."""
    return PREDICTED if row.get("timing") == PREDICTED else MEASURED


def identity(key: str, row: dict) -> str:
    """A point across files: its key (shape, tp, dtype, batch, strategy, knobs, ...), the device and
    world size it ran on, and whether it was measured or predicted. A row replaces another only
    where all of these agree."""
    return json.dumps([key, row.get("device"), row.get("world_size"), kind_of(row)])


def row_key(row: dict) -> str:
    """The point's key (what `--resume` matches in one file): the row's `key`, or the same fields
    when an older row lacks one. It names no device: `identity` adds it."""
    if row.get("key"):
        return row["key"]
    return json.dumps({name: row.get(name) for name in _KEY_FIELDS}, sort_keys=True)


def last_per_key(rows: Iterable[tuple[dict, str]]) -> list[tuple[dict, str]]:
    """A resumed sweep appends a new row for a point that failed: the last one is the truth.
    Points are told apart by `identity`: another device's row, or a prediction, both stay."""
    kept: dict[str, tuple[dict, str]] = {}
    for row, source in rows:
        key = identity(row_key(row), row)
        kept.pop(key, None)  # re-insert, so the order is that of the last occurrences
        kept[key] = (row, source)
    return list(kept.values())


def device_label(device: str, predicted: bool) -> str:
    """The device as headings name it: `(predicted)` added to a prediction's, where its name lacks it."""
    return device + PREDICTED_MARK if predicted and not device.endswith(PREDICTED_MARK) else device


def model_error(row: dict) -> float | None:
    """A predicted row's assumed absolute error of its speedup (`predict --error`), as it recorded it."""
    facts = row.get("predicted")
    error = facts.get("error") if isinstance(facts, dict) else None
    ok = isinstance(error, (int, float)) and not isinstance(error, bool) and error >= 0
    return float(error) if ok else None


def separated(setups: Counter, each: str) -> str | None:
    """One line saying which setups rows came from, where there are several ((device label, world
    size) -> rows): each is kept apart (`each`: what it gets) and never pooled with another. None
    for rows of one setup."""
    if len(setups) < 2:
        return None
    predicted = {device.endswith(PREDICTED_MARK) for device, _ in setups}
    devices = {device.removesuffix(PREDICTED_MARK) for device, _ in setups}
    worlds = len({world for _, world in setups}) > 1
    if len(predicted) > 1 and len(devices) == 1 and not worlds:
        subject = "measured and predicted rows"
    else:
        subject = f"rows of {len(setups)} {'setups' if worlds else 'devices'}"
        subject += " (measured and predicted)" if len(predicted) > 1 else ""
    items = "; ".join(f"{n} of {device}" + (f" on {world} ranks" if worlds else "")
                      for (device, world), n in sorted(setups.items()))
    return f"{subject} kept apart, never pooled ({each}): {items}"

"""Sizes and bandwidths in nccl-tests' terms: the -b/-e/-f ladder, its parsing, and the
algorithm and bus bandwidth formulas."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from overlapbench.errors import UserError, reject_unknown_keys, shown

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}  # the one table of a dtype's bytes per element
DTYPES = ("auto", *DTYPE_BYTES)  # what a spec's or an option's dtype may be: auto (bf16 on GPUs, fp32 on CPU)
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # torch attribute names
VECTOR_BYTES = 16  # symmetric-memory kernels move whole 16-byte vectors
GPU_SIZES = ("1M", "1G")  # default -b/-e on GPUs
CPU_SIZES = ("1K", "64K")  # and on CPU (gloo): a demo, not a measurement
BYTES_PER_SAMPLE = 64 * 2**20  # a timed sample repeats a small op until it moves about this much
MAX_OPS_PER_SAMPLE = 32


def bus_factor(op: str, world: int) -> float:
    """nccl-tests' busbw / algbw: all-reduce moves each byte over 2(n-1)/n links' worth,
    all-gather and reduce-scatter (n-1)/n."""
    share = (world - 1) / world
    return 2 * share if op == "all_reduce" else share


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 bytes, as nccl-tests)."""
    return nbytes / seconds / 1e9


def busbw(op: str, nbytes: int, seconds: float, world: int) -> float:
    return algbw(nbytes, seconds) * bus_factor(op, world)


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?", re.IGNORECASE)
_UNITS = {None: 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text: Any, where: str) -> int:
    """Bytes from 4096, '4096', '1K', '1M', '1GiB', '1.5M' (binary units, as nccl-tests)."""
    if isinstance(text, int) and not isinstance(text, bool):
        number, unit = Decimal(text), None
    else:
        match = _SIZE.fullmatch(str(text).strip()) if isinstance(text, str) else None
        if match is None:
            raise UserError(f"{where}: {shown(text)} is not a size; give bytes, optionally with K, M or G (e.g. 64K, 1M, 1G)")
        try:
            number, unit = Decimal(match[1]), (match[2] or "").lower() or None
        except InvalidOperation:  # pragma: no cover -- the regex admits only decimals
            raise UserError(f"{where}: {shown(text)} is not a size") from None
    value = number * _UNITS[unit]
    if value != value.to_integral_value() or value < 1:
        raise UserError(f"{where}: {shown(text)} is not a whole number of bytes >= 1")
    return int(value)


CLI_NAMES = ("-b/--min-bytes", "-e/--max-bytes", "-f/--factor")


def size_ladder(lo: int, hi: int, factor: int, names: tuple[str, str, str] = CLI_NAMES) -> tuple[int, ...]:
    """lo, lo*f, lo*f^2, ... up to hi: nccl-tests' -b -e -f. `names` name the three fields in
    errors (options on the command line, keys in a spec)."""
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        raise UserError(f"{names[2]}: must be an integer >= 2, got {shown(factor)}")
    if hi < lo:
        raise UserError(f"{names[1]}: {format_bytes(hi)} is below {names[0]} {format_bytes(lo)}")
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def comm_sizes(value: Any, cuda: bool, where: str) -> tuple[int, ...]:
    """A spec's `sizes`: a list of sizes, one size, or a ladder {min, max, factor}; by default
    the device's ladder (1M..1G by 2 on GPUs)."""
    if value is None:
        lo, hi = (parse_size(s, where) for s in (GPU_SIZES if cuda else CPU_SIZES))
        return size_ladder(lo, hi, 2)
    if isinstance(value, dict):
        reject_unknown_keys(value, ("min", "max", "factor"), where)
        if "min" not in value:
            raise UserError(f"{where}.min: missing; a ladder is {{min: 1M, max: 1G, factor: 2}}")
        lo = parse_size(value["min"], f"{where}.min")
        hi = parse_size(value.get("max", value["min"]), f"{where}.max")
        return size_ladder(lo, hi, value.get("factor", 2), (f"{where}.min", f"{where}.max", f"{where}.factor"))
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UserError(f"{where}: empty; give sizes like [1M, 16M] or a ladder {{min: 1M, max: 1G, factor: 2}}")
    sizes = tuple(parse_size(v, f"{where}[{i}]") for i, v in enumerate(items))
    repeated = [v for i, v in enumerate(sizes) if v in sizes[:i]]
    if repeated:
        raise UserError(f"{where}: {format_bytes(repeated[0])} is listed twice; remove the duplicate")
    return sizes


def format_bytes(n: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def ops_per_sample(nbytes: int, cuda: bool) -> int:
    """Back-to-back ops per timed sample: small ops are timed in batches, as nccl-tests does,
    so that launch gaps between them do not count as communication time."""
    if not cuda:
        return 1
    return max(1, min(MAX_OPS_PER_SAMPLE, BYTES_PER_SAMPLE // max(nbytes, 1)))


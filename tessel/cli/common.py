"""Arguments and output shared by every command: placements, memory limits, tables, files."""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import UsageError, quote
from ..io import is_file_ref as is_file_ref
from ..numeric import fmt as fmt
from ..numeric import integral as _number
from ..placement import MAX_DEVICES, MAX_VALUE, Placement, in_range, load_placement
from ..schedule import Schedule, check_task_count

__all__ = ["UsageError", "add_placement_args", "resolve_placement", "add_memory_arg", "parse_memory",
           "positive_int", "seconds", "fmt", "print_table", "print_summary"]
DEFAULT_DEVICES = 4
# options that shape a built-in placement; a placement or schedule file fixes all of them
BUILT_IN_OPTIONS = ("devices", "forward", "backward", "weight", "latency")


def add_placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("placement", metavar="PLACEMENT",
                   help="a built-in placement name (see `tessel placements`) or a JSON/YAML file")
    p.set_defaults(built_in_options_checked=True)
    g = p.add_argument_group("built-in placement options")
    g.add_argument("--devices", type=int, default=None, help=f"device count (default {DEFAULT_DEVICES})")
    g.add_argument("--forward", type=float, help="forward block duration")
    g.add_argument("--backward", type=float, help="backward block duration (B, the input gradient, where split)")
    g.add_argument("--weight", type=float, help="weight-gradient block duration (W; placements zb, zbv)")
    g.add_argument("--latency", type=float, help="cross-device edge latency")
    g.add_argument("--infer", action="store_true", help="forward-only (inference) form")


def resolve_placement(args: argparse.Namespace, tasks: bool = True) -> Placement:
    """A path when the file exists or looks like one, else a built-in name. With `tasks`, the
    command builds args.micro_batches x blocks tasks: refused over the task limit up front."""
    p = _placement(args)
    n = getattr(args, "micro_batches", None)
    if tasks and isinstance(n, int):
        check_task_count(p, n)
    return p


def _placement(args: argparse.Namespace) -> Placement:
    ref = args.placement
    from .. import library
    if is_file_ref(ref, library.PLACEMENTS):
        refuse_built_in_options(args, ref)
        p = load_placement(ref)
        return p.inference() if args.infer else p
    if ref not in library.PLACEMENTS:
        raise UsageError(f"unknown placement {quote(ref)} (and no such file); "
                         f"built-in: {', '.join(library.PLACEMENTS)}")
    devices = DEFAULT_DEVICES if args.devices is None else args.devices
    if not 1 <= devices <= MAX_DEVICES:
        raise UsageError(f"--devices must be 1..{MAX_DEVICES}, got {devices}")
    costs = {k: _number(getattr(args, k)) for k in BUILT_IN_OPTIONS[1:] if getattr(args, k, None) is not None}
    for k, v in costs.items():
        low = 0 if k == "latency" else None
        if not in_range(v, 0, MAX_VALUE) or (low is None and not v > 0):
            bound = ">= 0" if low is not None else "> 0"
            raise UsageError(f"--{k} must be a finite number {bound} (at most {MAX_VALUE:g}), got {v:g}")
    return library.build(ref, devices=devices, infer=args.infer, **costs)


def refuse_built_in_options(args: argparse.Namespace, ref: str) -> None:
    """--devices, --forward, ... shape built-in placements only; a file fixes them itself."""
    if not getattr(args, "built_in_options_checked", False):
        return
    given = [f"--{k}" for k in BUILT_IN_OPTIONS if getattr(args, k, None) is not None]
    if given:
        raise UsageError(f"{', '.join(given)} shape(s) a built-in placement; {ref} fixes its own "
                         "(edit the file, or give a built-in placement name)")


def add_memory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", type=parse_memory, metavar="M",
                   help="memory limit: one number for every device, or a comma list per device")


def parse_memory(text: str) -> float | list[float]:
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"memory limit must be numbers, got {text[:200]!r}") from None
    if len(vals) > MAX_DEVICES or not all(in_range(v, 0, MAX_VALUE) for v in vals):
        raise argparse.ArgumentTypeError(f"memory limit must be finite numbers in 0..{MAX_VALUE:g}, "
                                         f"one or one per device, got {text[:200]!r}")
    out = [_number(v) for v in vals]
    return out[0] if len(out) == 1 else out


MAX_SECONDS = 1_000_000.0  # ~11.6 days: any timeout or time limit; far beyond it timedelta and gloo overflow


def positive_float(what: str, unit: str, most: float = MAX_VALUE) -> Callable[[str], float]:
    """An argparse type: a finite number in (0, most]; errors say which value and in what unit."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} must be a number ({unit}), got {text[:200]!r}") from None
        if not (math.isfinite(v) and 0 < v <= most):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number > 0 and at most {most:g} ({unit}), "
                                             f"got {text[:200]!r}")
        return v
    return parse


seconds = positive_float("time limit", "seconds", MAX_SECONDS)


def finite_float(what: str, low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high]."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not (math.isfinite(v) and low <= v <= high):
            raise argparse.ArgumentTypeError(f"{what} must be a finite number in {low:g}..{high:g}, got {text[:200]!r}")
        return v
    return parse


def int_in(what: str, low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer in low..high (the text read no further than 40 characters)."""
    def parse(text: str) -> int:
        try:
            v: int | None = int(text) if len(text) <= 40 else None
        except ValueError:
            v = None
        if v is None or not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{what} must be an integer in {low:,}..{high:,}, got {text[:200]!r}")
        return v
    return parse


def positive_int(text: str) -> int:
    try:
        v = int(text[:40])
    except ValueError:
        v = 0
    if v < 1 or len(text) > 40:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text[:200]!r}")
    return v


def printable(text: str, lines: bool = True) -> str:
    """`text` with every character that could steer a terminal (escape sequences, carriage
    returns, bidi overrides; newlines too unless `lines`) shown as its Python escape, `\\x1b`."""
    if (text.replace("\n", "") if lines else text).isprintable():
        return text
    return "".join(c if c.isprintable() or (lines and c == "\n") else c.encode("unicode_escape").decode()
                   for c in text)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """Aligned columns; rich when writing to a terminal, plain text otherwise. Cells are shown
    escaped (ids and meta come from files) and never read as rich markup."""
    cells = [[printable(fmt(c), lines=False) for c in r] for r in rows]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
        t = Table(title=title)
        for h in headers:
            t.add_column(h)
        for r in cells:
            t.add_row(*(Text(c) for c in r))
        Console().print(t)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(title)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def print_summary(s: Schedule, recorded: bool = False) -> None:
    """The figures of one schedule, as `key: value` lines. With `recorded` (a schedule read from
    a file), what only the file's meta says is marked as recorded, not measured."""
    f = s.figures()
    for k in ("micro_batches", "period", "makespan", "lower_bound", "ratio", "bubble", "peak_memory",
              "memory_limit"):
        print(f"{k:>14}: {fmt(f[k])}")
    note = " (recorded in the file)" if recorded else ""
    for k in ("method", "status", "search_seconds"):
        if k in s.meta:  # escaped: a newline in a file's meta cannot print a line of its own
            print(f"{k:>14}: {printable(fmt(s.meta[k]), lines=False)[:200]}{note}")
    if recorded and "repetend_claim" in s.meta:
        print(f"{'repetend':>14}: {printable(fmt(s.meta['repetend_claim']), lines=False)[:200]}")


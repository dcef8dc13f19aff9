"""Arguments and output shared by every command: placements, memory limits, tables, files."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..numeric import fmt as fmt
from ..numeric import integral as _number
from ..placement import Placement, load_placement
from ..schedule import Schedule


class UsageError(ValueError):
    """Bad command-line input; printed as one line, exit 2."""


def add_placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("placement", metavar="PLACEMENT",
                   help="a built-in placement name (see `tessel placements`) or a JSON/YAML file")
    g = p.add_argument_group("built-in placement options")
    g.add_argument("--devices", type=int, default=4, help="device count (default 4)")
    g.add_argument("--forward", type=float, help="forward block duration")
    g.add_argument("--backward", type=float, help="backward block duration")
    g.add_argument("--latency", type=float, help="cross-device edge latency")
    g.add_argument("--infer", action="store_true", help="forward-only (inference) form")


def resolve_placement(args: argparse.Namespace) -> Placement:
    """A path when the file exists or looks like one, else a built-in name."""
    ref = args.placement
    if Path(ref).exists() or ref.endswith((".json", ".yaml", ".yml")):
        p = load_placement(ref)
        if args.infer:
            p = p.inference()
        return p
    from .. import library
    if args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    costs = {k: _number(getattr(args, k)) for k in ("forward", "backward", "latency")
             if getattr(args, k, None) is not None}
    return library.build(ref, devices=args.devices, infer=args.infer, **costs)


def add_memory_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory", type=parse_memory, metavar="M",
                   help="memory limit: one number for every device, or a comma list per device")


def parse_memory(text: str) -> float | list[float]:
    try:
        vals = [_number(float(x)) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"memory limit must be numbers, got {text!r}") from None
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"memory limit must be >= 0, got {text!r}")
    return vals[0] if len(vals) == 1 else vals


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    """Aligned columns; rich when writing to a terminal, plain text otherwise."""
    cells = [[fmt(c) for c in r] for r in rows]
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.table import Table
        t = Table(title=title)
        for h in headers:
            t.add_column(h)
        for r in cells:
            t.add_row(*r)
        Console().print(t)
        return
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    if title:
        print(title)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def print_summary(s: Schedule) -> None:
    """The figures of one schedule, as `key: value` lines."""
    f = s.figures()
    for k in ("micro_batches", "period", "makespan", "lower_bound", "ratio", "bubble", "peak_memory",
              "memory_limit"):
        print(f"{k:>14}: {fmt(f[k])}")
    for k in ("method", "status", "search_seconds"):
        if k in s.meta:
            print(f"{k:>14}: {fmt(s.meta[k])}")


"""`tessel search`: the schedule of a placement by the repetend search (modes tessel, fast, exact)."""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..search import MODES, search
from .common import add_memory_arg, add_placement_args, fmt, positive_int, print_summary, resolve_placement
from .outputs import add_output_args, write_outputs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help=f"search a schedule: repetend + completion (modes {', '.join(MODES)})",
                       description="Search the schedule of a placement for N micro-batches under per-device "
                                   "memory limits and print its figures. A search that hits its time limit "
                                   "returns the best schedule found and says so.")
    add_placement_args(p)
    p.add_argument("--micro-batches", "-n", type=positive_int, required=True, metavar="N", help="micro-batches")
    add_memory_arg(p)
    p.add_argument("--mode", choices=MODES, default="tessel",
                   help="tessel (default): solver repetend; fast: constructed repetend for large "
                        "placements; exact: the whole problem in one solve (small N)")
    p.add_argument("--time-limit", type=_seconds, metavar="S", help="seconds for the whole search")
    p.add_argument("--workers", type=positive_int, metavar="K", help="CP-SAT worker threads (default 2)")
    p.add_argument("--ascii", action="store_true", help="print the schedule as ASCII")
    add_output_args(p)
    p.set_defaults(func=_search)


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"time limit must be > 0 seconds, got {text!r}")
    return v


def _search(args: argparse.Namespace) -> int:
    placement = resolve_placement(args)
    with _progress() as progress:
        s = search(placement, args.micro_batches, memory=args.memory, mode=args.mode,
                   time_limit=args.time_limit, workers=args.workers, progress=progress)
    if args.ascii:
        print(s.ascii(), end="")
    print_summary(s)
    _print_search_meta(s.meta)
    write_outputs(s, args)
    return 0


def _progress() -> AbstractContextManager[Callable[[dict[str, Any]], None] | None]:
    """A live progress line on a terminal when the viz module is there; nothing otherwise."""
    try:
        from ..viz.progress import ProgressLine
    except ImportError:
        return contextlib.nullcontext(None)
    return ProgressLine("search")


def _print_search_meta(meta: dict[str, Any]) -> None:
    rows = [("period_optimal", meta.get("period_optimal")), ("period_lower_bound", meta.get("period_lower_bound")),
            ("gap", meta.get("gap")), ("base", meta.get("base")), ("statuses", _statuses(meta.get("statuses"))),
            ("seconds", _statuses(meta.get("seconds")))]
    for k, v in rows:
        if v is not None:
            print(f"{k:>14}: {fmt(v)}")
    if meta.get("repetend") == "none":
        print(f"{'repetend':>14}: none (too few micro-batches for a steady state)")
    if meta.get("status") == "time_limit":
        print(f"{'note':>14}: the time limit was hit; this is the best schedule found")


def _statuses(d: Any) -> str | None:
    if not isinstance(d, dict):
        return None
    return " ".join(f"{k}={fmt(v)}" for k, v in d.items())


"""`tessel search`: the schedule of a placement by the repetend search (modes tessel, fast, exact)."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..search import MODES, OBJECTIVES, command_clock, search
from ..viz.progress import ProgressLine
from .common import add_memory_arg, add_placement_args, fmt, positive_int, print_summary, resolve_placement, seconds
from .outputs import add_output_args, write_outputs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--objective", choices=OBJECTIVES, default="makespan",
                   help="makespan (default): first start to last end; span: the longest time from a "
                        "device's first start to its last end (the iteration time when iterations overlap)")
    p.add_argument("--time-limit", type=seconds, metavar="S",
                   help="seconds for the whole search, a wall clock (fast stops sooner when it stalls)")
    p.add_argument("--workers", type=positive_int, metavar="K", help="CP-SAT worker threads (default 1: the same schedule every run; more may be faster but can differ)")
    p.add_argument("--ascii", action="store_true", help="print the schedule as ASCII")
    add_output_args(p)
    p.set_defaults(func=_search)


def _search(args: argparse.Namespace) -> int:
    placement = resolve_placement(args)
    with ProgressLine("search") as progress:
        # the time limit counts from the command's start (CP-SAT loads on its clock)
        started = getattr(args, "started", None)
        clock = None if args.time_limit is None else command_clock(args.time_limit, started)
        s = search(placement, args.micro_batches, memory=args.memory, mode=args.mode, workers=args.workers,
                   progress=progress, objective=args.objective, started=started, clock=clock)
    if args.ascii:
        print(s.ascii(), end="")
    print_summary(s)
    _print_search_meta(s.meta)
    write_outputs(s, args)
    return 0


def _print_search_meta(meta: Mapping[str, Any]) -> None:
    undecided = meta.get("periods_undecided") or None
    bound = meta.get("lower_bound")
    proven = None if bound is None else f"{fmt(bound)} ({meta.get('bound_source', 'analytic')})"
    statuses = {k: v for k, v in (meta.get("statuses") or {}).items() if k != "periods_tried"}
    rows = [("period_optimal", meta.get("period_optimal")), ("period_lower_bound", meta.get("period_lower_bound")),
            ("undecided", undecided), ("proven_bound", proven), ("gap", meta.get("gap")),
            ("objective", meta.get("objective") if meta.get("objective") != "makespan" else None),
            ("base", meta.get("base")), ("statuses", _statuses(statuses)),
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


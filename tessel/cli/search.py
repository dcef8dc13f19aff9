"""`tessel search`: the schedule of a placement by the repetend search (modes tessel, fast, exact)."""
from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from ..render import schedule_legend
from ..search import MODES, OBJECTIVES, search
from ..viz.progress import ProgressLine
from .common import (
    UsageError,
    add_memory_arg,
    add_placement_args,
    fmt,
    positive_int,
    print_summary,
    resolve_placement,
    seconds,
)
from .outputs import add_output_args, write_outputs

# the search's time limit counts from the command's start (main's args.started; CP-SAT loads on
# its clock), less what printing, writing and the interpreter's exit take after a search
EXIT_SECONDS = 0.75


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
    p.add_argument("--allow-unbounded-memory", action="store_true",
                   help="search a placement whose memory does not return to 0 over a micro-batch (refused "
                        "otherwise: usually a typo or a backward that does not free its forward's memory)")
    add_output_args(p)
    p.set_defaults(func=_search)


def _search(args: argparse.Namespace) -> int:
    placement = resolve_placement(args)
    unbounded = [w for w in placement.warnings if "without bound" in w]
    if unbounded and not args.allow_unbounded_memory:
        raise UsageError(f"{unbounded[0]}: give each forward's memory back in its backward (a negative memory), "
                         "or pass --allow-unbounded-memory to search it anyway")
    with ProgressLine("search") as progress:
        limit = None if args.time_limit is None else max(args.time_limit - EXIT_SECONDS, args.time_limit * 0.75)
        s = search(placement, args.micro_batches, memory=args.memory, mode=args.mode, time_limit=limit,
                   workers=args.workers, progress=progress, objective=args.objective, started=getattr(args, "started", None))
    if args.ascii:
        print(s.ascii(), end="")
        print(schedule_legend(s), end="")
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


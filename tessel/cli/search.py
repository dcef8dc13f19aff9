"""`tessel search`: the schedule of a placement by the repetend search (modes tessel, fast, exact)."""
from __future__ import annotations

import argparse
from typing import Any

from ..render import schedule_legend
from ..schedule import Schedule
from ..search import MODES, OBJECTIVES, Budget, command_clock, search
from ..viz.progress import ProgressLine
from .common import UsageError, add_memory_arg, add_placement_args, fmt, positive_int, resolve_placement, seconds
from .outputs import add_output_args, write_outputs

MAX_WORKERS = 64  # CP-SAT threads: beyond a few per core each solve fails and the search falls back


def workers(text: str) -> int:
    """An argparse type: a worker-thread count, 1..MAX_WORKERS (refused above, not silently worse)."""
    k = positive_int(text)
    if k > MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"at most {MAX_WORKERS} worker threads, got {k}")
    return k


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
    p.add_argument("--prove", action="store_true",
                   help="once a good schedule is in hand, go on proving: the passes that only might improve "
                        "it run, solves run to their share of the time limit and the whole problem is solved "
                        "for a bound (default: answer first, stop the moment a schedule meets the best proven "
                        "bound, and skip those passes within 1%% of it)")
    p.add_argument("--workers", type=workers, metavar="K", help=f"CP-SAT worker threads, 1..{MAX_WORKERS} (default 1: the same schedule every run; more may be faster but can differ)")
    p.add_argument("--start", nargs="+", action="extend", default=[], metavar="SCHEDULE",
                   help="schedule files to start from (another generator's, an earlier run's): each device's order is "
                        "timed on this placement, raced and polished; the answer is never longer than they are")
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
    starts = {path: Schedule.load(path, check=True) for path in args.start}
    with ProgressLine("search") as progress:
        # the time limit counts from the command's start (CP-SAT loads on its clock)
        started = getattr(args, "started", None)
        clock = None if args.time_limit is None else command_clock(args.time_limit, started)
        s = search(placement, args.micro_batches, memory=args.memory, mode=args.mode, workers=args.workers,
                   progress=progress, objective=args.objective, started=started, clock=clock,
                   budget=Budget(prove=args.prove), starts=starts)
    if args.ascii:
        print(s.ascii(), end="")
        print(schedule_legend(s), end="")
    _print_search(s, bool(getattr(args, "verbose", False)))
    write_outputs(s, args)
    return 0


def _print_search(s: Schedule, verbose: bool) -> None:
    """The schedule's figures with one bound, the best proven, and one gap to it; how the
    search got there (the other bounds, statuses, seconds by phase) only with -v."""
    f, meta = s.figures(), s.meta
    bound = meta.get("lower_bound")
    proven = None if bound is None else f"{fmt(bound)} ({meta.get('bound_source', 'analytic')})"
    gap = meta.get("gap")
    rows: list[tuple[str, Any]] = [(k, f[k]) for k in ("micro_batches", "period", "makespan")]
    rows += [("bound", proven), ("gap", None if gap is None else f"{float(gap) * 100:.1f}%")]
    rows += [(k, f[k]) for k in ("bubble", "peak_memory", "memory_limit")]
    rows += [(k, meta.get(k)) for k in ("method", "status", "search_seconds")]
    rows.append(("objective", meta.get("objective") if meta.get("objective") != "makespan" else None))
    if verbose:
        statuses = {k: v for k, v in (meta.get("statuses") or {}).items() if k != "periods_tried"}
        rows += [("lower_bound", f["lower_bound"]), ("period_optimal", meta.get("period_optimal")),
                 ("period_lower_bound", meta.get("period_lower_bound")),
                 ("undecided", meta.get("periods_undecided") or None), ("base", meta.get("base")),
                 ("statuses", _statuses(statuses)), ("seconds", _statuses(meta.get("seconds")))]
    for k, v in rows:
        if v is not None:
            print(f"{k:>14}: {fmt(v)[:200]}")
    if meta.get("repetend") == "none":
        print(f"{'repetend':>14}: none (too few micro-batches for a steady state)")
    if meta.get("status") == "time_limit":
        print(f"{'note':>14}: the time limit was hit; this is the best schedule found")


def _statuses(d: Any) -> str | None:
    if not isinstance(d, dict):
        return None
    return " ".join(f"{k}={fmt(v)}" for k, v in d.items())


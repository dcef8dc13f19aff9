"""`tessel placements`, `show`, `baseline`, `check` and `compare`."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..baselines import BASELINES
from ..errors import TesselError
from ..io import read_document
from ..methods import METHODS
from ..placement import Placement
from ..schedule import FORMAT, Schedule, schedule_from_dict
from .common import (
    UsageError,
    add_memory_arg,
    add_placement_args,
    fmt,
    is_file_ref,
    positive_int,
    print_summary,
    print_table,
    refuse_built_in_options,
    resolve_placement,
    seconds,
)
from .outputs import add_output_args, picture_path, write_outputs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("placements", help="list the built-in placements",
                       description="List the built-in placements (use them by name wherever a PLACEMENT goes).")
    p.set_defaults(func=_placements)

    p = sub.add_parser("show", help="picture and figures of a placement or a schedule file",
                       description="A placement: one micro-batch as ASCII, load per device, critical path and "
                                   "lower bound. A schedule file: its ASCII picture and figures.")
    add_placement_args(p)
    p.add_argument("--micro-batches", type=positive_int, default=16, metavar="N",
                   help="micro-batches for the lower bound (default 16)")
    p.add_argument("--plot", metavar="FILE", type=picture_path, help="schedule files only: write a Gantt chart (.png or .svg)")
    p.set_defaults(func=_show)

    p = sub.add_parser("baseline", help=f"run a baseline schedule ({', '.join(BASELINES)})",
                       description="Build a baseline schedule for a placement and print its figures.")
    p.add_argument("name", metavar="NAME", help="one of " + ", ".join(BASELINES))
    add_placement_args(p)
    _add_run_args(p)
    add_output_args(p)
    p.add_argument("--ascii", action="store_true", help="print the schedule as ASCII")
    p.set_defaults(func=_baseline)

    p = sub.add_parser("check", help="validate a schedule file against the four rules",
                       description="Validate a schedule file; exit 1 naming the broken rule, 2 if unreadable.")
    p.add_argument("schedule", metavar="SCHEDULE", help="a schedule JSON file")
    p.set_defaults(func=_check)

    p = sub.add_parser("compare", help="table of every applicable method on one placement",
                       description="Run every method (or --methods) on a placement and compare their figures.")
    add_placement_args(p)
    _add_run_args(p)
    p.add_argument("--methods", metavar="A,B",
                   help=f"comma list of methods, from {', '.join(METHODS)} (default: all available)")
    p.add_argument("--time-limit", type=seconds, metavar="S", help="seconds per search method")
    p.add_argument("--plot", metavar="FILE", type=picture_path, help="write a bar chart of the comparison (.png or .svg)")
    p.set_defaults(func=_compare)


def _add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--micro-batches", "-n", type=positive_int, required=True, metavar="N", help="micro-batches")
    add_memory_arg(p)


# ---- placements, show ----------------------------------------------------------------------
def _placements(args: argparse.Namespace) -> int:
    from ..library import PLACEMENTS
    print_table(("name", "description"), [(k, d) for k, (_, d) in PLACEMENTS.items()])
    return 0


def _schedule_document(ref: str) -> dict[str, Any] | None:
    """The parsed file when `ref` is a schedule file, else None (a placement name or file)."""
    if not (ref.endswith(".json") and is_file_ref(ref) and Path(ref).is_file()):
        return None
    doc = read_document(ref)
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def _show(args: argparse.Namespace) -> int:
    doc = _schedule_document(args.placement)
    if doc is not None:
        refuse_built_in_options(args, args.placement)
        return _show_schedule(schedule_from_dict(doc, args.placement), args)
    if args.plot:
        raise UsageError("--plot draws a schedule; give a schedule file (or use `tessel baseline ... --plot`)")
    _show_placement(resolve_placement(args, tasks=False), args.micro_batches)
    return 0


def _show_schedule(s: Schedule, args: argparse.Namespace) -> int:
    """Picture and recomputed figures; an invalid schedule exits 1 naming its broken rules
    (with the picture when every task is there to draw)."""
    broken = s.violations()
    if not any(v.rule == 1 for v in broken):
        print(s.ascii(), end="")
    if broken:
        _print_invalid(args.placement, [str(v) for v in broken])
        return 1
    print_summary(s, recorded=True)
    write_outputs(s, argparse.Namespace(plot=args.plot))
    return 0


def _print_invalid(path: str, errors: list[str]) -> None:
    sys.stdout.flush()
    print(f"tessel: {path} is invalid:", file=sys.stderr)
    for e in errors:
        print(f"  {e}", file=sys.stderr)


def _show_placement(p: Placement, n: int) -> None:
    from .. import bounds
    from ..render import render_placement
    print(f"placement {p.name}: {p.devices} devices, {len(p.blocks)} blocks, {len(p.edges)} edges"
          + (f", latency {fmt(p.latency)}" if p.latency else ""))
    for w in p.warnings:
        print(f"warning: {w}")
    print(render_placement(p), end="")
    rows = []
    for d in range(p.devices):
        on = p.blocks_on(d)
        rows.append((d, len(on), p.loads[d], sum(b.memory for b in on if b.memory > 0)))
    print_table(("device", "blocks", "load", "memory per micro-batch"), rows)
    print(f"critical path: {fmt(bounds.paths(p).critical_path)}")
    print(f"period lower bound (busiest device's load): {fmt(bounds.period_lower_bound(p))}")
    print(f"lower bound for {n} micro-batches: {fmt(bounds.lower_bound(p, n))}")


# ---- baseline, check -------------------------------------------------------------------------
def _baseline(args: argparse.Namespace) -> int:
    if args.name not in BASELINES:
        raise UsageError(f"unknown baseline {args.name!r}; known: {', '.join(BASELINES)}")
    s = BASELINES[args.name](resolve_placement(args), args.micro_batches, args.memory)
    if args.ascii:
        print(s.ascii(), end="")
    print_summary(s)
    write_outputs(s, args)
    return 0


def _check(args: argparse.Namespace) -> int:
    s = Schedule.load(args.schedule)
    errors = s.errors()
    if errors:
        _print_invalid(args.schedule, errors)
        return 1
    print(f"valid: {args.schedule}")
    print_summary(s, recorded=True)
    return 0


# ---- compare ---------------------------------------------------------------------------------
def _compare(args: argparse.Namespace) -> int:
    from ..methods import available_methods
    known = available_methods()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else known
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise UsageError(f"unknown method(s) {', '.join(unknown)}; known: {', '.join(known)}")
    placement = resolve_placement(args)
    rows = [_compare_row(m, placement, args.micro_batches, args.memory, args.time_limit) for m in methods]
    print_table(("method", "makespan", "lower bound", "ratio", "bubble", "peak memory", "seconds", "note"),
                [(r["method"], r["makespan"], r["lower_bound"], r["ratio"], r["bubble"],
                  max(r["peak_memory"]) if r["peak_memory"] else None, r["seconds"], r["error"] or "")
                 for r in rows],
                title=f"{placement.name}, {args.micro_batches} micro-batches"
                      + (f", memory {fmt(args.memory)}" if args.memory is not None else ""))
    if args.plot:
        from ..viz.compare import plot_comparison
        plot_comparison(rows, args.plot, title=f"{placement.name}, N={args.micro_batches}")
        print(f"wrote {args.plot}")
    return 0


def _compare_row(method: str, p: Placement, n: int, memory: Any, time_limit: float | None) -> dict[str, Any]:
    """One method's figures; `error` says why it gave none (does not apply, over the limit, ...).
    A search method's --time-limit is its own: a command's clock (command_clock) from its start."""
    from ..methods import SEARCH_MODES, run_method, why_not_method
    row: dict[str, Any] = {"method": method, "makespan": None, "lower_bound": None, "ratio": None,
                           "bubble": None, "peak_memory": None, "seconds": None, "error": why_not_method(method, p)}
    if row["error"]:
        return row
    t0 = time.perf_counter()
    opts: dict[str, Any] = {}
    if time_limit is not None and method in SEARCH_MODES:
        from ..search import command_clock
        opts["clock"] = command_clock(time_limit, t0)
    try:
        s = run_method(method, p, n, memory, **opts)
    except TesselError as e:  # does not fit, over the limit, no schedule found
        row["error"] = str(e)
        return row
    f = s.figures()
    row.update(makespan=f["makespan"], lower_bound=f["lower_bound"], ratio=f["ratio"], bubble=f["bubble"],
               peak_memory=f["peak_memory"], seconds=round(time.perf_counter() - t0, 3))
    return row

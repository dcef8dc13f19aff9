"""The steady state of the rows bench/bound_gap.py leaves open: how short a repetend of 1 or 2
micro-batches can be under a row's memory, against the least period per micro-batch any
argument allows (Problem.period_floor: the busiest device's load, Little's law on the limits).

A row's makespan is about N times its steady period plus the fill; where the shortest repetend
is well above the floor, the floor (and every bound built on it) is what leaves the gap open,
not the schedule. Each case is a zbv placement (bench/vpeers.py's Config, 4p micro-batches: the
period does not depend on N) under the memory limits a --rows cache recorded for it (V-Min's by
default). Per copies, a bisection over the period per micro-batch: each solve_period gets
--seconds (one worker); "infeasible" is CP-SAT's proof that no pattern fits within the span the
search allows (every block at most a period after its inputs: repetend._horizon), "unknown" is
undecided. Cases run --jobs at a time.

    .venv/bin/python bench/vmin_periods.py --rows bench/results/peers-v-full.jsonl \\
        --case 6,0 --case 6,1 --case 8,0 --case 8,1 --case 16,1 --seconds 30 --jobs 2 \\
        -o bench/results/vmin_periods.md
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vpeers import Config  # noqa: E402

from tessel.io import atomic_write  # noqa: E402
from tessel.search.budget import Clock  # noqa: E402
from tessel.search.problem import Problem, make_problem  # noqa: E402
from tessel.search.repetend import solve_period  # noqa: E402

Case = tuple[int, bool]  # devices, latency


def limits(path: str, memory: str, costs: str) -> dict[Case, list[float]]:
    """Each zbv case's memory limits as the --rows cache recorded them (the first row of the case)."""
    out: dict[Case, list[float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            key = json.loads(line)["key"]
            if key.get("kind") == "row" and key["shape"] == "zbv" and key["costs"] == costs \
                    and str(key.get("memory", "")).startswith(memory):
                out.setdefault((key["p"], key["latency"]), key["limit"])
    return out


def bisect(problem: Problem, copies: int, lo: int, hi: int, seconds: float, steps: int) -> dict[str, Any]:
    """Between `lo` (no proof yet) and `hi` (grid units of one repetition): the highest period
    proven infeasible, the lowest found (per micro-batch, and its period in grid units) and the
    solves in between. An undecided solve moves the next one up, toward what is found (so each
    infeasible or undecided period is above the last)."""
    proven, found, undecided, solves = None, None, None, []
    top = hi
    for _ in range(steps):
        if lo >= top:
            break
        mid = (lo + top) // 2
        t0 = time.perf_counter()
        res = solve_period(problem, mid, Clock(seconds), 1, copies=copies)
        per = round(problem.real(mid) / copies, 4)
        solves.append((per, res.status, round(time.perf_counter() - t0, 1)))
        if res.found:
            found, top = per, mid
        elif res.status == "infeasible":
            proven, lo = per, mid + 1
        else:
            undecided, lo = per, mid + 1
    return dict(infeasible=proven, undecided=undecided, found=found, period=None if found is None else top,
                solves=solves)


def run_case(args: tuple[Case, list[float], str, float, int, float, tuple[int, ...]]) -> dict[str, Any]:
    (p, lat), limit, costs, seconds, steps, above, copies_tried = args
    problem = make_problem(Config(p, 4 * p, costs, lat).placement("zbv"), tuple(limit))
    floor = problem.period_floor  # grid units per micro-batch
    out: dict[str, Any] = dict(p=p, latency=lat, limit=limit, floor=round(float(floor) * problem.resolution, 4),
                               load=round(problem.real(problem.period_bound), 4))
    for copies in copies_tried:
        lo = math.ceil(floor * copies)
        out[f"copies{copies}"] = bisect(problem, copies, lo, math.ceil(lo * above), seconds, steps)
    return out


def cell(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def table(results: Sequence[dict[str, Any]]) -> list[str]:
    head = ["p", "latency", "limit", "load / mb", "floor / mb", "1 copy: infeasible at", "undecided at",
            "found at", "2 copies: infeasible at", "undecided at", "found at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        none = dict(infeasible=None, undecided=None, found=None)
        one, two = r.get("copies1", none), r.get("copies2", none)
        lim = sorted(set(r["limit"]))
        lines.append("| " + " | ".join([
            str(r["p"]), "yes" if r["latency"] else "no", "/".join(f"{x:g}" for x in lim), cell(r["load"]),
            cell(r["floor"]), *(cell(c[k]) for c in (one, two) for k in ("infeasible", "undecided", "found"))]) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", required=True, help="a bench/vpeers.py cache (JSON lines) with the rows' limits")
    ap.add_argument("--memory", default="V-Min", help="the rows' memory (a peer's name, as the cache has it)")
    ap.add_argument("--costs", default="profiled")
    ap.add_argument("--case", action="append", default=[], help="P,LATENCY (0/1); repeat")
    ap.add_argument("--seconds", type=float, default=30.0, help="per solve")
    ap.add_argument("--steps", type=int, default=7, help="solves per bisection")
    ap.add_argument("--above", type=float, default=1.3, help="bisect up to this times the floor")
    ap.add_argument("--copies", type=int, nargs="+", default=[1, 2], help="repetend sizes, each bisected")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("-o", "--out", default="bench/results/vmin_periods.md")
    args = ap.parse_args(argv)
    known = limits(args.rows, args.memory, args.costs)
    cases = [(int(p), lat == "1") for p, lat in (c.split(",") for c in args.case)] or sorted(known)
    missing = [c for c in cases if c not in known]
    if missing:
        sys.exit(f"vmin_periods: no {args.memory} row in {args.rows} for (p, latency) {missing}")
    work = [(c, known[c], args.costs, args.seconds, args.steps, args.above, tuple(args.copies))
            for c in cases]
    t0 = time.perf_counter()
    with multiprocessing.Pool(max(1, args.jobs)) as pool:
        results = pool.map(run_case, work)
    lines = [
        "# The shortest repetends of the open V-Min rows", "",
        f"`{' '.join(['.venv/bin/python bench/vmin_periods.py', *sys.argv[1:]])}` "
        f"({time.perf_counter() - t0:.0f} s, {platform.node() or 'this machine'}, {args.jobs} jobs).", "",
        f"zbv, {args.costs} costs, the memory of {args.memory}'s rows in {args.rows}. Periods are per micro-batch "
        f"(a 2-copy repetend's period / 2); {args.seconds:g} s per solve, one worker.", "", *table(results), "",
        "Solves, per case and copies (period per micro-batch, status, seconds):", "",
        *(f"- p {r['p']}, latency {'yes' if r['latency'] else 'no'}, {c} cop{'y' if c == 1 else 'ies'}: "
          + ", ".join(f"{x} {s} {t}s" for x, s, t in r[f'copies{c}']['solves'])
          for r in results for c in args.copies),
    ]
    text = "\n".join(lines) + "\n"
    atomic_write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()

"""The tour that `make demo` runs: search three built-in placements, compare, draw, report.

    python -m tessel.demo [OUTDIR]        (default OUTDIR: out)

For the M, K and X shapes at 4 devices it searches a schedule (mode `tessel`), runs every
applicable baseline, and writes under OUTDIR: each schedule as JSON, Gantt charts (PNG) and
Chrome/Perfetto traces of the searched schedule and of the best baseline, a comparison chart per
placement, makespan over N for the first placement, and `report.md` embedding all of it with the
comparison tables. Without the search module the tour compares the baselines only and says so.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import library
from .io import atomic_write
from .methods import available_methods, run_method, why_not_method
from .numeric import fmt
from .placement import Number, Placement
from .render import render_placement
from .schedule import Schedule, ScheduleError
from .viz.compare import plot_comparison, plot_scaling
from .viz.gantt import plot_schedule
from .viz.trace import write_trace

log = logging.getLogger(__name__)
Say = Callable[[str], None]
SEARCH = "tessel"
SKIPPED = ("fast", "exact")  # the tour shows the default mode; `tessel compare` runs the others


@dataclass(frozen=True)
class Case:
    """One stop of the tour: a built-in placement, its device count and memory limit."""
    placement: str
    title: str
    memory: Number | None
    devices: int = 4


CASES = (Case("mshape", "M shape", 6), Case("kshape", "K shape", 6), Case("xshape", "X shape", 8))


@dataclass
class Stop:
    """What one case produced: comparison rows and the files written, relative to OUTDIR."""
    case: Case
    placement: Placement
    rows: list[dict[str, Any]] = field(default_factory=list)
    charts: dict[str, str] = field(default_factory=dict)
    traces: dict[str, str] = field(default_factory=dict)
    schedules: dict[str, str] = field(default_factory=dict)


def row_of(method: str, s: Schedule | None, seconds: float | None, error: str | None) -> dict[str, Any]:
    """A comparison row in the shape `tessel compare` uses (see tessel.viz.compare)."""
    row: dict[str, Any] = {"method": method, "micro_batches": None, "makespan": None,
                           "lower_bound": None, "ratio": None, "bubble": None, "peak_memory": None,
                           "seconds": seconds, "error": error}
    if s is not None:
        f = s.figures()
        row.update({k: f[k] for k in ("micro_batches", "makespan", "lower_bound", "ratio", "bubble",
                                      "peak_memory")})
    return row


def methods_for(p: Placement) -> tuple[list[str], str | None]:
    """The tour's methods for a placement, and a note when the search cannot run here."""
    have = available_methods()
    note = None if SEARCH in have else "the search module is not available here: baselines only"
    return [m for m in have if m not in SKIPPED and why_not_method(m, p) is None], note


def run_one(method: str, p: Placement, n: int, memory: Number | None,
            time_limit: float) -> tuple[Schedule | None, dict[str, Any]]:
    opts = {"time_limit": time_limit} if method == SEARCH else {}
    t0 = time.perf_counter()
    try:
        s = run_method(method, p, n, memory, **opts)
    except (ScheduleError, ValueError) as e:  # e.g. a baseline over the memory limit
        return None, row_of(method, None, None, str(e))
    seconds = round(time.perf_counter() - t0, 3)
    return s, row_of(method, s, seconds, None)


def run_case(case: Case, outdir: Path, n: int, time_limit: float, say: Say) -> Stop:
    p = library.build(case.placement, devices=case.devices)
    stop = Stop(case, p)
    methods, _ = methods_for(p)
    found: dict[str, Schedule] = {}
    for m in methods:
        s, row = run_one(m, p, n, case.memory, time_limit)
        stop.rows.append(row)
        say(f"  {case.placement:8} {m:12} " + (f"makespan {row['makespan']:g} "
            f"(lower bound {row['lower_bound']:g})  {row['seconds']:.2f}s" if s else f"-- {row['error']}"))
        if s is not None:
            found[m] = s
            stop.schedules[m] = _rel(outdir, _save(s, outdir / case.placement / f"{m}.json"))
    for m in _pictured(found):
        stop.charts[m] = _rel(outdir, plot_schedule(found[m], outdir / case.placement / f"{m}.png"))
        stop.traces[m] = _rel(outdir, write_trace(found[m], outdir / case.placement / f"{m}.trace.json"))
    title = f"{case.title} ({p.name}), N = {n}, memory limit {case.memory}"
    stop.charts["compare"] = _rel(outdir, plot_comparison(stop.rows, outdir / case.placement / "compare.png",
                                                          title=title))
    return stop


def _pictured(found: dict[str, Schedule]) -> list[str]:
    """The searched schedule and the best baseline: the two a reader wants side by side."""
    baselines = sorted((s.makespan, m) for m, s in found.items() if m != SEARCH)
    return ([SEARCH] if SEARCH in found else []) + [m for _, m in baselines[:1]]


def _save(s: Schedule, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)  # atomic_write no longer creates directories
    s.save(path)
    return path


def _rel(outdir: Path, path: Path) -> str:
    return path.relative_to(outdir).as_posix()


def scaling(case: Case, outdir: Path, sizes: Sequence[int], time_limit: float, say: Say) -> str:
    """Makespan over N for every method of the case: lines and the lower bound."""
    p = library.build(case.placement, devices=case.devices)
    methods, _ = methods_for(p)
    rows = []
    for n in sizes:
        for m in methods:
            rows.append(run_one(m, p, n, case.memory, time_limit)[1])
        say(f"  {case.placement:8} N = {n}: {len(methods)} methods")
    title = f"{case.title} ({p.name}), memory limit {case.memory}: makespan over N"
    return _rel(outdir, plot_scaling(rows, outdir / f"scaling-{case.placement}.png", title=title))


def tour(outdir: str | Path, cases: Sequence[Case] = CASES, micro_batches: int = 16,
         sizes: Sequence[int] = (8, 16, 32, 64, 128), time_limit: float = 10.0,
         say: Say = log.info) -> Path:
    """Run the tour, write every file under `outdir`, return the path of report.md."""
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    stops = []
    note = methods_for(library.build(cases[0].placement, devices=cases[0].devices))[1] if cases else None
    if note:
        log.warning("%s", note)
    for case in cases:
        say(f"{case.title}: {case.placement} at {case.devices} devices, N = {micro_batches}, "
            f"memory limit {case.memory}")
        stops.append(run_case(case, out, micro_batches, time_limit, say))
    scale_chart = None
    if sizes and cases:
        say(f"makespan over N for {cases[0].placement}")
        scale_chart = scaling(cases[0], out, sizes, time_limit, say)
    report = out / "report.md"
    atomic_write(report, render_report(stops, scale_chart, micro_batches, time.perf_counter() - t0, note))
    return report


# ---- the report ------------------------------------------------------------------------------
def render_report(stops: Sequence[Stop], scale_chart: str | None, n: int, seconds: float,
                  note: str | None = None) -> str:
    lines = ["# Tessel: a short tour", "",
             f"Built-in placements, {n} micro-batches each, under a per-device memory limit: "
             "the schedule Tessel searches (mode `tessel`: optimal repetend, then completion) "
             "next to every baseline that applies. *ratio* is makespan / lower bound "
             "(1.0 is the physical limit); *bubble* the idle share of all devices' time. Traces "
             "(`*.trace.json`) open in https://ui.perfetto.dev or chrome://tracing.",
             "", f"Written by `python -m tessel.demo` in {seconds:.0f} s.", ""]
    if note:
        lines += [f"> Note: {note}.", ""]
    lines += [_summary(stops), ""]
    for stop in stops:
        lines += _stop_section(stop)
    if scale_chart:
        lines += ["## Makespan over the number of micro-batches", "",
                  "The same comparison for N from 8 to 128 on the first placement; the dashed "
                  "red line is the lower bound.", "", f"![makespan over N]({scale_chart})", ""]
    lines += ["## Reproduce", "", "```",
              *(f"tessel compare {s.case.placement} --devices {s.case.devices} --micro-batches {n} "
                f"--memory {s.case.memory} --plot {s.case.placement}.png" for s in stops),
              "```", ""]
    return "\n".join(lines)


def _stop_section(stop: Stop) -> list[str]:
    c, p = stop.case, stop.placement
    lines = [f"## {c.title}: `{p.name}`, memory limit {c.memory}", "",
             _sentence(library.PLACEMENTS[c.placement][1]) + " One micro-batch, each block as early as its "
             "inputs allow:", "", "```", render_placement(p).rstrip(), "```", "",
             _table(stop.rows), "", f"![comparison]({stop.charts['compare']})", ""]
    for m, chart in stop.charts.items():
        if m == "compare":
            continue
        what = "searched schedule" if m == SEARCH else "best baseline"
        lines += [f"### {m} ({what})", "", f"![{m} Gantt chart]({chart})", "",
                  f"Schedule: [{stop.schedules[m]}]({stop.schedules[m]}), "
                  f"trace: [{stop.traces[m]}]({stop.traces[m]})", ""]
    return lines


def _summary(stops: Sequence[Stop]) -> str:
    """One line per placement: the bound, the searched makespan and the best baseline's."""
    out = ["| placement | lower bound | tessel | best baseline | tessel saves |", "|---|---|---|---|---|"]
    for stop in stops:
        ok = {r["method"]: r for r in stop.rows if r["makespan"] is not None}
        base = min((r for m, r in ok.items() if m != SEARCH), key=lambda r: r["makespan"], default=None)
        ours = ok.get(SEARCH)
        bound = next(iter(ok.values()))["lower_bound"] if ok else None
        cells = [stop.placement.name, _num(bound), _num(ours and ours["makespan"]),
                 f"{_num(base['makespan'])} ({base['method']})" if base else "–",
                 f"{1 - ours['makespan'] / base['makespan']:.1%}" if ours and base else "–"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _num(x: Any) -> str:
    return fmt(x, digits=6, none="–")


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _table(rows: Sequence[dict[str, Any]]) -> str:
    head = ["method", "makespan", "lower bound", "ratio", "bubble", "peak memory", "seconds", "note"]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    best = min((r["makespan"] for r in rows if r["makespan"] is not None), default=None)
    for r in rows:
        if r["error"]:
            out.append(f"| {r['method']} | – | – | – | – | – | – | {r['error']} |")
            continue
        ms = f"**{r['makespan']:g}**" if r["makespan"] == best else f"{r['makespan']:g}"
        out.append(f"| {r['method']} | {ms} | {r['lower_bound']:g} | {r['ratio']:.3f} | "
                   f"{r['bubble']:.1%} | {max(r['peak_memory']):g} | {r['seconds']:.2f} | |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessel.demo", description=__doc__.splitlines()[0])
    ap.add_argument("outdir", nargs="?", default="out", help="where to write (default: out)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    t0 = time.perf_counter()
    report = tour(args.outdir, say=print)
    print(f"wrote {report} in {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

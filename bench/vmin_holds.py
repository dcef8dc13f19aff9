"""Where the open V-Min rows' steady state goes: each device's memory holds against their least.

Little's law on one device: over the steady state a device with limit L holds, per micro-batch,
H = the sum over its memory pairs of (release's end - allocation's start) x amount, so the
micro-batches cannot come faster than one per H / L, and H is at least H* (each pair's longest
path, holds.hold_time). The bounds grow at max(load, H* / L) per micro-batch; a schedule's steady
interval is at least H / L, and more where the device's memory sits below L. So on a row the
proven gap leaves open, this says which of the two a schedule loses to: the holds' waits (H - H*,
time a micro-batch's activations wait on other devices' queues) or memory left idle.

Each row: the default search (--time-limit s) under the limits a bench/vpeers.py cache recorded
(--rows, per device count and latency as bench/vmin_periods.py reads them), its schedule checked
by ../shared/tools/check_schedule.py; the steady state is the middle half of the micro-batches (by
index), the interval the mean gap between the starts of the device's longest-held allocation.

    .venv/bin/python bench/vmin_holds.py --rows bench/results/peers-v-full.jsonl \\
        --case 6,24,0 --case 8,16,0 --case 8,32,0 --case 8,32,1 -o bench/results/vmin_holds.md
"""
from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from random_dags import checked  # noqa: E402
from vmin_periods import limits  # noqa: E402
from vpeers import Config  # noqa: E402

from tessel.holds import hold_time  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.schedule import EPS, Schedule  # noqa: E402
from tessel.search import search  # noqa: E402
from tessel.search.problem import make_problem  # noqa: E402

Case = tuple[int, int, bool]  # devices, micro-batches, latency


@dataclass(frozen=True)
class Device:
    device: int
    limit: float
    at_limit: float  # share of the device's span (first start to last end) with memory at its limit
    hold: float  # H per steady micro-batch
    least: float  # H*
    interval: float  # mean steady gap between the longest-held allocation's starts


def at_limit(s: Schedule, device: int, limit: float) -> float:
    """Share of the device's busy span with its memory at `limit`."""
    tasks = s.device_tasks(device)
    first, last = min(t.start for t in tasks), max(s.end(t.block, t.micro_batch) for t in tasks)
    level, since, full = 0.0, first, 0.0
    for t, amount in s.memory_events(device):  # releases first at a tie (rule 4)
        if level >= limit - EPS:
            full += t - since
        level, since = level + amount, t
    return full / (last - first)


def devices(s: Schedule, n: int, lims: Sequence[float]) -> list[Device]:
    p, start = s.placement, s.start
    problem = make_problem(p, tuple(lims), n)
    steady = range(n // 4, n - n // 4)
    out = []
    for d in range(p.devices):
        pairs = problem.memory_pairs(d) or []
        if not pairs:
            continue
        least = {(a, r): hold_time(p, a, r) for a, r, _ in pairs}
        held = [sum((s.end(r, j) - start[(a, j)]) * x for a, r, x in pairs) for j in steady]
        longest = max(least, key=least.__getitem__)[0]
        starts = sorted(start[(longest, j)] for j in steady)
        out.append(Device(d, float(lims[d]), at_limit(s, d, float(lims[d])), float(statistics.mean(held)),
                          float(sum(least[a, r] * x for a, r, x in pairs)), (starts[-1] - starts[0]) / (len(starts) - 1)))
    return out


@dataclass(frozen=True)
class Row:
    case: Case
    devices: list[Device]
    schedule: Schedule

    @property
    def makespan(self) -> float:
        return float(self.schedule.makespan)

    @property
    def bound(self) -> float:
        """The search's own proven bound, as its report gives it."""
        return float(self.schedule.meta.get("lower_bound", 0))

    @property
    def load(self) -> float:
        return float(max(self.schedule.placement.loads))


def run_case(case: Case, lims: list[float], costs: str, seconds: float, check: bool = True) -> Row:
    """The row searched; `check`: its schedule passes ../shared/tools/check_schedule.py too (the
    search already validated it by the four rules)."""
    p, n, lat = case
    pl = Config(p, n, costs, lat).placement("zbv")
    s = search(pl, n, memory=lims, time_limit=seconds)
    if check and not checked(s):
        raise SystemExit(f"vmin_holds: check_schedule.py rejects the schedule of {case}")
    return Row(case, devices(s, n, lims), s)


def table(results: Sequence[Row]) -> list[str]:
    lines = ["| p | m | latency | makespan | bound | load / mb | tightest device | limit | at limit | hold / mb "
             "| least hold | hold / limit | least / limit | steady interval |", "|" + "---|" * 14]
    for r in results:
        p, n, lat = r.case
        t = max(r.devices, key=lambda x: x.hold / x.limit)
        lines.append(f"| {p} | {n} | {'yes' if lat else 'no'} | {r.makespan:.3f} | {r.bound:.3f} "
                     f"| {r.load:.3f} | {t.device} | {t.limit:g} | {t.at_limit:.0%} | {t.hold:.3f} "
                     f"| {t.least:.3f} | {t.hold / t.limit:.3f} | {t.least / t.limit:.3f} | {t.interval:.3f} |")
    return lines


def per_device(results: Sequence[Row]) -> list[str]:
    out = []
    for r in results:
        p, n, lat = r.case
        cells = ", ".join(f"d{x.device} {x.at_limit:.0%} {x.hold:.2f}/{x.least:.2f} {x.interval:.2f}" for x in r.devices)
        out.append(f"- p {p}, m {n}, latency {'yes' if lat else 'no'}: {cells}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", required=True, help="a bench/vpeers.py cache (JSON lines) with the rows' limits")
    ap.add_argument("--memory", default="V-Min", help="the rows' memory (a peer's name, as the cache has it)")
    ap.add_argument("--costs", default="profiled")
    ap.add_argument("--case", action="append", default=[], help="P,M,LATENCY (0/1); repeat")
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("-o", "--out", default="bench/results/vmin_holds.md")
    args = ap.parse_args(argv)
    known = limits(args.rows, args.memory, args.costs)  # per (p, latency): V-Min's do not vary with m
    cases = [(int(p), int(m), lat == "1") for p, m, lat in (c.split(",") for c in args.case)]
    missing = [c for c in cases if c[::2] not in known]
    if missing or not cases:
        sys.exit(f"vmin_holds: no {args.memory} row in {args.rows} for (p, m, latency) {missing or 'none given'}")
    t0 = time.perf_counter()
    results = [run_case(c, known[c[0], c[2]], args.costs, args.time_limit) for c in cases]
    lines = [
        "# Memory holds of the open V-Min rows, against their least", "",
        f"`{' '.join(['.venv/bin/python bench/vmin_holds.py', *sys.argv[1:]])}` "
        f"({time.perf_counter() - t0:.0f} s, {platform.node() or 'this machine'}).", "",
        f"zbv, {args.costs} costs, {args.memory}'s limits from {args.rows}; the default search, "
        f"{args.time_limit:g} s, each schedule checked by check_schedule.py. Per micro-batch of the steady "
        "state (the middle half): `bound` the search's own proven bound (bench/bound_gap.py's relaxations "
        "prove more on these rows: bench/results/bound_gap-v-full-target.md), `hold` H, `least hold` H* (longest paths), `at limit` the share of the "
        "device's span its memory is at the limit, `steady interval` the mean gap between micro-batches "
        "on that device. The tightest device is the one with the largest H / limit. Little's law holds over a "
        "long steady state; at 16-24 micro-batches the middle half is still filling or draining, so its interval "
        "can be below H / limit.", "", *table(results), "",
        "Every device (at limit, hold / least hold, steady interval):", "", *per_device(results),
    ]
    text = "\n".join(lines) + "\n"
    atomic_write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()

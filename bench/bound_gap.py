"""Proven gap on the zero-bubble grid: the makespans bench/peers.py and bench/vpeers.py recorded,
against the bounds that know latency and memory.

For every row of the peers tables given (default: bench/results/peers*.md; a bench/vpeers.py
--cache file (.jsonl) gives its rows with the limits as searched) the placement is built
again (bench/peers.py's Row, bench/vpeers.py's Config) and its bounds computed: `old`, the best of
FORMAT.md's, the fill through all-device blocks and Little's law on the memory limit; `search`,
the bound a search reports by default (bounds.proven_lower_bound as the search state calls it);
`device`, one device at a time with every task's own release and tail (bounds.device_lower_bound:
latency and memory delays per micro-batch, the device's own work to give memory back
(holds.release_floors), its device term in full: bounds.RELAX_TERM_WORK; with the memory ramp of
holds.device_ramp: the work the memory lets start before each least start, end after each least
tail, and both at once); `relax`, the
exact relaxations (tessel.search.relax: one device at a time, then groups of devices at once, relax.group_bound, --groups; CP-SAT under a deterministic budget, horizon the row's best makespan; `-` where it did not run:
the best makespan is within RELAX_ABOVE of the bounds before, or every device has more than
RELAX_TASKS tasks);
`bound`, the best of them. `tessel` and `best` (the shortest of tessel, the zero-bubble
repository's scheduler, every baseline and peer column) are read from the table as recorded;
their ratios to `bound` are the proven gaps. peers-v.md records only the largest per-device limit
of a row: each device's own (the limits tessel searched under) is worked out again from 1F1B's or
the peer's own schedule (the zero-bubble repository's with --zb-repo); where that cannot be done
the largest holds on every device (more memory: still a lower bound, maybe a weaker one). Only
rows with latency unless --all.

    .venv/bin/python bench/bound_gap.py                  # writes bench/results/bound_gap.md
    .venv/bin/python bench/bound_gap.py --all -o /tmp/gap.md bench/results/peers-memory.md
    .venv/bin/python bench/bound_gap.py --relax-devices 0 --groups 0 -o /tmp/gap.md   # without the relaxations

Only the rows an earlier table lists above 5% (what a stronger bound has to close; the group
relaxations start from the bound it proved), with the several-device relaxation (relax.group_bound,
--groups) or without it (--groups 0):

    .venv/bin/python bench/bound_gap.py --all --over bench/results/bound_gap-v-p8.md -o /tmp/p8.md \
        bench/results/peers-v-p8.jsonl

The V peers grid (issue 17), every row, one file per table (bench/results/bound_gap-v*.md):

    .venv/bin/python bench/bound_gap.py --all -o bench/results/bound_gap-v.md bench/results/peers-v.md
    .venv/bin/python bench/bound_gap.py --all -o bench/results/bound_gap-v-p8.md bench/results/peers-v-p8.jsonl
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peers import Row  # noqa: E402
from vpeers import PEERS, Config, load, one_f_one_b_memory, run_peer  # noqa: E402

from tessel import bounds  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.placement import Number, Placement  # noqa: E402
from tessel.schedule import Schedule  # noqa: E402
from tessel.search.budget import Clock  # noqa: E402
from tessel.search.problem import make_problem  # noqa: E402
from tessel.search.relax import (  # noqa: E402
    GROUP_COUNT,
    GROUP_PROBES,
    GROUP_WORK,
    RELAX_PROBES,
    RELAX_TASKS,
    RELAX_WORK,
    group_bound,
    relaxed_bound,
)

ZB_REPO = "/tmp/zb"  # the zero-bubble repository (bench/vpeers.py --zb-repo): the peers' own per-device peaks

RELAX_DEVICES = 4  # devices per row the relaxation tries (highest preemptive bound first)
GROUP_SECONDS = 240.0  # wall seconds of a row's group relaxations (relax.group_bound), at most
RELAX_ABOVE = 1.01  # ... on rows whose best makespan is more than this many times the bound before
MAKESPANS = ("1f1b", "gpipe", "greedy", "zb-h1", "zb-h2", "zb-v", "zb-v-half", "zb-v-min", "peer", "tessel",
             "peer makespan", "alone")
RANGES = (1.0, 1.01, 1.02, 1.05, 1.10, 1.20)
GAP = 1.05  # the gap issue 17 asks to prove: each group's first solve proves tessel's makespan / GAP


@dataclass(frozen=True)
class Effort:
    """How hard a row's relaxations try: `devices` one at a time, then `groups` groups of devices
    at once (solves of `group_work` deterministic s, `group_seconds` of wall time a row at most:
    a row cut short proves less, and may differ run to run), only on rows whose best makespan is
    more than `above` times the bounds before; each group's first solve proves makespan / `gap`
    (0: none, the bisection alone)."""
    devices: int = RELAX_DEVICES
    above: float = RELAX_ABOVE
    groups: int = 0
    group_seconds: float = GROUP_SECONDS
    group_work: float = GROUP_WORK
    gap: float = GAP


@dataclass(frozen=True)
class Case:
    """One row of a peers table: its placement, micro-batches and per-device limit."""
    placement: Placement
    shape: str
    p: int
    m: int
    costs: str
    memory: str
    limit: Number | tuple[Number, ...]  # per device, or one for all
    latency: bool


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of the first markdown table in a peers result file, by column name."""
    lines: list[str] = []
    for ln in path.read_text().splitlines():
        if ln.startswith("| "):
            lines.append(ln)
        elif lines and not ln.startswith("|"):  # the first table ended (peers-v.md has a second)
            break
    if not lines:
        return []
    return [dict(zip(_cells(lines[0]), _cells(ln))) for ln in lines[1:]]


def _cells(line: str) -> list[str]:
    """A markdown table line's cells."""
    return [c.strip() for c in line.strip("|").split("|")]


def case_of(cells: dict[str, str], mods: dict[str, Any] | None = None) -> Case:
    """The row's case; peers-v.md's per-device limits worked out again (1F1B's, or the peer's own
    peak when its schedule can be rebuilt: torch's always, the zero-bubble repository's with
    `mods`), else its largest on every device."""
    if "limit (max/device)" in cells:  # bench/vpeers.py: the memory row's name and its largest limit
        cfg = Config(int(cells["p"]), int(cells["m"]), cells["costs"], cells["latency"] != "0")
        p = cfg.placement(cells["placement"])
        top = float(cells["limit (max/device)"])
        limit: Number | tuple[Number, ...] = top
        if cells["memory"] == "1F1B's":  # worked out again: every device's own
            limit = one_f_one_b_memory(p, cfg.m)
        else:
            limit = _peer_peak(cells["memory"].removesuffix("'s"), cells["placement"], cfg, mods) or top
        # a schedule rebuilt here that peaks otherwise than the table recorded (another torch, an older
        # 1F1B): the recorded largest on every device
        limit = limit if abs((max(limit) if isinstance(limit, tuple) else limit) - top) < 1e-6 else top
        return Case(p, cells["placement"], cfg.p, cfg.m, cfg.costs, cells["memory"], limit, cfg.latency)
    memory = int(cells["memory"].split()[0])  # "1 M_B = 8"
    row = Row(cells["placement"], int(cells["p"]), int(cells["m"]), cells["costs"], cells["latency"] != "0", memory)
    return Case(row.placement(), row.shape, row.p, row.m, row.costs, cells["memory"], row.limit, row.latency)


def _peer_peak(name: str, shape: str, cfg: Config, mods: dict[str, Any] | None) -> tuple[Number, ...] | None:
    """The per-device peak of the peer's own schedule (the limits tessel searched under), or None
    where it cannot be rebuilt here."""
    peer = next((x for x in PEERS if x.name == name and x.shape == shape), None)
    s = None if peer is None else run_peer(peer, mods, cfg)
    return tuple(s.peak_memory) if isinstance(s, Schedule) else None


def proven(p: Placement, n: int, limit: Number | tuple[Number, ...], best: Number, effort: Effort,
           target: Number | None = None, earlier: Number = 0) -> tuple[Number, Number, Number | None]:
    """(best bound before, device bound, relaxation or None) of n micro-batches under `limit`
    per device; the relaxations as `effort` says, `target` the makespan whose gap they try to
    prove first (default `best`), the groups from `earlier` (a bound an earlier table proved) up."""
    devices, above, groups = effort.devices, effort.above, effort.groups
    problem = make_problem(p, limit)
    holds = problem.real_holds()
    old = max([bounds.lower_bound(p, n), bounds.shard_lower_bound(p, n),
               *(bounds.memory_lower_bound(p, n, d, h, lim) for d, (lim, h) in holds.items())])
    device = bounds.device_lower_bound(p, n, holds, bounds.RELAX_TERM_WORK)
    small = any(n * len(p.blocks_on(d)) <= RELAX_TASKS for d in range(p.devices))
    if (devices == 0 or not small) and groups == 0 or best <= above * max(old, device) + 1e-9:
        return old, device, None
    # the relaxation's probes start from the bound without the memory ramp: a higher start moves its
    # halfway horizons, where a budget-limited proof may fail (V-Half, p = 6, m = 18: 50.3 -> 49.56)
    start = max(old, bounds.device_lower_bound(p, n, holds, bounds.RELAX_TERM_WORK, ramp=False))
    relax = relaxed_bound(problem, n, best, start, RELAX_WORK, devices) if devices and small else start
    if groups and best > above * max(old, device, relax) + 1e-9:
        goal = (best if target is None else target) / effort.gap if effort.gap else None
        relax = group_bound(problem, n, best, max(device, relax, earlier), effort.group_work, groups,
                            Clock(effort.group_seconds), goal)
    return old, device, relax


def _num(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def measure(name: str, case: Case, tessel: float | None, best: float,
            effort: Effort, earlier: float = 0) -> tuple[str, float | None, float, float | None]:
    """The table line of one row, its tessel / bound, its best / bound and its tessel / (the
    bound the search reports by default); the group relaxations start from `earlier`."""
    t0 = time.perf_counter()
    old, device, relax = proven(case.placement, case.m, case.limit, best, effort, tessel, earlier)
    secs = time.perf_counter() - t0
    reported = searched(case.placement, case.m, case.limit)
    bound = max(old, device, relax or 0, reported)
    gap = None if tessel is None else tessel / bound
    line = (f"| {name} | {case.shape} | {case.p} | {case.m} | {case.costs} | {case.memory} | {old:.6g} | "
            f"{reported:.6g} | {device:.6g} | {'-' if relax is None else f'{relax:.6g}'} | {bound:.6g} | "
            f"{'-' if tessel is None else f'{tessel:.6g}'} | {best:.6g} | {'-' if gap is None else f'{gap:.4f}'} | "
            f"{best / bound:.4f} | {'-' if tessel is None else f'{tessel / reported:.4f}'} | {secs:.2f} |")
    return line, gap, best / bound, None if tessel is None else tessel / reported


def searched(p: Placement, n: int, limit: Number | tuple[Number, ...]) -> Number:
    """The bound a search reports by default (no solver bound, no relaxation): the search state's
    bounds.proven_lower_bound, its device term at the search's budget (bounds.DEVICE_TERM_WORK)."""
    holds = make_problem(p, limit).real_holds()
    memory = [(d, h, lim) for d, (lim, h) in holds.items()]
    return bounds.proven_lower_bound(p, n, memory, device=bounds.device_lower_bound(p, n, holds))[0]


def cases(path: Path, mods: dict[str, Any] | None) -> list[tuple[Case, float | None, float]]:
    """(case, tessel, best makespan) of every row of a peers table (.md) or of bench/vpeers.py's
    --cache file (.jsonl: each row with its per-device limits as searched)."""
    if path.suffix == ".jsonl":
        return jsonl_cases(path)
    out = []
    for cells in read_rows(path):
        best = min(x for x in (_num(cells.get(c, "-")) for c in MAKESPANS) if x is not None)
        out.append((case_of(cells, mods), _num(cells["tessel"]), best))
    return out


def jsonl_cases(path: Path) -> list[tuple[Case, float | None, float]]:
    """The rows of a bench/vpeers.py cache: the searched limits as recorded; the best makespan of
    tessel, the search alone and every peer whose own peak fits those limits."""
    records = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    peers = {_config(r["key"]): r["value"] for r in records if r["key"]["kind"] == "peers"}
    out = []
    for r in records:
        key, value = r["key"], r["value"]
        if key["kind"] != "row":
            continue
        cfg = Config(key["p"], key["m"], key["costs"], key["latency"])
        limit = tuple(key["limit"])
        fit = [x["makespan"] for x in peers.get(_config(key), []) if "makespan" in x
               and all(a <= b + 1e-9 for a, b in zip(x["peak"], limit))]
        memory = "1F1B's" if key["memory"] == "1F1B" else f"{key['memory']}'s"
        case = Case(cfg.placement(key["shape"]), key["shape"], cfg.p, cfg.m, cfg.costs, memory, limit, cfg.latency)
        out.append((case, float(value["tessel"]), min([value["tessel"], value["alone"], *fit])))
    return out


def rows_over(path: Path, ratio: float = 1.05) -> dict[tuple[str, ...], float]:
    """The rows of an earlier bound_gap table whose tessel / bound is above `ratio`, as _key,
    each with the bound that table proved."""
    out = {}
    for ln in path.read_text().splitlines():
        c = _cells(ln)
        if len(c) == 17 and c[0].startswith("peers") and (g := _num(c[13])) is not None and g > ratio + 1e-9:
            out[(*c[1:6], c[11])] = float(c[10])
    return out


def _key(case: Case, tessel: float | None) -> tuple[str, ...]:
    """A row as bound_gap's tables print it: placement, p, m, costs, memory and tessel."""
    return (case.shape, str(case.p), str(case.m), case.costs, case.memory, "-" if tessel is None else f"{tessel:.6g}")


def _config(key: dict[str, Any]) -> tuple[Any, ...]:
    return key["shape"], key["p"], key["m"], key["costs"], key["latency"]


def spread(name: str, gaps: list[float]) -> str:
    """One row of the gap distribution: how many gaps are at most each of RANGES, how many above."""
    cells = [sum(g <= x + 1e-9 for g in gaps) for x in RANGES]
    return (f"| {name} | {len(gaps)} | " + " | ".join(map(str, cells)) +
            f" | {sum(g > RANGES[-1] + 1e-9 for g in gaps)} | {max(gaps, default=0.0):.4f} |")


def header(gaps: list[float], best: list[float], reported: list[float], effort: Effort,
           mods: dict[str, Any] | None) -> list[str]:
    over = sum(g > 1.05 + 1e-9 for g in gaps)
    return ["# Proven gap on the zero-bubble grid: the bounds that know latency and memory", "",
            "Makespans as recorded by bench/peers.py and bench/vpeers.py in the files named (a vpeers --cache "
            "file: its rows with their limits as searched); bounds computed "
            "now. `old`: FORMAT.md's, the fill through all-device blocks, Little's law on memory; `search`: the "
            "bound a search reports by default (bounds.proven_lower_bound, no solver bound, no relaxation); `device`: "
            "bounds.device_lower_bound, its device term in full (with the memory ramp at either end and at both, "
            "holds.device_ramp); `relax`: tessel.search.relax (one device exactly, CP-SAT, at most "
            f"{RELAX_PROBES} solves of {RELAX_WORK} deterministic s per device, {effort.devices} devices a row; then "
            f"tessel.search.relax.group_bound, several devices at once, {effort.groups} groups a row, at most "
            f"{GROUP_PROBES} solves of {effort.group_work:g} deterministic s each, from the bound the --over table "
            "proved where one is given, the first "
            + (f"proving tessel's makespan / {effort.gap:g} (the best's where tessel has none)" if effort.gap else
               "halfway") +
            f", {effort.group_seconds:g} s of wall time a row at most; on rows whose "
            f"best makespan is above {effort.above} x the bound before; `-`: not run); `best`: the shortest of "
            "tessel, the "
            "zero-bubble repository's scheduler, every baseline and peer that fits the row's memory. Gaps are "
            "makespan / bound; peers-v.md rows are bounded with each device's own limit, worked out "
            f"again from 1F1B's or the peer's schedule ({'with' if mods else 'without'} the zero-bubble repository"
            f"{'' if mods else ': its peers get their largest limit on every device'}). Machine: {platform.machine()}, "
            f"python {platform.python_version()}, 2 cores shared "
            f"with other jobs (load {os.getloadavg()[0]:.1f} at the end; `bound s` is wall time).", "",
            f"Rows with tessel more than 5% above the bound: {over} of {len(gaps)}; with the best makespan "
            f"recorded: {sum(g > 1.05 + 1e-9 for g in best)} of {len(best)}; tessel above the search's own "
            f"bound: {sum(g > 1.05 + 1e-9 for g in reported)} of {len(reported)}.", "",
            "Rows at or below each ratio of makespan / bound:", "",
            "| makespan | rows | " + " | ".join(f"<= {x:.2f}" for x in RANGES) + f" | > {RANGES[-1]:.2f} | max |",
            "|" + "---|" * (len(RANGES) + 4), spread("tessel", gaps), spread("best", best),
            spread("tessel / search", reported), "",
            "| file | placement | p | m | costs | memory | old | search | device | relax | bound | tessel | best | "
            "tessel / bound | best / bound | tessel / search | bound s |", "|" + "---|" * 17]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("tables", nargs="*", help="peers result files, .md or bench/vpeers.py's .jsonl caches "
                                              "(default: bench/results/peers*.md)")
    ap.add_argument("--all", action="store_true", help="rows without latency too")
    ap.add_argument("--relax-devices", type=int, default=RELAX_DEVICES,
                    help=f"devices per row the relaxation tries (default {RELAX_DEVICES}; 0: none)")
    ap.add_argument("--groups", type=int, default=GROUP_COUNT,
                    help=f"device groups per row the relaxation of several devices at once tries after the one-device "
                         f"ones (default {GROUP_COUNT}; 0: none)")
    ap.add_argument("--group-seconds", type=float, default=GROUP_SECONDS,
                    help=f"wall seconds a row's group relaxations may take at most (default {GROUP_SECONDS:g}: zbv, 8 "
                         "devices, 32 micro-batches takes more)")
    ap.add_argument("--group-work", type=float, default=GROUP_WORK,
                    help=f"deterministic seconds per solve of a group (default {GROUP_WORK:g})")
    ap.add_argument("--gap", type=float, default=GAP,
                    help=f"each group's first solve proves tessel's makespan / this (default {GAP}: the gap issue 17 "
                         "asks for; 0: bisect from halfway)")
    ap.add_argument("--relax-above", type=float, default=RELAX_ABOVE,
                    help=f"only rows whose best makespan is above this many times the bound before (default {RELAX_ABOVE})")
    ap.add_argument("--zb-repo", default=ZB_REPO,
                    help=f"the zero-bubble repository, for its peers' per-device peaks (default {ZB_REPO}; "
                         "without it their rows use the largest limit on every device)")
    ap.add_argument("--over", metavar="BOUND_GAP_MD",
                    help="only the rows that an earlier bench/bound_gap.py table lists with tessel / bound above 1.05 "
                         "(its rows of the tables given; the rows that matter, in minutes instead of hours), their "
                         "group relaxations starting from the bound it proved")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "bound_gap.md"))
    args = ap.parse_args()
    effort = Effort(args.relax_devices, args.relax_above, args.groups, args.group_seconds, args.group_work, args.gap)
    mods = load(args.zb_repo) if Path(args.zb_repo).exists() else None
    keep = None if args.over is None else rows_over(Path(args.over))
    files = [Path(t) for t in args.tables] or sorted((ROOT / "bench" / "results").glob("peers*.md"))
    out: list[str] = []
    gaps: list[float] = []
    best: list[float] = []
    reported: list[float] = []
    for f in files:
        for case, tessel, top in cases(f, mods):
            earlier = None if keep is None else keep.get(_key(case, tessel))
            if not case.latency and not args.all or (keep is not None and earlier is None):
                continue
            line, gap, best_gap, own = measure(f.name, case, tessel, top, effort, earlier or 0)
            out.append(line)
            gaps += [] if gap is None else [gap]
            reported += [] if own is None else [own]
            best.append(best_gap)
            print(line, flush=True)
    cmd = "`.venv/bin/python bench/bound_gap.py " + " ".join(sys.argv[1:]) + "`"
    atomic_write(args.output, "\n".join(header(gaps, best, reported, effort, mods) + out +
                                        ["", "Reproduce: " + cmd]) + "\n")


if __name__ == "__main__":
    main()

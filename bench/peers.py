"""The zero-bubble grid: tessel against every baseline and the zero-bubble repository's schedulers.

Rows: p in {4, 8, 16}, m in {3p, 24, 64, 128}, costs F = B = W = 1 or the ZB repository's profiled
ratio F/B/W = 18522/18086/9337 (scaled to F = 1), edge latency 0 or > 0 (0.5 for unit costs, the
profiled 601, i.e. 0.032), memory M_B (1F1B's: p stage activations) or 2 M_B, on the one-stage-per-
device placement `zb` and the V placement `zbv` (two chunks per device, each half a stage: half the
costs and half the activation, so M_B is 2p chunk units). Every applicable baseline and `tessel`
(tessel.search, default mode) run under that memory limit; each cell is the makespan (`-` where the
method does not apply or cannot meet the limit). `peer` is the zero-bubble repository's own
scheduler on the same costs (its ZB heuristic on `zb`, its ZB-V construction on `zbv`), its
per-device orders timed here by tessel.timing and validated by the four rules; `x` where it raises
or breaks the limit. `won by` is where tessel's schedule came from (its repetend, the whole solve, or
a baseline it raced); `own` (with --own) is the same search with no baseline raced
(Budget(race=False)): what its repetend and completion reach on their own. `tessel > ZB` flags rows
where tessel is longer than the best zero-bubble baseline (zb-h1, zb-h2, zb-v*) that applies.

    .venv/bin/python bench/peers.py --zb-repo PATH                 # writes bench/results/peers.md
    .venv/bin/python bench/peers.py --quick --time-limit 5 -o /tmp/peers.md
    .venv/bin/python bench/peers.py --p 8 16 --latency-only --memory 2 --own -o /tmp/peers-mem.md

PATH is a checkout of github.com/sail-sg/zero-bubble-pipeline-parallelism (its scheduler is pure
Python: loaded from the files, nothing else of Megatron is imported; without it the peer column is
empty).
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import logging
import platform
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from tessel import library
from tessel.baselines import BASELINES, BaselineError, applicable
from tessel.io import atomic_write
from tessel.key import Key
from tessel.placement import Placement
from tessel.schedule import EPS, Schedule
from tessel.search import Budget, search
from tessel.timing import earliest_starts

ROOT = Path(__file__).resolve().parent.parent
PROFILED = (18522, 18086, 9337, 601)  # F, B, W, latency of the ZB repository's example (microseconds)
ZB_FAMILY = ("zb-h1", "zb-h2", "zb-v", "zb-v-half", "zb-v-min")
COLUMNS = ("1f1b", "gpipe", "greedy", "zb-h1", "zb-h2", "zb-v", "zb-v-half", "zb-v-min")
SCHEDULER = "megatron.core.pipeline_parallel.zerobubble.scheduler"
log = logging.getLogger("peers")


@dataclass(frozen=True)
class Row:
    shape: str  # zb or zbv
    p: int
    m: int
    costs: str  # unit or profiled
    latency: bool
    memory: int  # multiples of M_B

    def fbwc(self) -> tuple[float, float, float, float]:
        if self.costs == "unit":
            f, b, w, c = 1.0, 1.0, 1.0, 0.5
        else:
            f, b, w, c = (round(x / PROFILED[0], 3) for x in PROFILED)
        c = c if self.latency else 0.0
        return (f, b, w, c) if self.shape == "zb" else (f / 2, b / 2, w / 2, c)

    def placement(self) -> Placement:
        f, b, w, c = self.fbwc()
        build = library.zb if self.shape == "zb" else library.zbv
        return build(self.p, forward=f, backward=b, weight=w, latency=c)

    @property
    def limit(self) -> int:
        return self.memory * self.p * (1 if self.shape == "zb" else 2)


def grid(quick: bool, ps: Sequence[int] = (), latency: Sequence[bool] = (False, True),
         memory: Sequence[int] = (1, 2)) -> list[Row]:
    ps = tuple(ps) or ((4,) if quick else (4, 8, 16))
    rows = []
    for p in ps:
        ms = sorted({3 * p, 24} if quick else {3 * p, 24, 64, 128})
        for shape, m, costs, lat, mem in itertools.product(("zb", "zbv"), ms, ("unit", "profiled"), latency, memory):
            rows.append(Row(shape, p, m, costs, lat, mem))
    return rows


# ---- the zero-bubble repository's schedulers ---------------------------------------------------
def load_peer(repo: str) -> dict[str, Any] | None:
    """Its scheduler modules, loaded from their files without Megatron's package initialisers."""
    base = Path(repo)
    if not (base / SCHEDULER.replace(".", "/") / "zb.py").exists():
        log.warning("no zero-bubble scheduler under %s: peer column left empty", repo)
        return None
    parts = SCHEDULER.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(base.joinpath(*parts[:i]))]
            sys.modules[name] = pkg
    sys.modules.setdefault("pulp", types.ModuleType("pulp"))  # used only by a function not called here
    return {name: importlib.import_module(f"{SCHEDULER}.{name}") for name in ("graph", "zb", "zbv")}


def _peer_zb(mods: dict[str, Any], row: Row, p: Placement) -> list[list[Key]]:
    f, b, w, c = row.fbwc()
    k, n = row.p, row.m
    cfg = mods["graph"].GraphConfig(cost_f=[f] * k, cost_b=[b] * k, cost_w=[w] * k, cost_comm=float(c),
                                    mem_f=[1.0] * k, mem_b=[0.0] * k, mem_w=[-1.0] * k,
                                    max_mem=[float(row.limit)] * k, n_stages=k, n_micro=n)
    graph = mods["zb"].Graph.build_graph(k, n, cfg)
    _, _, done = mods["zb"].initial_solution(graph, print_result=False)
    orders = []
    for s in range(k):
        ids = [(kind, mb) for kind in range(3) for mb in range(n)]
        ids.sort(key=lambda t: done[graph.get_id(t[0], s, t[1])])
        names = (f"f{s}", f"b{k - 1 - s}", f"w{k - 1 - s}")
        orders.append([(names[kind], mb) for kind, mb in ids])
    return orders


def _peer_zbv(mods: dict[str, Any], row: Row, p: Placement) -> list[list[Key]]:
    f, b, w, c = row.fbwc()
    k, n = row.p, row.m
    best = None
    for fill_b, fill_f in itertools.product((True, False), repeat=2):
        g = mods["zbv"].PipelineGraph(k, n, f, b, w, c, 1, 0, -1, max_mem=row.limit)
        sched, _, bubble = g.try_v_schedule(fill_b=fill_b, fill_f=fill_f)
        if best is None or bubble < best[1]:
            best = (sched, bubble)
    assert best is not None
    orders = []
    for s in range(k):
        # chunk 0 forward is stage s, chunk 1 is stage 2k-1-s; its B/W chunk 0 is chunk 1's gradient
        fwd = (f"f{s}", f"f{2 * k - 1 - s}")
        grad = (str(s), str(2 * k - 1 - s))
        orders.append([(fwd[chunk] if cat == 0 else "bw"[cat - 1] + grad[chunk], mb) for cat, chunk, mb in best[0][s]])
    return orders


def run_peer(mods: dict[str, Any] | None, row: Row, p: Placement) -> float | str:
    if mods is None:
        return "-"
    try:
        orders = (_peer_zb if row.shape == "zb" else _peer_zbv)(mods, row, p)
        s = Schedule.build(p, row.m, earliest_starts(p, row.m, orders), memory_limit=row.limit, check=True)
    except Exception as e:  # the peer's own assertion, or a schedule the rules reject
        log.info("peer on %s: %s", row, e)
        return "x"
    return s.makespan


# ---- one row ------------------------------------------------------------------------------------
def timed(fn: Callable[[], Schedule]) -> tuple[float | str, float]:
    t0 = time.perf_counter()
    try:
        s = fn()
    except (BaselineError, ValueError) as e:
        log.info("%s", e)
        return "-", time.perf_counter() - t0
    return s.makespan, time.perf_counter() - t0


def run_row(row: Row, mods: dict[str, Any] | None, time_limit: float | None, own: bool = False) -> dict[str, Any]:
    p = row.placement()
    out: dict[str, Any] = {"bound": _bound(p, row.m)}
    fits = applicable(p)
    secs = 0.0
    for name in COLUMNS:
        if name in fits:
            out[name], t = timed(partial(BASELINES[name], p, row.m, row.limit))
            secs = max(secs, t)
        else:
            out[name] = "-"
    out["baseline_s"] = secs
    out["peer"] = run_peer(mods, row, p)
    won: list[str] = []

    def tessel() -> Schedule:
        s = search(p, row.m, memory=row.limit, time_limit=time_limit)
        won.append(str(s.meta["base"]))
        return s
    out["tessel"], out["tessel_s"] = timed(tessel)
    out["base"] = won[0] if won else "-"
    out["own"] = "-"
    if own:  # the search on its own: no baseline raced
        out["own"], _ = timed(lambda: search(p, row.m, memory=row.limit, time_limit=time_limit,
                                             budget=Budget(race=False)))
    zb = [out[n] for n in ZB_FAMILY if isinstance(out[n], (int, float))]
    out["best_zb"] = min(zb) if zb else None
    t = out["tessel"]
    out["worse"] = isinstance(t, (int, float)) and out["best_zb"] is not None and t > out["best_zb"] + 1e-6
    return out


def _bound(p: Placement, n: int) -> float:
    from tessel.bounds import lower_bound
    return float(lower_bound(p, n))


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return str(int(x)) if abs(x - round(x)) < EPS else f"{x:.2f}"
    return str(x)


def table(rows: Sequence[Row], results: Sequence[dict[str, Any]]) -> list[str]:
    head = ["placement", "p", "m", "costs", "latency", "memory", "bound", *COLUMNS, "peer", "tessel", "won by", "own",
            "tessel s", "baseline s (max)", "tessel / bound", "best ZB / bound", "tessel > ZB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, r in zip(rows, results):
        t, z, lb = r["tessel"], r["best_zb"], r["bound"]
        cells = [row.shape, row.p, row.m, row.costs, "yes" if row.latency else "0", f"{row.memory} M_B = {row.limit}",
                 fmt(lb), *(fmt(r[c]) for c in COLUMNS), fmt(r["peer"]), fmt(t), r["base"], fmt(r["own"]),
                 f"{r['tessel_s']:.1f}",
                 f"{r['baseline_s']:.2f}", f"{t / lb:.4f}" if isinstance(t, (int, float)) else "-",
                 f"{z / lb:.4f}" if z is not None else "-", "**yes**" if r["worse"] else ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="p = 4 and m in {12, 24} only")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds per tessel search (default: its own)")
    ap.add_argument("--zb-repo", default=None, help="checkout of the zero-bubble repository (peer column)")
    ap.add_argument("--p", type=int, nargs="*", default=[], help="device counts (default: 4, 8, 16; --quick: 4)")
    ap.add_argument("--own", action="store_true", help="also the search with no baseline raced (column own)")
    ap.add_argument("--latency-only", action="store_true", help="only the rows with edge latency")
    ap.add_argument("--memory", type=int, nargs="*", default=[1, 2], help="multiples of M_B (default: 1 2)")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "peers.md"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    mods = load_peer(args.zb_repo) if args.zb_repo else None
    rows = grid(args.quick, args.p, (True,) if args.latency_only else (False, True), args.memory)
    results = []
    for i, row in enumerate(rows):
        results.append(run_row(row, mods, args.time_limit, args.own))
        r = results[-1]
        print(f"[{i + 1}/{len(rows)}] {row}: bound {fmt(r['bound'])} best ZB {fmt(r['best_zb'])} "
              f"peer {fmt(r['peer'])} tessel {fmt(r['tessel'])} ({r['tessel_s']:.1f} s)", flush=True)
        write(args, rows[:len(results)], results, mods is not None, len(rows))  # a partial table survives a timeout


def _options(args: argparse.Namespace) -> list[str]:
    """The options of this run, as typed (the peer's path aside)."""
    out = [f"--time-limit {args.time_limit:g}"] if args.time_limit else []
    out += ["--quick"] if args.quick else []
    out += ["--p " + " ".join(map(str, args.p))] if args.p else []
    out += ["--latency-only"] if args.latency_only else []
    out += ["--own"] if args.own else []
    out += ["--memory " + " ".join(map(str, args.memory))] if args.memory != [1, 2] else []
    return out


def write(args: argparse.Namespace, rows: Sequence[Row], results: Sequence[dict[str, Any]], peer: bool,
          total: int) -> None:
    worse = sum(r["worse"] for r in results)
    f, b, w, c = (round(x / PROFILED[0], 3) for x in PROFILED)
    done = "" if len(rows) == total else f" (partial: {len(rows)} of {total} rows)"
    lines = ["# Zero-bubble grid: tessel, the baselines and the zero-bubble repository", "",
             f"Makespans under the memory limit. Profiled costs F/B/W/latency = {f}/{b}/{w}/{c} (the ZB "
             "repository's 18522/18086/9337/601, F = 1); unit costs use latency 0.5 where latency is on. "
             "On `zbv` each chunk has half the costs and the activation 1, so M_B = 2p there. "
             f"tessel: default mode, time limit {args.time_limit or 'default'} s per search. "
             f"Peer: {'the ZB repository at ' + str(args.zb_repo) if peer else 'not run'}. "
             f"Machine: {platform.machine()}, python {platform.python_version()}, shared by other jobs.", "",
             f"Rows where tessel is longer than the best zero-bubble baseline: {worse} of {len(rows)}{done}.", "",
             *table(rows, results), "",
             "Reproduce: `.venv/bin/python bench/peers.py --zb-repo PATH " + " ".join(_options(args)) + "`"]
    atomic_write(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

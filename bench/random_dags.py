"""The search on a seeded family of random DAG placements (bench/dags.py): 3-8 devices, chains,
branches, joins, sharded blocks, integer and fractional costs, memory from loose to just
feasible, N in {8, 32, 128} (one N per placement).

Per case: did tessel fail, is its schedule valid by ../shared/tools/check_schedule.py, its makespan
against greedy and every applicable baseline, its ratio to the proven lower bound, and its
seconds against the time limit. Done when: 0 failures, 0 invalid, never above any baseline,
wall <= limit + 1 s.

    .venv/bin/python bench/random_dags.py                 # 200 cases, writes bench/results/random_dags.md
    .venv/bin/python bench/random_dags.py --quick -o /tmp/r.md
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.dags import random_case  # noqa: E402
from tessel.baselines import BASELINES, BaselineError, applicable  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.schedule import Schedule, ScheduleError  # noqa: E402
from tessel.search import MemoryLimitError, search  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT.parent / "shared" / "tools" / "check_schedule.py"


@dataclass(frozen=True)
class Row:
    seed: int
    devices: int
    blocks: int
    n: int
    memory: str
    fractional: bool
    error: str | None
    valid: bool
    makespan: float | None
    greedy: float | None
    best_baseline: str
    best: float | None
    bound: float | None
    ratio: float | None
    seconds: float
    limit: float

    @property
    def worse(self) -> bool:
        return self.makespan is not None and self.best is not None and self.makespan > self.best + 1e-6


def checked(s: Schedule) -> bool:
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "s.json"
        s.save(f)
        out = subprocess.run([sys.executable, str(CHECKER), str(f)], capture_output=True, text=True)
        return out.returncode == 0 and abs(json.loads(out.stdout)["makespan"] - s.makespan) < 1e-6


def run_case(seed: int, limit: float) -> Row:
    c = random_case(seed)
    p = c.placement
    bases: dict[str, float] = {}
    for name in applicable(p):
        try:
            bases[name] = BASELINES[name](p, c.micro_batches, c.memory).makespan
        except (BaselineError, ScheduleError):
            pass
    best_name = min(bases, key=bases.__getitem__) if bases else "-"
    t0 = time.perf_counter()
    error, s = None, None
    try:
        s = search(p, c.micro_batches, c.memory, time_limit=limit)
    except (MemoryLimitError, ValueError) as e:
        error = str(e)
    seconds = time.perf_counter() - t0
    frac = not p.is_integral
    if s is None:
        return Row(seed, p.devices, len(p.blocks), c.micro_batches, c.level, frac, error, False, None,
                   bases.get("greedy"), best_name, bases.get(best_name), None, None, seconds, limit)
    bound = float(s.meta["lower_bound"])
    return Row(seed, p.devices, len(p.blocks), c.micro_batches, c.level, frac, None, checked(s), s.makespan,
               bases.get("greedy"), best_name, bases.get(best_name), bound, s.makespan / bound, seconds, limit)


def table(rows: list[Row]) -> list[str]:
    out = ["| seed | devices | blocks | N | memory | fractional | tessel | greedy | best baseline | "
           "bound | ratio | seconds | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        note = r.error or ("INVALID" if not r.valid else "") + (" WORSE" if r.worse else "") + \
            (" SLOW" if r.seconds > r.limit + 1 else "")
        best = "-" if r.best is None else f"{r.best:.6g} {r.best_baseline}"
        out.append(f"| {r.seed} | {r.devices} | {r.blocks} | {r.n} | {r.memory} | {'yes' if r.fractional else 'no'} | "
                   f"{_f(r.makespan)} | {_f(r.greedy)} | {best} | {_f(r.bound)} | {_f(r.ratio, 4)} | "
                   f"{r.seconds:.2f} | {note.strip()} |")
    return out


def summary(rows: list[Row], limit: float) -> list[str]:
    done = [r for r in rows if r.makespan is not None]
    ratios = [r.ratio for r in done if r.ratio is not None]
    vs_greedy = [r.makespan / r.greedy for r in done if r.greedy and r.makespan is not None]
    return [f"- cases: {len(rows)}; failures: {sum(1 for r in rows if r.error)}; "
            f"invalid: {sum(1 for r in done if not r.valid)}",
            f"- above the best applicable baseline: {sum(1 for r in rows if r.worse)}",
            f"- over limit + 1 s ({limit + 1:g} s): {sum(1 for r in rows if r.seconds > r.limit + 1)}; "
            f"slowest {max(r.seconds for r in rows):.2f} s",
            f"- ratio to the proven bound: median {statistics.median(ratios):.4f}, max {max(ratios):.4f}"
            if ratios else "- no ratios",
            f"- tessel / greedy: median {statistics.median(vs_greedy):.4f}, min {min(vs_greedy):.4f}"
            if vs_greedy else "- no greedy"]


def _f(x: float | None, digits: int = 6) -> str:
    return "-" if x is None else f"{x:.{digits}g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="the first 24 cases")
    ap.add_argument("--limit", type=float, default=2.0, help="seconds per search (a wall clock)")
    ap.add_argument("-o", "--out", default=str(ROOT / "bench" / "results" / "random_dags.md"))
    args = ap.parse_args()
    n = 24 if args.quick else args.cases
    rows = []
    for seed in range(n):
        r = run_case(seed, args.limit)
        rows.append(r)
        print(f"{seed} {r.makespan} best={r.best} valid={r.valid} {r.seconds:.2f}s {r.error or ''}", flush=True)
    lines = ["# Search on random DAG placements", "",
             f"`bench/random_dags.py --cases {n} --limit {args.limit:g}` on {platform.machine()}, "
             f"{platform.python_version()}; tessel mode, time limit {args.limit:g} s per case (a wall clock); "
             "every schedule checked by ../shared/tools/check_schedule.py. The bound is the search's proven lower "
             "bound (analytic, memory-aware, or a solver's).", "", *summary(rows, args.limit), "",
             *table(rows), ""]
    atomic_write(Path(args.out), "\n".join(lines))
    bad = [r for r in rows if r.error or not r.valid or r.worse or r.seconds > r.limit + 1]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Scale: the search at 16 and 32 devices, N = 128, 60 s (issue 9's "Done when").

Rows:
- `library`: every named placement at 32 devices, memory 2 x devices per device (as
  `bench/search.py --large`), modes tessel and fast;
- `gpt`: the 32-device GPT placement of `bench/paper.py` (M shape, costs of the analytic model,
  the memory each device has left after its weights), modes tessel and fast;
- `mshape-mem`: M shapes (embedding sharded on all devices) at 16 and 32 devices under a memory
  limit that 1F1B meets (its own peak at N), against 1F1B.

Each cell is the makespan; the ratio is to the proven bound of the search's report (`bound`:
analytic, shard, memory or solver) and to the FORMAT.md bound (`LB`). `own` is the same search with
no baseline raced (Budget(race=False)): what the repetend and completion reach on their own.
Every schedule is validated (Schedule.validate).

    .venv/bin/python bench/scale.py                      # writes bench/results/scale.md
    .venv/bin/python bench/scale.py --only gpt --time-limit 20 -o /tmp/scale.md
"""
from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessel import library
from tessel.baselines import BASELINES
from tessel.io import atomic_write
from tessel.placement import Number, Placement
from tessel.schedule import Schedule
from tessel.search import Budget, search

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
N = 128
log = logging.getLogger("scale")


@dataclass(frozen=True)
class Row:
    group: str
    name: str
    build: Callable[[], Placement]
    memory: Callable[[Placement], Number | Sequence[Number] | None]
    reference: str | None = None  # the baseline the row must not lose to


def _library(d: int) -> Iterator[Row]:
    for name in library.PLACEMENTS:
        yield Row("library", f"{name}-{d}", lambda name=name: library.build(name, devices=d), lambda p: 2 * d)


def _gpt(d: int) -> Row:
    def build() -> Placement:
        return _gpt_model(d).placement()
    return Row("gpt", f"gpt-{d} (paper)", build, lambda p: _gpt_model(d).memory_budget())


def _gpt_model(d: int):  # type: ignore[no-untyped-def]
    import paper  # bench/paper.py: the study's GPT at d devices
    return paper.paper_cases()[0].build(d, "tessel")


def _mshape(d: int) -> Row:
    def memory(p: Placement) -> Number:
        return max(BASELINES["1f1b"](p, N, None).peak_memory)
    return Row("mshape-mem", f"mshape-{d}", lambda: library.build("mshape", devices=d), memory, "1f1b")


def rows(only: Sequence[str]) -> list[Row]:
    out = [*_library(32), _gpt(32), _mshape(16), _mshape(32)]
    return [r for r in out if not only or r.group in only]


def run_row(row: Row, limit: float, modes: Sequence[str], own_too: bool) -> list[str]:
    p = row.build()
    mem = row.memory(p)
    ref = BASELINES[row.reference](p, N, mem).makespan if row.reference else None
    lines = []
    for mode in modes:
        for own in (False, True) if own_too else (False,):
            t0 = time.perf_counter()
            s = search(p, N, mem, mode=mode, time_limit=limit, budget=Budget(race=not own)).validate()
            secs = time.perf_counter() - t0
            lines.append(_line(row, p, mem, mode, own, s, secs, ref))
            print(lines[-1], flush=True)
    return lines


def _line(row: Row, p: Placement, mem: object, mode: str, own: bool, s: Schedule, secs: float,
          ref: float | None) -> str:
    m = s.meta
    bound = float(m["lower_bound"])
    mem_text = _mem(mem)
    ref_text = "-" if ref is None else f"{_f(ref)} ({'ok' if s.makespan <= ref + 1e-6 else 'WORSE'})"
    return (f"| {row.name} | {len(p.blocks)} | {mem_text} | {mode}{' own' if own else ''} | {secs:.1f} | "
            f"{_f(s.makespan)} | {_f(bound)} {m['bound_source']} | {s.makespan / bound:.3f} | "
            f"{_f(s.lower_bound)} | {s.makespan / s.lower_bound:.3f} | {m['base']} | {ref_text} |")


def _mem(mem: object) -> str:
    if isinstance(mem, (list, tuple)):
        return f"{_f(min(mem))}-{_f(max(mem))}"
    return "-" if mem is None else _f(float(mem))  # type: ignore[arg-type]


def _f(x: float) -> str:
    return str(int(x)) if abs(x - round(x)) < 1e-9 else f"{x:.6g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="groups: library, gpt, mshape-mem")
    ap.add_argument("--names", nargs="*", default=[], help="row names to run (default: all of the groups)")
    ap.add_argument("--modes", nargs="*", default=["tessel", "fast"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--own", action="store_true", help="also each search with no baseline raced")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "scale.md"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    lines = []
    for row in rows(args.only):
        if args.names and row.name not in args.names:
            continue
        lines += run_row(row, args.time_limit, args.modes, args.own)
    head = ["# Scale: 32 devices and M shapes under memory, N = 128", "",
            f"Time limit {args.time_limit:g} s per search (a wall clock). `own`: no baseline raced. Ratio: "
            "makespan over the proven bound of the search's report, and over the FORMAT.md bound (LB). "
            f"Machine: {platform.machine()}, python {platform.python_version()}, 2 cores shared with other jobs.",
            "", "| placement | blocks | memory | mode | seconds | makespan | bound | ratio | LB | ratio LB | base | "
            "reference (1F1B) |", "|" + "---|" * 12]
    cmd = "`.venv/bin/python bench/scale.py " + " ".join(sys.argv[1:]) + "`"
    atomic_write(args.output, "\n".join(head + lines + ["", "Reproduce: " + cmd]) + "\n")


if __name__ == "__main__":
    main()

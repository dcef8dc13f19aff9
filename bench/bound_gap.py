"""Proven gap on the zero-bubble grid: the makespans bench/peers.py recorded, against the bound
that knows latency and memory (bounds.device_lower_bound) and the bounds before it.

For every row of the peers tables given (default: bench/results/peers*.md) the placement is built
again (bench/peers.py's Row) and its bounds computed: `old`, the best of FORMAT.md's, the fill
through all-device blocks and Little's law on the memory limit (what the search reported before);
`device`, one device at a time with every task's own release and tail (latency and memory delays
per micro-batch); `bound`, the best of them. `tessel` and `best` (the shortest of tessel, the
zero-bubble repository's scheduler and every baseline column) are read from the table as recorded;
their ratios to `bound` are the proven gaps. Only rows with latency unless --all.

    .venv/bin/python bench/bound_gap.py                  # writes bench/results/bound_gap.md
    .venv/bin/python bench/bound_gap.py --all -o /tmp/gap.md bench/results/peers-memory.md
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from peers import Row  # noqa: E402

from tessel import bounds  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.placement import Number, Placement  # noqa: E402
from tessel.search.problem import make_problem  # noqa: E402

MAKESPANS = ("1f1b", "gpipe", "greedy", "zb-h1", "zb-h2", "zb-v", "zb-v-half", "zb-v-min", "peer", "tessel")


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of the markdown table in a peers result file, by column name."""
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("| ")]
    if not lines:
        return []
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(head, (c.strip() for c in ln.strip("|").split("|")))) for ln in lines[1:]]


def row_of(cells: dict[str, str]) -> Row:
    memory = int(cells["memory"].split()[0])  # "1 M_B = 8"
    return Row(cells["placement"], int(cells["p"]), int(cells["m"]), cells["costs"], cells["latency"] != "0", memory)


def proven(p: Placement, n: int, limit: Number) -> tuple[Number, Number]:
    """(best bound before, device bound) of n micro-batches under `limit` per device."""
    problem = make_problem(p, limit)
    holds = problem.real_holds()
    old = max([bounds.lower_bound(p, n), bounds.shard_lower_bound(p, n),
               *(bounds.memory_lower_bound(p, n, d, h, lim) for d, (lim, h) in holds.items())])
    return old, bounds.device_lower_bound(p, n, holds)


def _num(x: str) -> float | None:
    try:
        return float(x)
    except ValueError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("tables", nargs="*", help="peers result files (default: bench/results/peers*.md)")
    ap.add_argument("--all", action="store_true", help="rows without latency too")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "bound_gap.md"))
    args = ap.parse_args()
    files = [Path(t) for t in args.tables] or sorted((ROOT / "bench" / "results").glob("peers*.md"))
    out, over, count = [], 0, 0
    for f in files:
        for cells in read_rows(f):
            row = row_of(cells)
            if not row.latency and not args.all:
                continue
            t0 = time.perf_counter()
            old, device = proven(row.placement(), row.m, row.limit)
            secs = time.perf_counter() - t0
            bound = max(old, device)
            tessel = _num(cells["tessel"])
            best = min(x for x in (_num(cells.get(c, "-")) for c in MAKESPANS) if x is not None)
            gap = None if tessel is None else tessel / bound
            count += 1
            over += gap is not None and gap > 1.05 + 1e-9
            line = (f"| {f.name} | {row.shape} | {row.p} | {row.m} | {row.costs} | {cells['memory']} | {old:.6g} | "
                    f"{device:.6g} | {bound:.6g} | {'-' if tessel is None else f'{tessel:.6g}'} | {best:.6g} | "
                    f"{'-' if gap is None else f'{gap:.4f}'} | {best / bound:.4f} | "
                    f"{'-' if tessel is None else f'{tessel / old:.4f}'} | {secs:.2f} |")
            out.append(line)
            print(line, flush=True)
    head = ["# Proven gap on the zero-bubble grid: the bound that knows latency and memory", "",
            "Makespans as recorded by bench/peers.py in the files named; bounds computed now. `old`: the best "
            "bound the search reported before (FORMAT.md, fill through all-device blocks, Little's law on "
            "memory); `device`: bounds.device_lower_bound; `best`: the shortest of tessel, the zero-bubble "
            "repository's scheduler and every baseline. Gaps are makespan / bound. "
            f"Machine: {platform.machine()}, python {platform.python_version()}, 2 cores shared with other jobs.",
            "", f"Rows with tessel more than 5% above the bound: {over} of {count}.", "",
            "| file | placement | p | m | costs | memory | old | device | bound | tessel | best | tessel / bound | "
            "best / bound | tessel / old | bound s |", "|" + "---|" * 15]
    cmd = "`.venv/bin/python bench/bound_gap.py " + " ".join(sys.argv[1:]) + "`"
    atomic_write(args.output, "\n".join(head + out + ["", "Reproduce: " + cmd]) + "\n")


if __name__ == "__main__":
    main()

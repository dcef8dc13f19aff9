"""Baselines on every named placement: makespan against the lower bound, peak memory, seconds.

Every applicable baseline on every built-in placement at a few device counts, N micro-batches,
no memory limit; plus how long the largest placements take to build. Seconds include finding
the repetend and validating the schedule.

    .venv/bin/python bench/baselines.py                     # writes bench/results/baselines.md
    .venv/bin/python bench/baselines.py --devices 4 -n 16 -o /tmp/b.md
"""
from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

from tessel import library
from tessel.baselines import BASELINES, applicable
from tessel.io import atomic_write


def rows_for(devices: int, n: int) -> list[str]:
    out = []
    for name in library.PLACEMENTS:
        p = library.build(name, devices=devices)
        for method in applicable(p):
            if method == "interleaved" and n % devices:
                continue
            t0 = time.perf_counter()
            s = BASELINES[method](p, n, None)
            secs = time.perf_counter() - t0
            out.append(f"| {p.name} | {method} | {s.makespan} | {s.lower_bound} | {s.ratio:.3f} | "
                       f"{max(s.peak_memory)} | {'yes' if s.repetend else 'no'} | {secs:.3f} |")
    return out


def build_times() -> list[str]:
    out = []
    for name, kw in (("vshape", {"devices": 32}), ("interleaved", {"devices": 32, "chunks": 16}),
                     ("alphafold", {"devices": 32, "passes": 8})):
        t0 = time.perf_counter()
        p = library.build(name, **kw)
        out.append(f"| {p.name} | {len(p.blocks)} | {time.perf_counter() - t0:.4f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8, 32])
    ap.add_argument("-n", "--micro-batches", type=int, default=64)
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "baselines.md"))
    args = ap.parse_args()
    lines = ["# Baselines on the named placements", "",
             f"N = {args.micro_batches} micro-batches, default costs, no memory limit. Machine: "
             f"{platform.machine()}, python {platform.python_version()}.", "",
             "| placement | baseline | makespan | lower bound | ratio | peak memory | repetend | seconds |",
             "|---|---|---|---|---|---|---|---|"]
    for d in args.devices:
        lines += rows_for(d, args.micro_batches)
    lines += ["", "| placement | blocks | build seconds |", "|---|---|---|"] + build_times()
    lines += ["", "Reproduce: `.venv/bin/python bench/baselines.py`"]
    text = "\n".join(lines) + "\n"
    atomic_write(args.output, text)
    print(text, end="")


if __name__ == "__main__":
    main()

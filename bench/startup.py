"""Start-up of `tessel run`: wall time of one training step, process start to exit, a fresh process each run.

Rows: `tessel run` of one step (mlp on vshape, 4 processes, 8 micro-batches) with a baseline
schedule (1f1b) and with a searched one (tessel), and for scale a bare `import torch` and the CLI
alone (`tessel --help`). Runs alternate between the rows (machine noise hits them alike); the table
shows the median and the range. Output is captured through a pipe, so a process that still held it
open (the fork server) would count. Writes bench/results/startup.md.

    .venv/bin/python bench/startup.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tessel.io import atomic_write

ROOT = Path(__file__).resolve().parents[1]
RUN = ["-m", "tessel", "run", "--model", "mlp", "--placement", "vshape", "--devices", "4", "--micro-batches", "8",
       "--steps", "1", "--schedule"]
ROWS = {
    "tessel run, --schedule 1f1b": RUN + ["1f1b"],
    "tessel run, --schedule tessel": RUN + ["tessel"],
    "python -c 'import torch'": ["-c", "import torch"],
    "tessel --help (the CLI alone)": ["-m", "tessel", "--help"],
}


def wall_seconds(args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, capture_output=True, env=env, cwd=ROOT, timeout=300)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "startup.md"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.runs):
        for name, cmd in ROWS.items():
            times[name].append(wall_seconds(cmd))
    rows = [(name, statistics.median(ts), min(ts), max(ts)) for name, ts in times.items()]
    for name, med, low, high in rows:
        print(f"{name}: median {med:.2f} s (range {low:.2f}-{high:.2f}) over {args.runs} runs", flush=True)
    atomic_write(args.output, _markdown(args.runs, rows, load_before))
    print(f"wrote {args.output}")
    return 0


def _markdown(runs: int, rows: list[tuple[str, float, float, float]], load_before: float) -> str:
    lines = [
        "# Start-up: `tessel run` of one step",
        "",
        f"Wall time from process start to exit (output through a pipe), {runs} runs of each row, alternating. "
        f"`tessel run` rows: `python {' '.join(RUN)} METHOD`. Machine: {platform.machine()}, {os.cpu_count()} "
        f"cores SHARED with other work (load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at "
        f"the end); python {sys.version.split()[0]}.",
        "",
        "| command | median (s) | min (s) | max (s) |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {med:.2f} | {low:.2f} | {high:.2f} |" for name, med, low, high in rows]
    lines += ["", "Reproduce: `.venv/bin/python bench/startup.py`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

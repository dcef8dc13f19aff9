"""Iteration time of tessel's executor vs torch.distributed.pipelining's Schedule1F1B.

Same model (the `mlp` or `gpt` example on the vshape placement: one stage per rank), same
stages, same micro-batches, same batch; both run in the same processes, alternating step by step
(who goes first alternates too), so machine noise hits both alike. A step is forward + backward
of every micro-batch (no optimizer), timed on rank 0 between two barriers. The table shows the
median of each over the timed steps and their ratio (ratio of the medians: a median of per-step
ratios can hide a deficit), with a 95% bootstrap interval (steps resampled in pairs, seeded); the
verdict says "on par" only when the interval contains 1. It also times `tessel run` of one step
(process start to exit: imports, fork server, rendezvous, the step). Writes bench/results/runtime.md.
A Hugging Face GPT-2, tessel's searched schedule against 1F1B and Schedule1F1B: bench/runtime_gpt2.py.

    .venv/bin/python bench/runtime.py [--steps 60] [--micro-batches 8] [--ranks 4] [--startup 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tessel import library
from tessel.baselines import BASELINES
from tessel.io import atomic_write
from tessel.runtime.executor import Executor
from tessel.runtime.launch import Options, launch
from tessel.runtime.networks import Config, example
from tessel.runtime.pipelining import stage_module
from tessel.runtime.program import lower
from tessel.schedule import schedule_from_dict

CASES = {  # model, config, samples per micro-batch
    "mlp": ("mlp", Config(dim=256, ffn=1024, features=256), 32),
    "gpt": ("gpt", Config(vocab=512, dim=128, heads=4, ffn=512, seq=32, layers=2), 8),
}


def _timed(fn: Callable[[], Any]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def worker(ctx: Any, case: str, doc: dict[str, Any], steps: int, warmup: int) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    model, cfg, mb_size = CASES[case]
    s = schedule_from_dict(doc)
    ex = example(model, s.placement, cfg)
    (block,) = [b for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)]
    ours_m, theirs_m = ex.build(block, None), ex.build(block, None)
    ours = Executor(lower(s), ctx, {block: ours_m}, ex.feeds)
    stage = ex.flow.forwards.index(block)
    sink = ex.flow.sinks[0]
    theirs = Schedule1F1B(PipelineStage(stage_module(theirs_m), stage, len(ex.flow.forwards), ctx.device),
                          s.micro_batches, loss_fn=ex.whole(sink).loss, scale_grads=True)
    batch = ex.batch(mb_size * s.micro_batches, seed=1)
    args = [batch[f] for f in ex.feeds[block]] if stage == 0 else []
    target = batch[ex.feeds[sink][-1]] if block == sink else None

    def run_theirs() -> None:
        theirs_m.zero_grad(set_to_none=True)
        theirs.step(*args, target=target)

    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    runs = [("ours", lambda: ours.run(batch)), ("theirs", run_theirs)]
    for i in range(warmup + steps):
        for name, fn in runs if i % 2 else runs[::-1]:  # who goes first alternates
            t = _timed(fn)
            if i >= warmup:
                times[name].append(t)
    diff = max(float((p.grad - q.grad).abs().max()) if p.grad is not None and q.grad is not None else float("inf")
               for p, q in zip(ours_m.parameters(), theirs_m.parameters()))
    return {"times": times, "grad_diff": diff}


def ratio_interval(ours: Sequence[float], theirs: Sequence[float], resamples: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """median(ours) / median(theirs), and its 95% bootstrap interval over steps resampled in pairs."""
    rng = random.Random(seed)
    n = len(ours)
    ratios = []
    for _ in range(resamples):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(statistics.median(ours[i] for i in idx) / statistics.median(theirs[i] for i in idx))
    ratios.sort()
    return (statistics.median(ours) / statistics.median(theirs), ratios[int(0.025 * resamples)],
            ratios[int(0.975 * resamples) - 1])


def verdict(low: float, high: float) -> str:
    if low <= 1 <= high:
        return "on par"
    return f"ours {(low - 1) * 100:.0f}-{(high - 1) * 100:.0f}% slower" if low > 1 else \
        f"ours {(1 - high) * 100:.0f}-{(1 - low) * 100:.0f}% faster"


def startup_seconds(repeats: int) -> list[float]:
    """Wall time of `tessel run` of one step, a fresh process each time."""
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "tessel", "run", "--model", "mlp", "--schedule", "1f1b", "--steps", "1"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env, cwd=root, timeout=300)
        out.append(time.perf_counter() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cases", default="mlp,gpt")
    ap.add_argument("--startup", type=int, default=3, help="`tessel run` start-up timings (0: none)")
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "runtime.md"))
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    placement = library.build("vshape", args.ranks)
    schedule = BASELINES["1f1b"](placement, args.micro_batches, None)
    rows = []
    for case in args.cases.split(","):
        model, cfg, mb_size = CASES[case]
        res = launch(worker, args.ranks, (case, schedule.to_dict(), args.steps, args.warmup),
                     Options(timeout=900, pg_timeout=120))
        times = res[0]["times"]
        ratio, low, high = ratio_interval(times["ours"], times["theirs"])
        ours, theirs = statistics.median(times["ours"]), statistics.median(times["theirs"])
        diff = max(r["grad_diff"] for r in res)
        rows.append((case, mb_size, ours, theirs, ratio, low, high, diff))
        print(f"{case}: ours {ours * 1e3:.1f} ms, torch Schedule1F1B {theirs * 1e3:.1f} ms, ratio {ratio:.3f} "
              f"[{low:.3f}, {high:.3f}] ({verdict(low, high)}), max grad diff {diff:.2g}", flush=True)
    startup = startup_seconds(args.startup) if args.startup > 0 else []
    if startup:
        print(f"tessel run, one step: median {statistics.median(startup):.1f} s of {startup}")
    atomic_write(args.output, _markdown(args, rows, startup, load_before))
    print(f"wrote {args.output}")
    return 0


def _markdown(args: argparse.Namespace, rows: list[tuple[Any, ...]], startup: list[float],
              load_before: float) -> str:
    lines = [
        "# Runtime: tessel executor vs torch.distributed.pipelining Schedule1F1B",
        "",
        f"vshape placement, {args.ranks} ranks (gloo, CPU, 1 thread each), 1F1B, {args.micro_batches} "
        f"micro-batches; {args.steps} steps of each after {args.warmup} warm-up steps, alternating in the same "
        f"processes (who goes first alternates). Ratio = median(ours) / median(theirs); the interval is a 95% "
        f"bootstrap over the steps resampled in pairs (2000 resamples, seed 0); \"on par\" only when it "
        f"contains 1. Machine: {platform.machine()}, {os.cpu_count()} cores SHARED with other work (load "
        f"average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end), so absolute times are "
        f"noisy; the ratio is measured side by side. torch {torch.__version__}, python {sys.version.split()[0]}.",
        "",
        "| model | samples / micro-batch | ours (ms) | Schedule1F1B (ms) | ours / theirs | 95% interval | verdict "
        "| max grad diff |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, mb, ours, theirs, ratio, low, high, diff in rows:
        lines.append(f"| {case} | {mb} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ratio:.3f} | "
                     f"[{low:.3f}, {high:.3f}] | {verdict(low, high)} | {diff:.2g} |")
    if startup:
        lines += ["", f"`tessel run --model mlp --schedule 1f1b --steps 1` (4 processes), wall time from start to "
                      f"exit: median {statistics.median(startup):.1f} s over {len(startup)} runs "
                      f"({', '.join(f'{t:.1f}' for t in startup)} s; target < 5 s on an idle machine)."]
    lines += ["", "Reproduce: `.venv/bin/python bench/runtime.py`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

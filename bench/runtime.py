"""Iteration time of tessel's executor vs torch.distributed.pipelining's Schedule1F1B.

Same model (the `mlp` or `gpt` example on the vshape placement: one stage per rank), same
stages, same micro-batches, same batch; both run in the same processes, alternating step by step
(who goes first alternates too), so machine noise hits both alike. A step is forward + backward
of every micro-batch (no optimizer), timed on rank 0 between two barriers; the table shows the
median over the timed steps, and the ratio ours / theirs as the median of the per-step ratios
(a step of each, back to back, share the machine's noise; target: <= 1.1). Writes
bench/results/runtime.md.

    .venv/bin/python bench/runtime.py [--steps 20] [--micro-batches 8] [--ranks 4]
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tessel import library
from tessel.baselines import BASELINES
from tessel.placement import atomic_write
from tessel.runtime.executor import Executor
from tessel.runtime.launch import Options, launch
from tessel.runtime.models import Config, example
from tessel.runtime.pipelining import stage_module
from tessel.runtime.program import lower
from tessel.schedule import schedule_from_dict

CASES = {  # model, config, samples per micro-batch
    "mlp": ("mlp", Config(dim=256, ffn=1024, features=256), 32),
    "gpt": ("gpt", Config(vocab=512, dim=128, heads=4, ffn=512, seq=32, layers=2), 8),
}


def _timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - t0


def worker(ctx, case: str, doc: dict, steps: int, warmup: int) -> dict:
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
    diff = max(float((p.grad - q.grad).abs().max()) for p, q in zip(ours_m.parameters(), theirs_m.parameters()))
    return {"times": times, "grad_diff": diff}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cases", default="mlp,gpt")
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "runtime.md"))
    args = ap.parse_args(argv)
    placement = library.build("vshape", args.ranks)
    schedule = BASELINES["1f1b"](placement, args.micro_batches, None)
    rows = []
    for case in args.cases.split(","):
        model, cfg, mb_size = CASES[case]
        res = launch(worker, args.ranks, (case, schedule.to_dict(), args.steps, args.warmup),
                     Options(timeout=600, pg_timeout=120))
        times = res[0]["times"]
        ours, theirs = statistics.median(times["ours"]), statistics.median(times["theirs"])
        ratio = statistics.median(a / b for a, b in zip(times["ours"], times["theirs"]))
        diff = max(r["grad_diff"] for r in res)
        rows.append((case, mb_size, ours, theirs, ratio, diff))
        print(f"{case}: ours {ours * 1e3:.1f} ms, torch Schedule1F1B {theirs * 1e3:.1f} ms, "
              f"ratio {ratio:.3f}, max grad diff {diff:.2g}", flush=True)
    atomic_write(args.output, _markdown(args, rows))
    print(f"wrote {args.output}")
    return 0 if all(r[4] <= 1.1 for r in rows) else 1


def _markdown(args: argparse.Namespace, rows: list[tuple]) -> str:
    lines = [
        "# Runtime: tessel executor vs torch.distributed.pipelining Schedule1F1B",
        "",
        f"vshape placement, {args.ranks} ranks (gloo, CPU, 1 thread each), 1F1B, {args.micro_batches} "
        f"micro-batches; median of {args.steps} steps after {args.warmup} warm-up steps, both "
        f"alternating in the same processes; ratio = median of the per-step ratios. Machine: "
        f"{platform.machine()}, {os.cpu_count()} cores (load average {os.getloadavg()[0]:.1f} at the "
        f"end: other work shares them), torch {torch.__version__}, python {sys.version.split()[0]}.",
        "",
        "| model | samples / micro-batch | ours (ms) | Schedule1F1B (ms) | ours / theirs | max grad diff |",
        "|---|---|---|---|---|---|",
    ]
    for case, mb, ours, theirs, ratio, diff in rows:
        lines.append(f"| {case} | {mb} | {ours * 1e3:.1f} | {theirs * 1e3:.1f} | {ratio:.3f} | {diff:.2g} |")
    lines += ["", "Reproduce: `.venv/bin/python bench/runtime.py`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

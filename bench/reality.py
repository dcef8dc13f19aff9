"""Check against reality: profile the runtime's example models, search a schedule, run it on 4
gloo ranks on this CPU, and compare the measured iteration time with the simulated one.

Per model: (1) profile every block in this process (tessel.runtime.profiler, one thread, median of
repeats) into a placement in ms; (2) schedule it with `tessel` (no memory limit: these models
are small) and with `1f1b`; (3) launch 4 ranks that calibrate the machine -- a ping-pong between
two ranks gives the message latency; the blocks are profiled again in the job, on one rank
alone, and the sharded ones on all ranks at once, tensor-parallel with their collectives --
then run the schedules in turn, step by step (median step time on rank 0, between barriers),
measuring before each step the cores the ranks really get (the model's heaviest block timed
alone and on all ranks at once); (4) replay each schedule with tessel.simulate: with the
durations profiled beforehand and the measured latency ("simulated"), and with the in-job
durations and the ranks sharing the calibrated cores ("calibrated").

    .venv/bin/python bench/reality.py            # writes bench/results/reality.md
    .venv/bin/python bench/reality.py --models gpt --steps 4
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tessel import library
from tessel.io import atomic_write
from tessel.methods import run_method
from tessel.runtime.comm import make_groups
from tessel.runtime.executor import Executor
from tessel.runtime.launch import Options, launch
from tessel.runtime.networks import Config, example
from tessel.runtime.profiler import profile
from tessel.runtime.program import lower
from tessel.schedule import Schedule, schedule_from_dict
from tessel.simulate import simulate

RANKS = 4
CASES = {  # example model, placement, config, samples per micro-batch
    "mlp": ("mlp", "vshape", Config(dim=512, ffn=2048, features=512), 256),
    "gpt": ("gpt", "mllm", Config(vocab=2048, dim=256, heads=4, ffn=1024, seq=64, layers=2), 8),
    "kshape": ("kshape", "kshape", Config(vocab=512, dim=256, heads=4, ffn=1024, seq=64, layers=2), 8),
}
def profiled(case: str) -> tuple[Any, Any]:
    model, pname, cfg, mbs = CASES[case]
    p = library.build(pname, devices=RANKS)
    ex = example(model, p, cfg)
    batch = ex.batch(mbs)
    prof = profile(p, {b: ex.whole(b) for b in ex.flow.forwards},
                   {b: [batch[f] for f in ex.feeds[b]] for b in ex.flow.forwards}, repeats=9, warmup=3)
    return prof, ex


# ---- the ranks ------------------------------------------------------------------------------------
def _ping_pong_ms(ctx: Any, nbytes: int, reps: int = 30) -> float:
    x = torch.zeros(max(1, nbytes // 4))
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        if ctx.rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        elif ctx.rank == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
        times.append((time.perf_counter() - t0) / 2 * 1e3)
    return statistics.median(times)


def _in_job_profiles(ctx: Any, ex: Any, mbs: int) -> tuple[dict[str, float], dict[str, float]]:
    """The model's blocks profiled in the job: on rank 0 alone while the others wait at a barrier
    (whole modules), then on every rank at once with the sharded blocks parallel over their group
    (their collectives included; every rank makes the same calls, so the collectives line up).
    Returns the lone durations and the sharded blocks' durations as they run together."""
    p = ex.placement
    batch = ex.batch(mbs)
    inputs = {b: [batch[f] for f in ex.feeds[b]] for b in ex.flow.forwards}
    dist.barrier()
    alone = (profile(p, {b: ex.whole(b) for b in ex.flow.forwards}, inputs, repeats=9, warmup=3).placement
             if ctx.rank == 0 else None)
    dist.barrier()
    modules = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None)
               for b in ex.flow.forwards}
    together = profile(p, modules, inputs, repeats=9, warmup=3, sharded_modules=True).placement
    lone = {b.id: b.duration for b in alone.blocks} if alone else {}
    return lone, {b.id: b.duration for b in together.blocks if len(b.devices) > 1}


def _probe(ex: Any, mbs: int) -> Callable[[], None]:
    """Forward and backward of the model's heaviest one-device block on one micro-batch."""
    batch, out = ex.batch(mbs), dict[str, Any]()
    with torch.no_grad():
        for b in ex.flow.forwards:
            out[b] = ex.whole(b)(*_args(ex, b, out, batch))
    single = [b for b in ex.flow.forwards if len(ex.flow.devices(b)) == 1]
    block = max(single, key=lambda b: sum(q.numel() for q in ex.whole(b).parameters()))
    module, args = ex.whole(block), _args(ex, block, out, batch)

    def run() -> None:
        xs = [a.detach().requires_grad_(a.is_floating_point()) for a in args]
        y = module(*xs)
        y.backward(torch.ones_like(y))
    return run


def _args(ex: Any, b: str, out: dict[str, Any], batch: Any) -> list[Any]:
    return [out[x] for x, _ in ex.flow.in_edges[b]] + [batch[f] for f in ex.feeds[b]]


def _cores_now(ctx: Any, probe: Callable[[], None], reps: int = 3) -> float:
    """Cores the ranks get now: 4 x the probe's time on rank 0 alone (the others wait at a
    barrier) / its mean time with every rank running it at once; at most the machine's cores.
    The model's own block, so memory-bandwidth contention counts too."""
    def timed() -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            probe()
        return time.perf_counter() - t0
    dist.barrier()
    alone = timed() if ctx.rank == 0 else 0.0
    dist.barrier()
    sums = torch.tensor([alone, timed() / ctx.world])
    dist.all_reduce(sums)
    most = float(min(ctx.world, os.cpu_count() or ctx.world))
    return float(min(most, ctx.world * float(sums[0]) / float(sums[1])))


def worker(ctx: Any, case: str, docs: dict[str, dict[str, Any]], steps: int, message_bytes: int) -> dict[str, Any]:
    """Calibrate, then run the schedules in turn step by step (machine noise hits them alike)."""
    model, _, cfg, mbs = CASES[case]
    torch.manual_seed(0)
    schedules = {name: schedule_from_dict(doc) for name, doc in docs.items()}
    placement = next(iter(schedules.values())).placement  # every schedule is of this placement
    ex = example(model, placement, cfg)
    make_groups(ctx, [b.devices for b in placement.blocks])
    lone, sharded = _in_job_profiles(ctx, ex, mbs)
    out: dict[str, Any] = {"latency_ms": _ping_pong_ms(ctx, message_bytes), "lone_ms": lone,
                           "sharded_ms": sharded}
    probe, cores = _probe(ex, mbs), []
    blocks = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None)
              for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    runs = {name: (Executor(lower(s), ctx, blocks, ex.feeds), ex.batch(mbs * s.micro_batches, seed=1))
            for name, s in schedules.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for i in range(steps + 2):
        if i >= 2:  # calibrate between the steps: the machine's load changes as they run
            cores.append(_cores_now(ctx, probe))
        for name, (exe, batch) in runs.items():
            t = _step_ms(exe, batch)
            if i >= 2:
                times[name].append(t)
    out["step_ms"] = {name: statistics.median(ts) for name, ts in times.items()}
    out["cores"] = statistics.median(cores)
    return out


def _step_ms(exe: Executor, batch: Any) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    exe.run(batch)
    dist.barrier()
    return (time.perf_counter() - t0) * 1e3


# ---- the check ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    case: str
    method: str
    measured_ms: float
    simulated_ms: float       # durations profiled beforehand, measured latency, one core per rank
    shared_ms: float          # durations profiled in the job, the ranks sharing the calibrated cores
    cores: float
    latency_ms: float

    def error(self, sim: float) -> float:
        return self.measured_ms / sim - 1


def schedules(placement: Any, n: int, time_limit: float) -> dict[str, Schedule]:
    """Tessel's schedule (mode `tessel`, or `fast` when that times out) and 1F1B's."""
    base = run_method("1f1b", placement, n)
    try:
        searched = run_method("tessel", placement, n, None, time_limit=time_limit)
    except (TimeoutError, ValueError):  # no repetend within the time limit
        searched = run_method("fast", placement, n, None, time_limit=time_limit)
    return {str(searched.meta.get("method", "tessel")): searched, "1f1b": base}


def check(case: str, args: argparse.Namespace) -> list[Row]:
    torch.set_num_threads(1)
    prof, ex = profiled(case)
    scheds = schedules(prof.placement, args.micro_batches, args.time_limit)
    message = max(b.output_bytes for b in prof.blocks)
    res = launch(worker, RANKS, (case, {k: s.to_dict() for k, s in scheds.items()}, args.steps, message),
                 Options(threads=1, timeout=900))
    r0 = res[0]
    calibrated = {**r0["lone_ms"], **r0["sharded_ms"]}
    rows = []
    for name, s in scheds.items():
        sim = simulate(s, latency=r0["latency_ms"])
        shared = simulate(s, durations=calibrated, latency=r0["latency_ms"], cores=r0["cores"])
        rows.append(Row(case, name, r0["step_ms"][name], sim.makespan, shared.makespan, r0["cores"],
                        r0["latency_ms"]))
    return rows


def report(rows: list[Row], args: argparse.Namespace, seconds: float) -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    lines = ["# Simulated vs measured iteration time (CPU, 4 gloo ranks)", "",
             f"Generated by `bench/reality.py` on {platform.node() or 'this machine'}: "
             f"{os.cpu_count()} CPU cores, load average at the end {load[0]:.1f}; torch "
             f"{torch.__version__}, one thread per rank; {args.micro_batches} micro-batches, median of "
             f"{args.steps} steps after 2 warm-up steps.", "",
             "`simulated`: durations profiled beforehand in one process (`tessel.runtime.profiler`), latency "
             "from a gloo ping-pong of the largest activation, every rank on its own core. `calibrated`: "
             "the same profiler run inside the job (one rank alone; the sharded blocks on all ranks "
             "with their collectives) and the ranks sharing `cores` = 4 x (the heaviest block's time "
             "alone) / (its time with all 4 ranks running it), measured between the steps (median), at "
             "most the machine's cores.", "",
             "| model | schedule | measured ms | simulated ms | error | cores | calibrated ms | error | latency ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.case} | {r.method} | {r.measured_ms:.1f} | {r.simulated_ms:.1f} | "
                     f"{r.error(r.simulated_ms):+.0%} | {r.cores:.2f} | {r.shared_ms:.1f} | "
                     f"{r.error(r.shared_ms):+.0%} | {r.latency_ms:.3f} |")
    within = [r for r in rows if abs(r.error(r.shared_ms)) <= 0.2]
    lines += ["", f"Calibrated within 20% of the measurement: {len(within)} of {len(rows)}. "
                  f"Run time {seconds:.0f} s.", ""]
    return "\n".join(lines + explanation())


def explanation() -> list[str]:
    return ["## Causes of the error", "",
            "- **Cores (the largest).** The simulator's devices run in parallel; here 4 rank processes "
            "share the machine's 2 cores with other users' processes, so the plain simulation is 2-4x "
            "too fast. Replaying with processor sharing (`simulate(..., cores=C)`) over the cores the "
            "ranks really got, calibrated on the model's own blocks (so memory-bandwidth contention "
            "counts too), removes that gap; a synthetic calibration kernel did not (it measured more "
            "cores than the blocks got).",
            "- **Collectives of the sharded blocks.** Profiled alone, a block on 4 ranks is its whole "
            "time / 4; run on gloo its all-reduces wait for every rank of its group to be scheduled. "
            "Profiling those blocks inside the job, tensor-parallel, accounts for it (gpt, kshape).",
            "- **Per-message cost.** Every activation and gradient crossing ranks is a gloo send/receive "
            "through the loopback, and a receiver waiting for a busy core wakes late; the ping-pong "
            "latency covers the transfer only. With small blocks this dominates: the mlp chain at 64 "
            "samples per micro-batch (3 ms blocks) measured twice its calibrated simulation; at 256 "
            "samples (12 ms blocks) it is within a few percent.",
            "- **Executor overhead** (Python dispatch per instruction, autograd bookkeeping, gradient "
            "accumulation) is not in a block's profile; small against blocks of tens of ms.",
            "- **Noise.** Other jobs on the machine change its speed from minute to minute; each row's "
            "schedules are measured step by step in turn so both see the same conditions, and the "
            "calibration runs in the same job, but repeated runs still differ by 10-20%.", ""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("-o", "--output", default=str(Path(__file__).parent / "results" / "reality.md"))
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for case in args.models:
        rows += check(case, args)
        for r in rows[-2:]:
            print(f"{r.case:7s} {r.method:7s} measured {r.measured_ms:8.1f} ms  simulated {r.simulated_ms:8.1f} "
                  f"({r.error(r.simulated_ms):+.0%})  shared {r.shared_ms:8.1f} ({r.error(r.shared_ms):+.0%})  "
                  f"cores {r.cores:.2f}", flush=True)
    atomic_write(args.output, report(rows, args, time.perf_counter() - t0))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

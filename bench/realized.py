"""Realized step time on emulated devices next to the schedule's predicted makespan; ours vs torch.

Emulated devices (tessel.runtime.emulate): every task sleeps its placement duration x UNIT_MS, the
lowering, executor, messages (real tensors, gloo) and processes are the real ones. A sleeping rank
uses no CPU, so 4-16 ranks fit on 2 cores: the step time measures what the executor adds to the
schedule, not the machine's compute.

Part 1, realized / predicted: every method that applies (gpipe, 1f1b, interleaved, zb-h1, zb-h2,
zb-v, dualpipev where `tessel.methods` has it, and tessel's search within the memory 1F1B's order
needs) on vshape, zb, zbv, interleaved, mshape, kshape at each rank count; one launch per
placement and rank count, every schedule in it `--steps` timed steps after a warm-up step (a step:
barrier, the program, barrier; rank 0's clock). Predicted = the schedule's orders run as early as
possible (its makespan, unless the search left idle time) x UNIT_MS. Median, and a 95% bootstrap
interval of the median ratio (steps resampled, 2000 resamples, seed 0). tessel / 1F1B: realized
ratio of medians with its interval (steps resampled in pairs) next to the predicted ratio.

Part 2, ours vs torch.distributed.pipelining on the same emulated stages: each stage's forward,
backward (input gradient) and weight gradient sleep the placement's durations (PipelineStage's
forward_one_chunk / backward_one_chunk / backward_weight_one_chunk; ours with the "wall" clock,
the same model: sleep once inputs are in, send after). Schedule1F1B (vshape, our 1f1b),
ScheduleInterleaved1F1B (interleaved, our interleaved), ScheduleZBVZeroBubble (zbv, our zb-v), and
_PipelineScheduleRuntime loading our exported CSV of the same schedule (the same order exactly).
Alternating step by step in the same processes; ratio of medians ours / torch with its interval.

    .venv/bin/python bench/realized.py [--ranks 4,8] [--unit-ms 40] [--steps 5] [--micro-batches 8]

Ranks are started past the launcher's per-core limit (they sleep); the memory they need is checked
first and each rank's peak is noted. At 16 ranks give 16 micro-batches (torch's Schedule1F1B wants
at least one per stage; a schedule torch refuses is a note, ours still measured):

    .venv/bin/python bench/realized.py --ranks 16 --micro-batches 16 --placements vshape,zbv,kshape \
        -o bench/results/realized-16.md
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime import _timed, ratio_interval, verdict  # noqa: E402

from tessel import library  # noqa: E402
from tessel.baselines.shapes import BaselineError  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.methods import METHODS, run_method, why_not_method  # noqa: E402
from tessel.runtime.comm import make_groups  # noqa: E402
from tessel.runtime.emulate import Emulation, SleepingDevice, replay_makespan  # noqa: E402
from tessel.runtime.forkserver import RANK_BYTES  # noqa: E402
from tessel.runtime.launch import Options, launch  # noqa: E402
from tessel.runtime.networks import Config, example  # noqa: E402
from tessel.runtime.pipelining import stage_module, stage_of, write_actions_csv  # noqa: E402
from tessel.runtime.program import lower  # noqa: E402
from tessel.runtime.train import RecordingExecutor, order_errors  # noqa: E402
from tessel.schedule import Schedule, schedule_from_dict  # noqa: E402

OUT = Path(__file__).parent / "results" / "realized.md"
PLACEMENTS = ("vshape", "zb", "zbv", "interleaved", "mshape", "kshape")
BASELINES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev")
TORCH = {"vshape": ("1f1b", "Schedule1F1B"), "interleaved": ("interleaved", "ScheduleInterleaved1F1B"),
         "zbv": ("zb-v", "ScheduleZBVZeroBubble")}
RATIO_CASES = ("mshape", "kshape", "zbv")  # tessel / 1F1B realized vs predicted


def _ours(ctx: Any, s: Schedule, ex: Any, blocks: dict[str, Any], emulation: Emulation) -> RecordingExecutor:
    mine = {b: m for b, m in blocks.items() if ctx.rank in ex.flow.devices(b)}
    rec = RecordingExecutor(lower(s), ctx, mine, ex.feeds, pacer=SleepingDevice(s.placement, emulation, ctx))
    rec.executed = []
    return rec


def worker(ctx: Any, docs: dict[str, Any], unit_ms: float, steps: int, features: int,
           csv_dir: str, no_torch: bool = False) -> dict[str, Any]:
    scheds = {k: schedule_from_dict(v) for k, v in docs.items()}
    first = next(iter(scheds.values()))
    ex = example("emulated", first.placement, Config(features=features))
    make_groups(ctx, [b.devices for b in first.placement.blocks])
    blocks = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None)
              for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    n = first.micro_batches
    batch = ex.batch(n, seed=1)
    out: dict[str, Any] = {"times": {}, "order": {}, "torch": {}}
    for name, s in scheds.items():
        rec = _ours(ctx, s, ex, blocks, Emulation(unit_ms))
        times = [_timed(lambda r=rec: r.run(batch)) for _ in range(steps + 1)][1:]
        out["times"][name] = times
        out["order"][name] = order_errors(s, ctx.rank, rec.executed[-len(s.device_orders()[ctx.rank]):])
    name = first.placement.name.split("-")[0]
    if name in TORCH and TORCH[name][0] in scheds and not no_torch:
        out["torch"] = _versus_torch(ctx, scheds[TORCH[name][0]], ex, blocks, unit_ms, steps, csv_dir, TORCH[name][1])
    out["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # peak, Linux: KiB
    return out


# ---- torch pipelining on the same emulated stages -------------------------------------------------
def _emulated_stage(module: Any, index: int, stages: int, device: Any, f: float, b: float, w: float) -> Any:
    """A PipelineStage whose forward / backward / weight gradient take f / b / w seconds (sleeping
    after the real, tiny compute; a full backward takes b + w)."""
    from torch.distributed.pipelining import PipelineStage

    def until(t: float) -> None:
        left = t - time.perf_counter()
        if left > 0:
            time.sleep(left)

    class Stage(PipelineStage):
        def forward_one_chunk(self, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            r = super().forward_one_chunk(*a, **k)
            until(t0 + f)
            return r

        def backward_one_chunk(self, bwd_chunk_id: int, loss: Any = None, full_backward: bool = True,
                               last_backward: bool = False) -> None:
            t0 = time.perf_counter()
            super().backward_one_chunk(bwd_chunk_id, loss, full_backward, last_backward)
            until(t0 + b + (w if full_backward else 0.0))

        def backward_weight_one_chunk(self, bwd_chunk_id: int, last_backward: bool = False) -> None:
            t0 = time.perf_counter()
            super().backward_weight_one_chunk(bwd_chunk_id, last_backward)
            until(t0 + w)

    return Stage(module, index, stages, device)


def _versus_torch(ctx: Any, s: Schedule, ex: Any, blocks: dict[str, Any], unit_ms: float, steps: int,
                  csv_dir: str, torch_name: str) -> dict[str, Any]:
    from torch.distributed.pipelining import schedules as ts
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    p, flow, unit = s.placement, ex.flow, unit_ms / 1e3
    stage = stage_of(flow)
    sink = flow.sinks[0]
    loss = ex.whole(sink).loss
    progs = lower(s)
    csv_path = os.path.join(csv_dir, f"{p.name}.csv")
    if ctx.rank == 0:
        write_actions_csv(progs, csv_path)
    dist.barrier()

    def stages() -> list[Any]:
        out = []
        for b in sorted((b for b in flow.forwards if ctx.rank in flow.devices(b)), key=lambda b: stage[b]):
            bwd = flow.backward[b]
            wgt = flow.weight.get(b)
            d = (p.by_id[b].duration, p.by_id[bwd].duration, p.by_id[wgt].duration if wgt else 0)
            module = stage_module(ex.build(b, None))
            out.append(_emulated_stage(module, stage[b], len(stage), ctx.device, *(float(x) * unit for x in d)))
        return out

    first = stages()
    try:  # torch checks its arguments as it builds a schedule, the same way on every rank
        native = (ts.Schedule1F1B(first[0], s.micro_batches, loss_fn=loss, scale_grads=True)
                  if torch_name == "Schedule1F1B" else
                  getattr(ts, torch_name)(first, s.micro_batches, loss_fn=loss, scale_grads=True))
        runtime = _PipelineScheduleRuntime(stages(), s.micro_batches, loss_fn=loss, scale_grads=True)  # type: ignore[no-untyped-call]
        runtime._load_csv(csv_path, format="compute_only")
    except ValueError as e:
        return {"method": TORCH_METHOD[torch_name], "times": {}, "refused": f"torch's {torch_name}: {e}"}
    wall = _ours(ctx, s, ex, blocks, Emulation(unit_ms, clock="wall"))
    batch = ex.batch(s.micro_batches, seed=1)
    first_block = flow.forwards[0]
    args = [batch[f] for f in ex.feeds[first_block]] if ctx.rank in flow.devices(first_block) else []
    target = batch[ex.feeds[sink][-1]] if ctx.rank in flow.devices(sink) else None
    runs: list[tuple[str, Callable[[], Any]]] = [
        ("ours", lambda: wall.run(batch)),
        (torch_name, lambda: native.step(*args, target=target)),
        ("torch runtime, our CSV", lambda: runtime.step(*args, target=target)),
    ]
    times: dict[str, list[float]] = {k: [] for k, _ in runs}
    for i in range(steps + 1):
        for name, fn in runs[i % 3:] + runs[:i % 3]:  # the order rotates every step
            t = _timed(fn)
            if i:
                times[name].append(t)
    return {"method": TORCH_METHOD[torch_name], "times": times}


TORCH_METHOD = {v[1]: v[0] for v in TORCH.values()}


# ---- driver -------------------------------------------------------------------------------------
def schedules(name: str, ranks: int, n: int, time_limit: float, skipped: list[str]) -> dict[str, Schedule]:
    return schedules_on(library.build(name, ranks), n, time_limit, BASELINES, skipped)


def schedules_on(p: Any, n: int, time_limit: float, baselines: Sequence[str],
                 skipped: list[str] | None = None) -> dict[str, Schedule]:
    """Every baseline that applies and tessel's search within the memory of 1F1B's peak, validated;
    a baseline that refuses `n` micro-batches (dualpipev wants one per stage) is named in `skipped`."""
    out: dict[str, Schedule] = {}
    for m in baselines:
        if m in METHODS and why_not_method(m, p) is None:
            try:
                out[m] = run_method(m, p, n)
            except BaselineError as e:
                (skipped if skipped is not None else []).append(f"{p.name}: {m} left out: {e}")
    memory = max(out["1f1b"].peak_memory) if "1f1b" in out else None
    out["tessel"] = run_method("tessel", p, n, memory, time_limit=time_limit)
    for k, s in out.items():
        if s.errors():
            raise RuntimeError(f"{k} on {p.name}: invalid schedule: {s.errors()[0]}")
    return out


def _fits(ranks: int) -> None:
    """Refuse a rank count whose processes would not fit in the memory available now."""
    need = ranks * RANK_BYTES
    with open("/proc/meminfo") as f:
        free = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    if need > free:
        raise RuntimeError(f"{ranks} ranks need about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB available")


def median_interval(xs: Sequence[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choice(xs) for _ in xs) for _ in range(resamples))
    return statistics.median(xs), meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", default="4,8")
    ap.add_argument("--placements", default=",".join(PLACEMENTS))
    ap.add_argument("--unit-ms", type=float, default=40.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--features", type=int, default=1024, help="floats per activation (default 1024: 4 KiB)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="tessel search seconds")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("-o", "--output", default=str(OUT))
    args = ap.parse_args(argv)
    started, load_before = time.time(), os.getloadavg()
    rows, ratio_rows, torch_rows, notes = [], [], [], []
    for ranks in (int(r) for r in args.ranks.split(",")):
        for name in args.placements.split(","):
            scheds = schedules(name, ranks, args.micro_batches, args.time_limit, notes)
            docs = {k: s.to_dict() for k, s in scheds.items()}
            csv_dir = str(Path(args.output).parent)
            t0 = time.time()
            try:
                # sleeping ranks use no CPU: more of them than the launcher's per-core limit fit (their
                # memory is checked here instead, and each rank's peak reported)
                _fits(ranks)
                res = launch(worker, ranks, (docs, args.unit_ms, args.steps, args.features, csv_dir, args.no_torch),
                             Options(timeout=1800, pg_timeout=300, oversubscribe=True))
            except Exception as e:  # one failed case is a note, not a lost run
                notes.append(f"{name}-{ranks}: FAILED: {str(e).splitlines()[0][:300]}")
                print(notes[-1], flush=True)
                continue
            times, errors = res[0]["times"], [e for r in res for errs in r["order"].values() for e in errs]
            rss = [r["rss_mib"] for r in res]
            notes.append(f"{name}-{ranks}: peak memory per rank {min(rss):.0f}-{max(rss):.0f} MiB, "
                         f"{sum(rss) / 1024:.1f} GiB in all")
            if errors:
                notes.append(f"{name}-{ranks}: executed order differs: {errors[:2]}")
            for k, s in scheds.items():
                pred = replay_makespan(s) * args.unit_ms / 1e3
                med, low, high = median_interval(times[k])
                rows.append((f"{name}-{ranks}", k, float(s.makespan), replay_makespan(s), pred, med, med / pred,
                             low / pred, high / pred))
            if name in RATIO_CASES and "1f1b" in scheds:
                pr = replay_makespan(scheds["tessel"]) / replay_makespan(scheds["1f1b"])
                r, lo, hi = ratio_interval(times["tessel"], times["1f1b"])
                ratio_rows.append((f"{name}-{ranks}", pr, r, lo, hi, (r - pr) * 100))
            tr = res[0]["torch"]
            if tr.get("refused"):
                notes.append(f"{name}-{ranks}: no torch comparison: {tr['refused']}")
            elif tr:
                t = tr["times"]
                for other in [k for k in t if k != "ours"]:
                    r, lo, hi = ratio_interval(t["ours"], t[other])
                    torch_rows.append((f"{name}-{ranks}", tr["method"], other, statistics.median(t["ours"]),
                                       statistics.median(t[other]), r, lo, hi))
            print(f"{name}-{ranks}: {len(scheds)} schedules in {time.time() - t0:.0f} s; "
                  + ", ".join(f"{k} {r[6]:.3f}" for r in rows[-len(scheds):] for k in [r[1]]), flush=True)
            for f in Path(csv_dir).glob(f"{name}-{ranks}*.csv"):
                f.unlink()
            # the table so far, after every case: a long run interrupted keeps what it measured
            atomic_write(args.output, _markdown(args, rows, ratio_rows, torch_rows, notes, load_before,
                                                time.time() - started))
    text = _markdown(args, rows, ratio_rows, torch_rows, notes, load_before, time.time() - started)
    atomic_write(args.output, text)
    print(text)
    return 0


def _markdown(args: argparse.Namespace, rows: list[tuple[Any, ...]], ratio_rows: list[tuple[Any, ...]],
              torch_rows: list[tuple[Any, ...]], notes: list[str], load_before: tuple[float, float, float],
              seconds: float) -> str:
    worst = max((r[6] for r in rows), default=float("nan"))
    lines = [
        "# Realized step time on emulated devices vs the schedule's prediction; ours vs torch",
        "",
        f"Emulated devices (`tessel.runtime.emulate`, device clock, a rank's host may run one unit ahead of "
        f"its device as a GPU's does): 1 unit = {args.unit_ms:g} ms of sleep; "
        f"activations of {args.features} floats per micro-batch sent with gloo by the real lowering and "
        f"executor in real processes; {args.micro_batches} micro-batches; {args.steps} timed steps per "
        f"schedule after one warm-up step; a step is barrier, program, barrier (rank 0's clock). Predicted = "
        f"the schedule's orders as early as possible x unit (equal to its makespan unless noted). Intervals: "
        f"95% bootstrap of the median (2000 resamples, seed 0). tessel searched with the memory of 1F1B's "
        f"peak, {args.time_limit:g} s. Machine: {platform.machine()}, {os.cpu_count()} cores SHARED with "
        f"other developers' jobs (load average {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} "
        f"at the end); sleeping ranks use no CPU but wake late on a loaded machine. torch {torch.__version__}. "
        f"Run: {seconds:.0f} s.",
        "",
        f"Target realized / predicted <= 1.05: worst {worst:.3f} "
        f"({'met' if worst <= 1.05 else 'NOT met'}; {sum(r[6] > 1.05 for r in rows)} of {len(rows)} rows above).",
        "",
        "| placement | method | makespan | replay | predicted (s) | realized median (s) | realized / predicted "
        "| 95% interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, m, mk, rep, pred, med, ratio, lo, hi in rows:
        lines.append(f"| {case} | {m} | {mk:g} | {rep:g} | {pred:.3f} | {med:.3f} | {ratio:.3f} | "
                     f"[{lo:.3f}, {hi:.3f}] |")
    if ratio_rows:
        lines += ["", "## tessel / 1F1B: realized vs predicted (target: within 3 points)", "",
                  "| placement | predicted | realized | 95% interval | realized - predicted (points) | target |",
                  "|---|---|---|---|---|---|"]
        for case, pr, r, lo, hi, pts in ratio_rows:
            lines.append(f"| {case} | {pr:.3f} | {r:.3f} | [{lo:.3f}, {hi:.3f}] | {pts:+.1f} | "
                         f"{'met' if abs(pts) <= 3 else 'NOT met'} |")
    if torch_rows:
        lines += ["", "## Our executor vs torch.distributed.pipelining, same emulated stages (wall clock both)", "",
                  "Both sleep each stage's durations once its inputs are in and send after (every wake-up of a "
                  "sleeping process counted, as torch's stages can only be timed that way). Target: ours at or "
                  "below torch.", "",
                  "| placement | our schedule | torch | ours (s) | torch (s) | ours / torch | 95% interval | verdict |",
                  "|---|---|---|---|---|---|---|---|"]
        for case, m, other, a, b, r, lo, hi in torch_rows:
            lines.append(f"| {case} | {m} | {other} | {a:.3f} | {b:.3f} | {r:.3f} | [{lo:.3f}, {hi:.3f}] | "
                         f"{verdict(lo, hi)} |")
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    extra = (f" --placements {args.placements}" if args.placements != ",".join(PLACEMENTS) else "") + \
        (" --no-torch" if args.no_torch else "") + (f" --time-limit {args.time_limit:g}" if args.time_limit != 20 else "")
    lines += ["", f"Reproduce: `.venv/bin/python bench/realized.py --ranks {args.ranks} --unit-ms {args.unit_ms:g} "
                  f"--steps {args.steps} --micro-batches {args.micro_batches}{extra}`", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

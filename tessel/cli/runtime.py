"""`tessel run`: train an example model with a schedule on local processes (or under torchrun)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from ..placement import Placement
from ..schedule import Schedule
from .common import UsageError, add_memory_arg, fmt, positive_int, print_table, resolve_placement

TOLERANCE = 1e-5
MODEL_NAMES = ("gpt", "kshape", "mlp")  # tessel.runtime.models.MODELS, without importing torch here


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="train an example model with a schedule on torch.distributed",
                       description="Lower a schedule into per-rank programs and train an example model "
                                   "with them: one process per device (gloo on CPU, NCCL with CUDA). "
                                   "Under torchrun, each process runs its rank instead of launching.")
    p.add_argument("--model", required=True, choices=MODEL_NAMES,
                   help="example model (tessel.runtime.models): gpt decoder, kshape two-branch encoder, "
                        "mlp blocks on any placement")
    p.add_argument("--placement", metavar="NAME|FILE",
                   help="placement (default: the model's own: gpt->mllm, kshape->kshape, mlp->vshape)")
    p.add_argument("--devices", type=positive_int, default=4, help="device count = processes (default 4)")
    p.add_argument("--infer", action="store_true", help="forward only (the placement's inference form)")
    p.add_argument("--schedule", default="tessel", metavar="METHOD|FILE",
                   help="a method (tessel, 1f1b, gpipe, greedy, ...) or a schedule JSON (default tessel)")
    p.add_argument("--micro-batches", type=positive_int, metavar="N", help="micro-batches (default 8, or the file's)")
    add_memory_arg(p)
    p.add_argument("--micro-batch-size", type=positive_int, default=2, help="samples per micro-batch (default 2)")
    p.add_argument("--steps", type=positive_int, default=3, help="training steps (default 3)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--seed", type=int, default=0, help="weights and data seed (default 0)")
    p.add_argument("--check", action="store_true",
                   help=f"compare loss and every gradient with a single-process run (|diff| <= {TOLERANCE:g})")
    p.add_argument("--programs", action="store_true", help="print the per-rank programs and exit")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for the whole job (default 300)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..runtime.models import example
    from ..runtime.program import lower
    schedule = _schedule(args)
    example(args.model, schedule.placement)  # a placement the model cannot use fails here, before launching
    if args.programs:
        print(lower(schedule))
        return 0
    from ..runtime.train import TrainJob
    job = TrainJob.of(args.model, schedule, steps=args.steps, micro_batch_size=args.micro_batch_size,
                      lr=args.lr, seed=args.seed, check=args.check)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        reports = _as_torchrun_rank(job, args)
        if reports is None:
            return 0
    else:
        from ..runtime.launch import LaunchError, Options
        from ..runtime.train import train
        print(f"{args.model} on {schedule.placement.name} with {schedule.meta.get('method', 'a schedule')}: "
              f"{schedule.micro_batches} micro-batches of {args.micro_batch_size}, "
              f"{schedule.placement.devices} processes", flush=True)
        try:
            reports = train(job, Options(timeout=args.timeout))
        except LaunchError as e:
            print(f"tessel: run failed: {e}", file=sys.stderr)
            return 1
    return _report(reports, args.check)


def _schedule(args: argparse.Namespace) -> Schedule:
    from ..methods import METHODS, run_method
    from ..runtime.models import MODELS
    ref = args.schedule
    if ref not in METHODS and (os.path.isfile(ref) or ref.endswith(".json")):
        if args.placement:
            raise UsageError("--schedule FILE holds its placement: do not give --placement too")
        s = Schedule.load(ref, check=True)
        if args.micro_batches and args.micro_batches != s.micro_batches:
            s = s.unroll(args.micro_batches)
        return s
    args.placement = args.placement or MODELS[args.model].placement
    placement: Placement = resolve_placement(args)
    if placement.devices != args.devices and not os.path.exists(args.placement):
        raise UsageError(f"placement {placement.name} has {placement.devices} devices, not {args.devices}")
    return run_method(ref, placement, args.micro_batches or 8, args.memory)


def _as_torchrun_rank(job: Any, args: argparse.Namespace) -> list[Any] | None:
    """One rank of a torchrun job: rank 0 gets every rank's report, the others None."""
    import torch
    import torch.distributed as dist

    from ..runtime import comm
    from ..runtime.train import run_job
    torch.set_num_threads(1)
    ctx = comm.init(timeout=args.timeout)
    if ctx.world != job.schedule["placement"]["devices"]:
        raise UsageError(f"torchrun started {ctx.world} processes for a placement of "
                         f"{job.schedule['placement']['devices']} devices")
    report = run_job(ctx, job)
    reports: list[Any] = [None] * ctx.world
    dist.all_gather_object(reports, report)
    comm.shutdown(ctx)
    return reports if ctx.rank == 0 else None


def _report(reports: Sequence[Any], check: bool) -> int:
    steps = len(reports[0].steps)
    rows = []
    for i in range(steps):
        per_rank = [r.steps[i] for r in reports]
        losses = {b: v for s in per_rank for b, v in s.losses.items()}  # a sink on several ranks counts once
        row = [i + 1, f"{sum(losses.values()):.6f}", f"{max(s.seconds for s in per_rank):.4f}"]
        if check:
            ref = sum(per_rank[0].reference_losses.values())
            row += [f"{ref:.6f}", fmt(max(s.grad_diff for s in per_rank))]
        rows.append(row)
    headers = ["step", "loss", "seconds"] + (["reference loss", "max grad diff"] if check else [])
    print_table(headers, rows)
    times = [max(r.steps[i].seconds for r in reports) for i in range(steps)]
    print(f"median step: {statistics.median(times):.4f} s; most forward graphs alive per rank: "
          f"{fmt([max(s.peak_graphs for s in r.steps) for r in reports])}")
    return _verdict(reports) if check else 0


def _verdict(reports: Sequence[Any]) -> int:
    steps = [s for r in reports for s in r.steps]
    loss_diff = max(s.loss_diff for s in steps)
    grad_diff = max(s.grad_diff for s in steps)
    checked = sum(r.steps[0].params_checked for r in reports)
    if loss_diff <= TOLERANCE and grad_diff <= TOLERANCE:
        print(f"check: loss and {checked} parameter gradients per step match the single-process run "
              f"(max diff {loss_diff:.2g} loss, {grad_diff:.2g} gradient)")
        return 0
    print(f"check FAILED: max diff {loss_diff:.3g} in the loss, {grad_diff:.3g} in a gradient "
          f"(tolerance {TOLERANCE:g})", file=sys.stderr)
    return 1

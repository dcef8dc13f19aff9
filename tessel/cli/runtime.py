"""`tessel run`: train an example model with a schedule on local processes (or under torchrun)."""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from ..errors import LimitError
from ..placement import Placement
from ..schedule import MAX_TASKS, Schedule, check_task_count
from .common import (
    MAX_SECONDS,
    UsageError,
    add_memory_arg,
    finite_float,
    fmt,
    int_in,
    is_file_ref,
    positive_float,
    positive_int,
    print_table,
    printable,
    resolve_placement,
)
from .environ import check_torchrun_env, wants_torchrun

TOLERANCE = 1e-4  # relative error per tensor: |x - ref|max / |ref|max
MODEL_NAMES = ("gpt", "kshape", "mlp", "emulated")  # tessel.runtime.networks.MODELS, without importing torch here
# checked before any work: the example models are small, so a bigger batch only fills memory (a
# micro-batch of 10**12 samples killed every rank in the allocator); seeds feed torch's 64-bit seeds
MAX_MICRO_BATCH_SIZE = 65_536
MAX_SAMPLES_PER_STEP = 2**22
MAX_STEPS = 1_000_000
MAX_SEED = 2**32 - 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="train an example model with a schedule on torch.distributed",
                       description="Lower a schedule into per-rank programs and train an example model "
                                   "with them: one process per device and replica (gloo on CPU, NCCL with "
                                   "CUDA). Under torchrun, each process runs its rank instead of launching; "
                                   "rank 0 searches the schedule and sends it to the others.")
    p.add_argument("--model", choices=MODEL_NAMES,
                   help="example model (tessel.runtime.networks): gpt decoder, kshape two-branch encoder, "
                        "mlp blocks on any placement, emulated elementwise stand-ins (required unless "
                        "--emulate, whose default is emulated)")
    p.add_argument("--placement", metavar="NAME|FILE",
                   help="placement (default: the model's own: gpt->mllm, kshape->kshape, mlp->vshape)")
    p.add_argument("--devices", type=positive_int,
                   help="pipeline devices = processes per replica (default 4, or the file's)")
    p.add_argument("--data-parallel", type=positive_int, default=1, metavar="D",
                   help="data-parallel replicas of the pipeline; processes = devices x D, gradients "
                        "averaged across replicas (default 1)")
    p.add_argument("--infer", action="store_true", help="forward only (the placement's inference form)")
    p.add_argument("--schedule", default="tessel", metavar="METHOD|FILE",
                   help="a method (tessel, 1f1b, gpipe, greedy, ...) or a schedule JSON (default tessel)")
    p.add_argument("-n", "--micro-batches", type=positive_int, metavar="N",
                   help="micro-batches (default 8, or the file's)")
    add_memory_arg(p)
    p.add_argument("--micro-batch-size", type=int_in("--micro-batch-size", 1, MAX_MICRO_BATCH_SIZE), default=2,
                   help=f"samples per micro-batch (default 2, at most {MAX_MICRO_BATCH_SIZE:,})")
    p.add_argument("--steps", type=int_in("--steps", 1, MAX_STEPS), default=3, help="training steps (default 3)")
    p.add_argument("--lr", type=finite_float("--lr", 0.0, 1e6), default=0.05, help="SGD learning rate (default 0.05)")
    p.add_argument("--seed", type=int_in("--seed", 0, MAX_SEED), default=0, help="weights and data seed (default 0)")
    p.add_argument("--check", action="store_true",
                   help="compare loss and every gradient with a single-process run (relative error per "
                        f"tensor <= {TOLERANCE:g}) and each rank's executed order with the schedule's")
    p.add_argument("--programs", action="store_true", help="print the per-rank programs and exit")
    p.add_argument("--emulate", type=positive_float("--emulate", "milliseconds"), metavar="UNIT_MS",
                   help="emulated devices: every task takes its placement duration x UNIT_MS by sleeping "
                        "(the model's own compute included), messages are real (tessel.runtime.emulate); "
                        "prints the predicted step next to the measured one")
    p.add_argument("--emulate-size", type=positive_int, default=1024, metavar="FLOATS",
                   help="with --emulate and the emulated model: floats per sample of every activation "
                        "(default 1024)")
    p.add_argument("--device", choices=("cpu", "cuda"),
                   help="cpu (gloo) or cuda (NCCL, one GPU per rank; refused without CUDA); default: cuda "
                        "when available")
    p.add_argument("--timeout", type=positive_float("--timeout", "seconds", MAX_SECONDS), default=300.0,
                   help=f"seconds for the whole job (default 300, at most {MAX_SECONDS:,.0f})")
    p.add_argument("--oversubscribe", action="store_true",
                   help="start more processes (devices x replicas) than this machine's cores and available "
                        "memory hold (refused by default, before anything starts)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    # SIGINT and SIGTERM raise cli.interrupt.Interrupted (a KeyboardInterrupt) here, as in every
    # command: the launcher's clean-up (killing its ranks) runs on the way out, main() says so
    _model_and_device(args)
    if not args.programs and wants_torchrun(os.environ):
        check_torchrun_env(os.environ, args.data_parallel)
        return _as_torchrun_rank(args)
    if not args.programs and not args.oversubscribe and (args.devices or not _schedule_file(args.schedule)):
        # before any search or process (a file's device count is checked when launching)
        from ..runtime.forkserver import capacity
        capacity((args.devices or 4) * args.data_parallel)
    if not args.programs:
        # a launcher killed outright leaves its ranks to notice the lost store: one line each, not
        # torch's C++ warnings with their stack frames
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        from ..runtime.forkserver import start_early
        start_early()  # its imports (torch) overlap ours and the schedule search
    schedule = _schedule(args)
    _bind(args, schedule)
    _check_samples(args, schedule)
    if args.programs:
        from ..runtime.program import lower
        print(lower(schedule))
        return 0
    from ..runtime.launch import LaunchError, Options
    from ..runtime.train import train
    replicas = f" x {args.data_parallel} replicas" if args.data_parallel > 1 else ""
    print(f"{args.model} on {schedule.placement.name} with {schedule.meta.get('method', 'a schedule')}: "
          f"{schedule.micro_batches} micro-batches of {args.micro_batch_size}, "
          f"{schedule.placement.devices} processes{replicas}", flush=True)
    try:
        reports = train(_job(args, schedule), Options(timeout=args.timeout, oversubscribe=args.oversubscribe,
                                                      backend=_backend(args)))
    except LaunchError as e:
        print(f"tessel: run failed: {printable(str(e))}", file=sys.stderr)
        return 1
    return _report(reports, args.check, schedule, args.emulate)


def _model_and_device(args: argparse.Namespace) -> None:
    """--model defaults to the emulated stand-ins under --emulate; --device cuda needs CUDA."""
    if args.model is None:
        if args.emulate is None:
            raise UsageError("--model is required (or --emulate UNIT_MS, whose default model is emulated)")
        args.model = "emulated"
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise UsageError(f"--device cuda: CUDA is not available here (torch {torch.__version__}); "
                             f"use --device cpu")
        if torch.cuda.device_count() < 1:
            raise UsageError("--device cuda: no GPU is visible (CUDA_VISIBLE_DEVICES?)")


def _backend(args: argparse.Namespace) -> str | None:
    return {"cpu": "gloo", "cuda": "nccl"}.get(args.device or "")


def _schedule_file(ref: str) -> bool:
    from ..methods import METHODS
    return is_file_ref(ref, METHODS)


def _bind(args: argparse.Namespace, schedule: Schedule) -> None:
    """A placement the model cannot use fails here, before launching."""
    from ..runtime.networks import example
    example(args.model, schedule.placement)


def _check_samples(args: argparse.Namespace, schedule: Schedule) -> None:
    """One step's batch (micro-batch size x micro-batches x replicas samples) is made at once."""
    samples = args.micro_batch_size * schedule.micro_batches * args.data_parallel
    if samples > MAX_SAMPLES_PER_STEP:
        raise UsageError(f"--micro-batch-size {args.micro_batch_size} x {schedule.micro_batches} micro-batches x "
                         f"{args.data_parallel} replicas = {samples:,} samples per step, more than the "
                         f"{MAX_SAMPLES_PER_STEP:,} accepted")


def _job(args: argparse.Namespace, schedule: Schedule) -> Any:
    from ..runtime.emulate import Emulation
    from ..runtime.networks import Config
    from ..runtime.train import TrainJob
    extra: dict[str, Any] = {}
    if args.emulate is not None:
        extra["emulate"] = Emulation(args.emulate)
        if args.model == "emulated":
            extra["config"] = Config(features=args.emulate_size)
    return TrainJob.of(args.model, schedule, steps=args.steps, micro_batch_size=args.micro_batch_size,
                       lr=args.lr, seed=args.seed, check=args.check, replicas=args.data_parallel, **extra)


def _schedule(args: argparse.Namespace) -> Schedule:
    from ..methods import METHODS, run_method
    ref = args.schedule
    if is_file_ref(ref, METHODS):  # torch-free: a file over the task limit is refused in a moment
        if args.placement:
            raise UsageError("--schedule FILE holds its placement: do not give --placement too")
        s = Schedule.load(ref, check=True)
        _same_devices(args, s.placement, "--schedule FILE")
        if args.micro_batches and args.micro_batches != s.micro_batches:
            check_task_count(s.placement, args.micro_batches)  # before unrolling: -n 10**30 refused at once
            s = s.unroll(args.micro_batches)
        return s
    if args.micro_batches is not None and args.micro_batches > MAX_TASKS:  # any placement has a block
        raise LimitError(f"-n {args.micro_batches:,} micro-batches: more than the {MAX_TASKS:,} tasks accepted "
                         "for any placement")
    from ..runtime.networks import MODELS  # torch: seconds to import, after the file's checks
    args.placement = args.placement or MODELS[args.model].placement
    given, args.devices = args.devices, args.devices or 4
    placement: Placement = resolve_placement(args)
    args.devices = given
    _same_devices(args, placement, f"placement {placement.name}")
    from ..library import PLACEMENTS
    if not is_file_ref(args.placement, PLACEMENTS):  # a built-in's sharded blocks declare what the model's keep
        from ..runtime.networks import declare_kept, example
        placement = declare_kept(example(args.model, placement))
    return run_method(ref, placement, args.micro_batches or 8, args.memory)


def _same_devices(args: argparse.Namespace, placement: Placement, what: str) -> None:
    if args.devices is not None and args.devices != placement.devices:
        raise UsageError(f"{what} has {placement.devices} devices, not --devices {args.devices}")


# ---- torchrun ------------------------------------------------------------------------------------
def _as_torchrun_rank(args: argparse.Namespace) -> int:
    """One rank of a torchrun job. A method is searched once (global rank 0) and sent to every rank;
    a file is read by each rank; either way every rank checks that all hold the same schedule."""
    import torch

    from ..runtime import comm
    from ..runtime.train import run_job
    torch.set_num_threads(1)
    ctx = comm.init(timeout=args.timeout, backend=_backend(args), replicas=args.data_parallel)
    try:
        schedule = _agreed_schedule(ctx, args)
        if ctx.world != schedule.placement.devices:
            raise UsageError(f"torchrun started {ctx.world * ctx.replicas} processes: {ctx.world} per replica "
                             f"for a placement of {schedule.placement.devices} devices")
        report = run_job(ctx, _job(args, schedule))
        reports = _gather(ctx, report)
    finally:
        comm.shutdown(ctx)
    if ctx.global_rank != 0:
        return 0
    return _report(reports, args.check, schedule, args.emulate)


def _agreed_schedule(ctx: Any, args: argparse.Namespace) -> Schedule:
    from ..methods import METHODS
    from ..runtime.share import JobLink, agreed_schedule

    def make() -> Schedule:
        s = _schedule(args)
        _bind(args, s)
        return s
    return agreed_schedule(make, JobLink(ctx), every_rank=is_file_ref(args.schedule, METHODS))


def _gather(ctx: Any, report: Any) -> list[Any]:
    """Every pipeline rank's report, as JSON through tensors (never pickled)."""
    from ..runtime import comm, wire
    return [wire.decode(x.decode()) for x in comm.gather_bytes(ctx, wire.encode(report).encode())]


# ---- report --------------------------------------------------------------------------------------
SHOWN_STEPS = 10  # a longer run shows its first and last SHOWN_STEPS steps, and the median of all


def _report(reports: Sequence[Any], check: bool, schedule: Schedule | None = None,
            emulate: float | None = None) -> int:
    steps = len(reports[0].steps)
    rows: list[list[Any]] = []
    shown = range(steps) if steps <= 2 * SHOWN_STEPS + 1 else \
        [*range(SHOWN_STEPS), -1, *range(steps - SHOWN_STEPS, steps)]
    for i in shown:
        if i < 0:
            rows.append([f"({steps - 2 * SHOWN_STEPS} more)", "", ""] + (["", ""] if check else []))
            continue
        per_rank = [r.steps[i] for r in reports]
        losses = {b: v for s in per_rank for b, v in s.losses.items()}  # a sink on several ranks counts once
        row = [i + 1, f"{sum(losses.values()):.6f}", f"{max(s.seconds for s in per_rank):.4f}"]
        if check:
            ref = sum(per_rank[0].reference_losses.values())
            row += [f"{ref:.6f}", fmt(_worst(s.grad_diff for s in per_rank))]
        rows.append(row)
    headers = ["step", "loss", "seconds"] + (["reference loss", "max grad error"] if check else [])
    print_table(headers, rows)
    times = [max(r.steps[i].seconds for r in reports) for i in range(steps)]
    print(f"median step: {statistics.median(times):.4f} s; most forward graphs alive per rank: "
          f"{fmt([max(s.peak_graphs for s in r.steps) for r in reports])}")
    if schedule is not None:
        print(_memory_line(reports, schedule))
    if schedule is not None and emulate is not None:
        print(_emulated_line(times, schedule, emulate))
        order = [e for r in reports for e in getattr(r, "order_errors", ())]
        if order:
            for e in order:
                print(f"emulated run left the schedule's order: {e}", file=sys.stderr)
            return 1
    return _verdict(reports) if check else 0


def _worst(values: Any) -> float:
    """The largest value, NaN counting as infinite (Python's max() drops a NaN that is not first)."""
    return max((v if v == v else math.inf for v in values if v is not None), default=0.0)


def _memory_line(reports: Sequence[Any], schedule: Schedule) -> str:
    """Measured peak activation memory per rank next to the schedule's declared peak, same unit."""
    from ..runtime.memory import unit_bytes
    measured: dict[str, float] = {}
    for r in reports:
        for b, n in r.block_bytes.items():
            measured[b] = max(measured.get(b, 0), n)
    declared = {b.id: float(b.memory) for b in schedule.placement.blocks if b.kind == "forward"}
    unit = unit_bytes(measured, declared)
    peaks = [max(s.peak_bytes for s in r.steps) for r in reports]
    mib = ",".join(f"{p / 2**20:.3g}" for p in peaks)
    if unit is None:
        return f"peak activation memory per rank: {mib} MiB measured (no block declares memory to compare)"
    line = (f"peak activation memory per rank, in the placement's units (1 unit = {unit / 2**10:.4g} KiB: "
            f"the median over forward blocks of kept bytes per declared unit): declared "
            f"{fmt(list(schedule.peak_memory))}; measured {','.join(f'{p / unit:.3g}' for p in peaks)} "
            f"({mib} MiB)")
    off = [f"{b} declares {fmt(m)}, keeps {measured.get(b, 0) / unit:.2g}" for b, m in declared.items()
           if abs(measured.get(b, 0) / unit - m) > 0.1 * max(m, 1)]
    return line + ("\nblocks keeping other than they declare (units, per device): " + "; ".join(off) if off else "")


def _emulated_line(times: Sequence[float], schedule: Schedule, unit_ms: float) -> str:
    from ..runtime.emulate import replay_makespan
    replay = replay_makespan(schedule)
    predicted = replay * unit_ms / 1e3
    timed = times[1:] or times  # the first step also learns the activations' shapes
    median = statistics.median(timed)
    return (f"emulated devices, 1 unit = {unit_ms:g} ms: predicted step {predicted:.4f} s (makespan "
            f"{fmt(schedule.makespan)}, its orders as early as possible {fmt(replay)} units); median measured "
            f"step after the first {median:.4f} s = {median / predicted:.3f} x predicted; every rank ran the "
            f"schedule's order")


def _verdict(reports: Sequence[Any]) -> int:
    """Exit 0 only when every step's loss and gradients are finite on both sides and within
    TOLERANCE, and every rank ran the schedule's order; else name the first step and tensor at fault."""
    steps = len(reports[0].steps)
    loss_diff = _worst(s.loss_diff for r in reports for s in r.steps)
    grad_diff = _worst(s.grad_diff for r in reports for s in r.steps)
    checked = sum(r.steps[0].params_checked for r in reports)
    order = [e for r in reports for e in getattr(r, "order_errors", ())]
    failures = []
    for i in range(steps):
        for r in reports:
            s = r.steps[i]
            if s.nonfinite:
                failures.append(f"step {i + 1}, rank {r.rank}: {s.nonfinite}")
            elif not s.loss_diff <= TOLERANCE:
                failures.append(f"step {i + 1}, rank {r.rank}: relative loss error {s.loss_diff:.3g} "
                                f"(tolerance {TOLERANCE:g})")
            elif not (s.grad_diff or 0.0) <= TOLERANCE:
                failures.append(f"step {i + 1}, rank {r.rank}: relative gradient error {s.grad_diff:.3g} "
                                f"in {s.worst or 'a parameter'} (tolerance {TOLERANCE:g})")
        if failures:
            break
    if not failures and not order:
        print(f"check: loss and {checked} parameter gradients per step match the single-process run "
              f"(max relative error {loss_diff:.2g} loss, {grad_diff:.2g} gradient); every rank ran the "
              f"schedule's order")
        return 0
    for f in failures[:3]:
        print(f"check FAILED: {printable(f, lines=False)}", file=sys.stderr)
    for e in order:
        print(f"check FAILED: {printable(e, lines=False)}", file=sys.stderr)
    return 1

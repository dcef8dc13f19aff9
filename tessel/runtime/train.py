"""Training jobs: an example model, a schedule, K steps; optionally checked against one process.

`run_jobs(ctx, jobs)` is the worker function (every rank runs it, under `launch` or torchrun);
`train(job)` launches it locally. With data parallelism (`replicas` R), every replica runs the
pipeline on its 1/R of the batch and gradients are averaged across replicas before the step.

With `check`, every rank also runs the whole model on one process (the reference: plain torch
layers, the whole batch at once) and compares, at every step, the loss and each of its
parameters' gradients with the reference's (its shard of them), each as a relative error per
tensor; it also compares the order in which the rank ran its tasks with the schedule's.

Every step measures the activation bytes the rank's autograd graphs keep (`memory.GraphMemory`):
its peak, and per block what one micro-batch's forward keeps.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..errors import LaunchError
from ..schedule import Schedule, schedule_from_dict
from . import wire
from .comm import Context, make_groups
from .emulate import Emulation, SleepingDevice
from .executor import Executor, StepResult
from .launch import Options, launch
from .memory import GraphMemory
from .networks import Config, Example, example, reference_losses
from .program import Instruction, lower
from .tp import shard_of

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainJob:
    model: str
    schedule: Mapping[str, Any]  # a schedule document (Schedule.to_dict()); it holds the placement
    steps: int = 1
    micro_batch_size: int = 2
    lr: float = 0.05
    seed: int = 0
    check: bool = False
    config: Config = field(default_factory=Config)
    replicas: int = 1  # data-parallel replicas of the pipeline
    emulate: Emulation | None = None  # sleeping devices (emulate.py): every step's order is checked


    @staticmethod
    def of(model: str, schedule: Schedule, **kw: Any) -> TrainJob:
        return TrainJob(model, schedule.to_dict(), **kw)


@wire.register
@dataclass(frozen=True)
class StepReport:
    losses: dict[str, float]  # this rank's sink blocks' losses (averaged over the replicas)
    seconds: float
    peak_graphs: int
    reference_losses: dict[str, float] | None = None  # every sink's, from the single-process run
    grad_diff: float | None = None  # max relative gradient error over this rank's parameters (see FLOOR)
    params_checked: int = 0
    peak_bytes: int = 0  # most activation bytes this rank's graphs kept at once
    nonfinite: str | None = None  # with check: the first NaN or infinity met (which run, which tensor)
    worst: str = ""  # with check: the parameter with the largest gradient error

    def __post_init__(self) -> None:
        if self.nonfinite is None and self.reference_losses is not None:
            object.__setattr__(self, "nonfinite", nonfinite_loss(self.losses, self.reference_losses))

    @property
    def loss(self) -> float | None:
        return sum(self.losses.values()) if self.losses else None

    @property
    def loss_diff(self) -> float:
        """Max relative loss error over this rank's sinks (0 without a sink)."""
        assert self.reference_losses is not None
        return max((relative(v, self.reference_losses[b]) for b, v in self.losses.items()), default=0.0)


@wire.register
@dataclass(frozen=True)
class RankReport:
    rank: int
    blocks: tuple[str, ...]
    steps: tuple[StepReport, ...]
    block_bytes: dict[str, int] = field(default_factory=dict)  # bytes one forward of a block keeps
    order_errors: tuple[str, ...] = ()  # where the executed order left the schedule's (with check)
    replica: int = 0


def relative(x: float, ref: float) -> float:
    """|x - ref| / |ref|; infinite when either is NaN or infinite (max() would drop a NaN)."""
    if not (math.isfinite(x) and math.isfinite(ref)):
        return math.inf
    return abs(x - ref) / max(abs(ref), TINY)


def nonfinite_loss(losses: Mapping[str, float], reference: Mapping[str, float]) -> str | None:
    """The first loss that is NaN or infinite, on either side, named."""
    for side, values in (("the pipeline's", losses), ("the single-process run's", reference)):
        for b, v in values.items():
            if not math.isfinite(v):
                return f"{side} loss of block {b} is {v}"
    return None


def nonfinite_grad(name: str, mine: Tensor | None, ref: Tensor | None) -> str | None:
    """Which side's gradient of parameter `name` holds a NaN or an infinity, if any."""
    for side, g in (("the pipeline's", mine), ("the single-process run's", ref)):
        if g is not None and not bool(torch.isfinite(g).all()):
            return f"{side} gradient of {name} holds {'NaN' if bool(torch.isnan(g).any()) else 'an infinity'}"
    return None


TINY = 1e-12
# a gradient's error is relative to its largest element, or to this fraction of the model's largest
# gradient element when larger: a gradient that is zero in exact arithmetic (attention's key bias)
# holds only rounding noise, which no tolerance relative to itself would accept
FLOOR = 1e-3


def train(job: TrainJob, options: Options | None = None) -> list[RankReport]:
    """Launch the job on (placement devices x replicas) local processes; replica 0's reports."""
    devices = int(job.schedule["placement"]["devices"])
    opts = options or Options()
    opts = Options(opts.timeout, opts.pg_timeout, opts.backend, opts.threads, opts.host, job.replicas,
                   opts.oversubscribe)
    results = launch(run_jobs, devices * job.replicas, ([job],), opts)
    return [reports[0] for reports in results[:devices]]


def run_jobs(ctx: Context, jobs: Sequence[TrainJob]) -> list[RankReport]:
    """Worker function: the jobs one after another on the same process group."""
    return [run_job(ctx, job) for job in jobs]


class RecordingExecutor(Executor):
    """An executor that writes down the compute tasks in the order it runs them."""
    executed: list[tuple[str, int]]

    def _execute(self, i: int, ins: Instruction, st: Any) -> None:
        if ins.is_compute:
            self.executed.append((ins.block, ins.micro_batch))
        super()._execute(i, ins, st)


def run_job(ctx: Context, job: TrainJob) -> RankReport:
    if job.replicas != ctx.replicas:
        raise LaunchError(f"the job has {job.replicas} replicas, the processes {ctx.replicas}: start "
                          "devices x replicas processes")
    schedule = schedule_from_dict(job.schedule, "job schedule", check=True)
    ex = example(job.model, schedule.placement, job.config, job.seed)
    make_groups(ctx, [b.devices for b in schedule.placement.blocks])
    blocks = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None).to(ctx.device)
              for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    pacer = SleepingDevice(schedule.placement, job.emulate, ctx) if job.emulate is not None else None
    executor = RecordingExecutor(lower(schedule), ctx, blocks, ex.feeds, pacer=pacer)
    params = executor.parameters()
    meter = GraphMemory(p for m in blocks.values() for p in m.parameters())
    meter.watch(blocks)
    ref = _Reference(ex, job.lr) if job.check else None
    steps, orders = [], []
    for step in range(job.steps):
        batch = ex.batch(job.micro_batch_size * schedule.micro_batches * ctx.replicas,
                         seed=job.seed * 100_003 + step)
        executor.executed = []
        if pacer is not None:  # every rank starts the step together: its time is the step's
            dist.barrier()
        with meter.measuring():
            result = executor.run(_replica_part(batch, ctx))
        ctx.all_reduce_mean([p.grad for p in params if p.grad is not None])
        result = StepResult(_mean_losses(ctx, result.losses), result.seconds, result.peak_graphs)
        steps.append(ref.compare(result, batch, blocks, meter.peak) if ref is not None else
                     StepReport(result.losses, result.seconds, result.peak_graphs, peak_bytes=meter.peak))
        orders.append(list(executor.executed))
        sgd_step(params, job.lr)
    errors = order_errors(schedule, ctx.rank, orders[0]) if job.check and orders else []
    if job.emulate is not None:
        errors = [e for o in orders for e in order_errors(schedule, ctx.rank, o)][:3]
    log.info("rank %d: %d steps of %s", ctx.rank, job.steps, schedule.placement.name)
    return RankReport(ctx.rank, tuple(blocks), tuple(steps), dict(meter.block_bytes), tuple(errors), ctx.replica)


def _replica_part(batch: Mapping[str, Tensor], ctx: Context) -> dict[str, Tensor]:
    return {k: v.chunk(ctx.replicas)[ctx.replica] for k, v in batch.items()}


def _mean_losses(ctx: Context, losses: dict[str, float]) -> dict[str, float]:
    if ctx.dp is None or not losses:
        return losses
    names = sorted(losses)
    t = torch.tensor([losses[b] for b in names], dtype=torch.float64, device=ctx.device)
    ctx.all_reduce_mean([t])
    return dict(zip(names, t.tolist()))


def order_errors(schedule: Schedule, rank: int, executed: Sequence[tuple[str, int]], limit: int = 3) -> list[str]:
    """Where a rank's executed compute order differs from the schedule's order on its device."""
    expected = [(t.block, t.micro_batch) for t in schedule.device_orders()[rank]]
    errors = [f"rank {rank}: task {k} ran {a[0]}#{a[1]}, the schedule has {b[0]}#{b[1]}"
              for k, (a, b) in enumerate(zip(executed, expected)) if tuple(a) != tuple(b)]
    if len(executed) != len(expected):
        errors.append(f"rank {rank}: ran {len(executed)} tasks, the schedule has {len(expected)}")
    return errors[:limit]


def sgd_step(params: Sequence[nn.Parameter], lr: float) -> None:
    """Plain SGD (what torch.optim.SGD does without momentum, bit for bit), without its start-up
    cost: constructing a torch optimizer imports torch._dynamo, seconds per process."""
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)


class _Reference:
    """The whole model on this process, trained in step with the distributed one."""

    def __init__(self, ex: Example, lr: float) -> None:
        self.ex, self.lr = ex, lr
        self.blocks = {b: ex.whole(b) for b in ex.flow.forwards}
        for b, m in self.blocks.items():
            m.requires_grad_(b in ex.flow.backward)
        self.params = [p for m in self.blocks.values() for p in m.parameters() if p.requires_grad]

    def compare(self, result: StepResult, batch: Mapping[str, torch.Tensor],
                blocks: Mapping[str, nn.Module], peak_bytes: int) -> StepReport:
        for m in self.blocks.values():
            m.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(bool(self.params)):
            losses = reference_losses(self.ex, self.blocks, batch)
            if self.params:
                sum(losses.values()).backward()  # type: ignore[union-attr]
        diff, checked, worst = 0.0, 0, ""
        ref_losses = {b: float(x.detach()) for b, x in losses.items()}
        bad = nonfinite_loss(result.losses, ref_losses)
        scale = max((float(p.grad.abs().max()) for p in self.params if p.grad is not None), default=0.0)
        for b, module in blocks.items():
            if b not in self.ex.flow.backward:
                continue
            for name, p in module.named_parameters():
                full = self.blocks[b].get_parameter(name).grad
                ref = None if p.grad is None or full is None else shard_of(p, full)
                bad = bad or nonfinite_grad(f"{b}.{name}", p.grad, ref)
                if p.grad is None or ref is None:
                    err = math.inf
                else:
                    err = float((p.grad.cpu() - ref).abs().max()) / max(float(ref.abs().max()), FLOOR * scale, TINY)
                if not err <= diff:  # a NaN error counts as the worst
                    diff, worst = (err if math.isfinite(err) else math.inf), f"{b}.{name}"
                checked += 1
        sgd_step(self.params, self.lr)
        return StepReport(result.losses, result.seconds, result.peak_graphs, ref_losses, diff, checked,
                          peak_bytes, bad, worst)

"""Training jobs: an example model, a schedule, K steps; optionally checked against one process.

`run_jobs(ctx, jobs)` is the worker function (every rank runs it, under `launch` or torchrun);
`train(job)` launches it locally. With `check`, every rank also runs the whole model on one
process (the reference: plain torch layers, the whole batch at once) and compares, at every step,
the loss and each of its parameters' gradients with the reference's (its shard of them).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..schedule import Schedule, schedule_from_dict
from .comm import Context, make_groups
from .executor import Executor, StepResult
from .launch import Options, launch
from .models import Config, Example, example, reference_losses
from .program import lower
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

    @staticmethod
    def of(model: str, schedule: Schedule, **kw: Any) -> TrainJob:
        return TrainJob(model, schedule.to_dict(), **kw)


@dataclass(frozen=True)
class StepReport:
    losses: dict[str, float]  # this rank's sink blocks' losses
    seconds: float
    peak_graphs: int
    reference_losses: dict[str, float] | None = None  # every sink's, from the single-process run
    grad_diff: float | None = None  # max |gradient - reference gradient| over this rank's parameters
    params_checked: int = 0

    @property
    def loss(self) -> float | None:
        return sum(self.losses.values()) if self.losses else None

    @property
    def loss_diff(self) -> float:
        """Max |loss - reference loss| over this rank's sinks (0 without a sink)."""
        assert self.reference_losses is not None
        return max((abs(v - self.reference_losses[b]) for b, v in self.losses.items()), default=0.0)


@dataclass(frozen=True)
class RankReport:
    rank: int
    blocks: tuple[str, ...]
    steps: tuple[StepReport, ...]


def train(job: TrainJob, options: Options | None = None) -> list[RankReport]:
    """Launch the job on as many local processes as its placement has devices."""
    devices = job.schedule["placement"]["devices"]
    return [reports[0] for reports in launch(run_jobs, devices, ([job],), options or Options())]


def run_jobs(ctx: Context, jobs: Sequence[TrainJob]) -> list[RankReport]:
    """Worker function: the jobs one after another on the same process group."""
    return [run_job(ctx, job) for job in jobs]


def run_job(ctx: Context, job: TrainJob) -> RankReport:
    schedule = schedule_from_dict(job.schedule, "job schedule", check=True)
    programs = lower(schedule)
    ex = example(job.model, schedule.placement, job.config, job.seed)
    make_groups(ctx, [b.devices for b in schedule.placement.blocks])
    blocks = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None).to(ctx.device)
              for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    executor = Executor(programs, ctx, blocks, ex.feeds)
    opt = _sgd(executor.parameters(), job.lr)
    ref = _Reference(ex, job.lr) if job.check else None
    steps = []
    for step in range(job.steps):
        batch = ex.batch(job.micro_batch_size * schedule.micro_batches, seed=job.seed * 100_003 + step)
        result = executor.run(batch)
        steps.append(ref.compare(result, batch, blocks) if ref is not None else
                     StepReport(result.losses, result.seconds, result.peak_graphs))
        if opt is not None:
            opt.step()
    log.info("rank %d: %d steps of %s", ctx.rank, job.steps, schedule.placement.name)
    return RankReport(ctx.rank, tuple(blocks), tuple(steps))


def _sgd(params: list[nn.Parameter], lr: float) -> torch.optim.Optimizer | None:
    return torch.optim.SGD(params, lr=lr) if params else None


class _Reference:
    """The whole model on this process, trained in step with the distributed one."""

    def __init__(self, ex: Example, lr: float) -> None:
        self.ex = ex
        self.blocks = {b: ex.whole(b) for b in ex.flow.forwards}
        for b, m in self.blocks.items():
            m.requires_grad_(b in ex.flow.backward)
        self.opt = _sgd([p for m in self.blocks.values() for p in m.parameters() if p.requires_grad], lr)

    def compare(self, result: StepResult, batch: Mapping[str, torch.Tensor],
                blocks: Mapping[str, nn.Module]) -> StepReport:
        for m in self.blocks.values():
            m.zero_grad(set_to_none=True)
        with torch.set_grad_enabled(self.opt is not None):
            losses = reference_losses(self.ex, self.blocks, batch)
            if self.opt is not None:
                sum(losses.values()).backward()
        diff, checked = 0.0, 0
        for b, m in blocks.items():
            if b not in self.ex.flow.backward:
                continue
            for name, p in m.named_parameters():
                full = self.blocks[b].get_parameter(name).grad
                if p.grad is None or full is None:
                    diff = float("inf")
                else:
                    diff = max(diff, float((p.grad.cpu() - shard_of(p, full)).abs().max()))
                checked += 1
        if self.opt is not None:
            self.opt.step()
        return StepReport(result.losses, result.seconds, result.peak_graphs,
                          {b: float(x.detach()) for b, x in losses.items()}, diff, checked)

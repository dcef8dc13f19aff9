"""The runtime as a library: `Pipeline(blocks, schedule, loss_fn=...)` and `step(...) -> loss`.

Every rank of the pipeline's process group builds the same `Pipeline` and calls `step` with the
same batch. The pipeline lowers the schedule into this rank's program and runs it with the
executor (executor.py): forward and backward of every micro-batch in the schedule's order,
gradients accumulated into the parameters' `.grad` (never cleared here: zero them as with plain
autograd, so several steps accumulate).

- `blocks`: a module per forward block of the placement (`{"s0": m0, "s1": m1, ...}`; modules of
  blocks on other ranks are ignored), or a function `(block id, group) -> module` called for this
  rank's blocks only (`group`: the block's tensor-parallel process group when it spans several
  devices, else None).
- `schedule`: a `Schedule`, a schedule file, or a method name (`"1f1b"`, `"tessel"`, ...) searched
  on the placement (given, or a chain of the blocks, one per device) by group rank 0 and
  broadcast, so every rank runs the same one.
- A block is called as `block(*outputs of its predecessors, *its batch fields)`; outputs may be
  any pytree of tensors. By default the first blocks read `step`'s positional inputs; `feeds`
  names other batch fields per block. The last block's output goes through
  `loss_fn(output, target)` (or, without a loss function, the last block returns the loss).
- `recompute`: block ids (or True for all) whose activations are recomputed in the backward
  instead of kept (torch.utils.checkpoint).
"""
from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..errors import PipelineError as PipelineError
from ..io import is_file_ref
from ..methods import METHODS, run_method
from ..placement import Placement, PlacementError
from ..schedule import Schedule
from .comm import Context
from .dataflow import dataflow
from .executor import Executor, StepResult
from .program import lower
from .share import GroupLink, agreed_schedule
from .split import chain_placement

log = logging.getLogger(__name__)

BlockFactory = Callable[[str, Any], nn.Module]
TARGET = "target"


class WithLoss(nn.Module):
    """A last block followed by the loss function: `loss_fn(block(*args), *targets)`."""

    def __init__(self, block: nn.Module, loss_fn: Callable[..., Tensor], targets: int, name: str) -> None:
        super().__init__()
        self.block, self.loss_fn, self.targets, self.name = block, loss_fn, targets, name

    def forward(self, *args: Any) -> Tensor:
        cut = len(args) - self.targets
        loss = self.loss_fn(self.block(*args[:cut]), *args[cut:])
        if not isinstance(loss, Tensor) or loss.dim() != 0:
            what = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, Tensor) else type(loss).__name__
            raise PipelineError(f"loss_fn on the output of block {self.name!r} returned {what}: expected a "
                                "scalar (the micro-batch's mean loss)")
        return loss


class Recomputed(nn.Module):
    """A block whose activations are recomputed in its backward instead of kept."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, *args: Any) -> Any:
        return checkpoint(self.block, *args, use_reentrant=False)


class Pipeline:
    """This rank's part of a pipeline-parallel model and the schedule that runs it."""

    def __init__(self, blocks: Mapping[str, nn.Module] | BlockFactory, schedule: Schedule | str | Path, *,
                 loss_fn: Callable[..., Tensor] | None = None, placement: Placement | None = None,
                 micro_batches: int | None = None, memory: Any = None,
                 feeds: Mapping[str, Sequence[str]] | None = None, loss_feeds: Sequence[str] = (TARGET,),
                 recompute: bool | Collection[str] = False, group: Any = None, ctx: Context | None = None) -> None:
        self.group = group
        self.ctx = ctx or _context(group)
        self.rank = dist.get_rank(group) if group is not None else self.ctx.rank
        self.size = dist.get_world_size(group) if group is not None else self.ctx.world
        self.schedule = self._schedule(blocks, schedule, placement, micro_batches, memory)
        self.placement = self.schedule.placement
        self.flow = dataflow(self.placement)
        if self.placement.devices != self.size:
            raise PipelineError(f"placement {self.placement.name} has {self.placement.devices} devices but the "
                                f"process group has {self.size} ranks: run one process per device, or give group= of that size")
        self.loss_fn, self.loss_feeds = loss_fn, tuple(loss_feeds) if loss_fn is not None else ()
        self.user_feeds = {b: tuple(f) for b, f in (feeds or {}).items()}
        for b in self.user_feeds:
            if b not in self.flow.forwards:
                raise PipelineError(f"feeds names block {b!r}, which is not a forward block of "
                                    f"{self.placement.name} ({', '.join(self.flow.forwards)})")
        self.mine = tuple(b for b in self.flow.forwards if self.rank in self.flow.devices(b))
        self.groups = block_groups(self.flow.placement, group, self.ctx.device)
        self.modules = {b: self._module(blocks, b) for b in self.mine}  # the user's modules
        runs = {b: self._wrapped(b, recompute) for b in self.mine}
        self.executor = Executor(lower(self.schedule), self.ctx, runs, self._feeds(1), group)
        self.last: StepResult | None = None

    # ---- building ---------------------------------------------------------------------------------
    def _schedule(self, blocks: Mapping[str, nn.Module] | BlockFactory, schedule: Schedule | str | Path,
                  placement: Placement | None, micro_batches: int | None, memory: Any) -> Schedule:
        link = GroupLink(self.group, self.ctx.device)
        if isinstance(schedule, Schedule) or is_file_ref(schedule, METHODS):
            s = _same_placement(schedule if isinstance(schedule, Schedule) else Schedule.load(schedule, check=True),
                                placement)
            return agreed_schedule(lambda: _unrolled(s, micro_batches), link, every_rank=True)
        ref = str(schedule)
        if ref not in METHODS:
            raise PipelineError(f"schedule {ref!r} is neither a method ({', '.join(sorted(METHODS))}) nor a "
                                "schedule file")
        if placement is None:
            if not isinstance(blocks, Mapping):
                raise PipelineError(f"schedule method {ref!r} needs a placement when blocks come from a function")
            placement = chain_placement(list(blocks), self.size)
        p, n = placement, micro_batches or 2 * placement.devices
        return agreed_schedule(lambda: run_method(ref, p, n, memory), link)

    def _module(self, blocks: Mapping[str, nn.Module] | BlockFactory, b: str) -> nn.Module:
        if isinstance(blocks, Mapping):
            if b not in blocks:
                mapped = self.schedule.meta.get("blocks")
                hint = (f" (a plan's pick: its meta 'blocks' says which of your blocks {b} runs, "
                        f"{mapped[b]}; run it with tessel.runtime.mapped.MappedPipeline, docs/runtime.md)"
                        if isinstance(mapped, Mapping) and b in mapped else "")
                raise PipelineError(f"no module for block {b!r}: rank {self.rank} runs blocks "
                                    f"{', '.join(self.mine)} of {self.placement.name}; got modules for "
                                    f"{', '.join(map(str, blocks)) or 'none'}{hint}")
            m = blocks[b]
        else:
            m = blocks(b, self.groups.get(tuple(sorted(self.flow.devices(b)))))
        if not isinstance(m, nn.Module):
            raise PipelineError(f"block {b!r}: expected an nn.Module, got {type(m).__name__}: give a module")
        return m.to(self.ctx.device)

    def _wrapped(self, b: str, recompute: bool | Collection[str]) -> nn.Module:
        m = self.modules[b]
        if (recompute is True or (not isinstance(recompute, bool) and b in recompute)) and b in self.flow.backward:
            if b in self.flow.weight:
                raise PipelineError(f"block {b!r}: recomputation with a split backward (a weight block) is not "
                                    "supported; recompute other blocks or use a placement without weight blocks")
            m = Recomputed(m)
        if b in self.flow.sinks and self.loss_fn is not None:
            m = WithLoss(m, self.loss_fn, len(self.loss_feeds), b)
        return m

    def _feeds(self, inputs: int, blocks: Sequence[str] | None = None) -> dict[str, tuple[str, ...]]:
        """Batch fields per block (this rank's, or `blocks`): named ones, else the positional inputs for
        a first block; the loss's last."""
        out = {}
        for b in self.mine if blocks is None else blocks:
            default = tuple(f"input{i}" for i in range(inputs)) if not self.flow.in_edges[b] else ()
            out[b] = self.user_feeds.get(b, default) + (self.loss_feeds if b in self.flow.sinks else ())
        return out

    # ---- running ------------------------------------------------------------------------------------
    def step(self, *inputs: Tensor, **fields: Tensor) -> float:
        """Forward and backward of the whole batch by the schedule; the batch's mean loss (every rank).

        Positional inputs go to the first block(s), keyword fields where `feeds` says, `target` to
        the loss function; every field is split into the schedule's micro-batches along dim 0.
        """
        batch = {f"input{i}": x for i, x in enumerate(inputs)} | dict(fields)
        for k, v in batch.items():
            if not isinstance(v, Tensor):
                raise PipelineError(f"batch field {k!r} is a {type(v).__name__}: expected a tensor")
        feeds = self._feeds(len(inputs))
        # every rank checks every block's fields, so a wrong call fails the same way on all ranks
        # before any message is sent (not on one rank while the others wait for it)
        for b, names in self._feeds(len(inputs), self.flow.forwards).items():
            for f in names:
                if f not in batch:
                    raise PipelineError(f"block {b!r} reads batch field {f!r}, which step() did not get"
                                        + (" (pass target=...)" if f == TARGET else ""))
        n = self.schedule.micro_batches
        for k, v in batch.items():
            if v.dim() == 0 or v.shape[0] % n:
                raise PipelineError(f"batch field {k!r} has {v.shape[0] if v.dim() else 'no'} rows, which do not "
                                    f"split into {n} equal micro-batches: give a multiple of {n} rows")
        self.executor.feeds = feeds
        self.last = self.executor.run(batch, accumulate=True)
        return self._loss(self.last)

    def _loss(self, result: StepResult) -> float:
        """The sinks' losses summed, each counted once (on its first device), on every rank."""
        mine = sum((v for b, v in result.losses.items() if self.flow.devices(b)[0] == self.rank), 0.0)
        total = torch.tensor([mine], dtype=torch.float64, device=self.ctx.device)
        dist.all_reduce(total, group=self.group)
        return float(total.item())

    # ---- parameters -----------------------------------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        """The trained parameters on this rank (each once), for its optimizer."""
        seen: dict[int, nn.Parameter] = {}
        for b in self.mine:
            if b in self.flow.backward:
                for p in self.modules[b].parameters():
                    seen.setdefault(id(p), p)
        return list(seen.values())

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """`<block>.<parameter name>` for every parameter of this rank's blocks."""
        for b in self.mine:
            for name, p in self.modules[b].named_parameters():
                yield f"{b}.{name}", p


def _unrolled(s: Schedule, micro_batches: int | None) -> Schedule:
    """A searched schedule repeats: unrolled to the micro-batches asked for."""
    if not micro_batches or micro_batches == s.micro_batches:
        return s
    if s.repetend is None:
        raise PipelineError(f"the schedule is for {s.micro_batches} micro-batches and has no repetend to "
                            f"unroll to {micro_batches}: make it for {micro_batches}")
    return s.unroll(micro_batches)


def _same_placement(s: Schedule, placement: Placement | None) -> Schedule:
    if placement is not None and placement != s.placement:
        raise PipelineError(f"the schedule is for placement {s.placement.name}, not the one given "
                            f"({placement.name}); give one of the two")
    return s


def _context(group: Any) -> Context:
    """The executor's view of this process when the caller set up torch.distributed itself."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise PipelineError("Pipeline needs torch.distributed: run under torchrun or tessel.runtime.launch, "
                                "or call torch.distributed.init_process_group first")
        from .comm import init, shutdown
        ctx = init()
        atexit.register(shutdown, ctx)  # stop the abort watcher before the interpreter goes
        return ctx
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return Context(dist.get_rank(), dist.get_world_size(), device, None, timedelta(seconds=60))


def block_groups(p: Placement, group: Any, device: torch.device) -> dict[tuple[int, ...], Any]:
    """A process group per device set of a multi-device block (pipeline ranks -> its group).

    Collective over the whole job: every rank creates every group, in one order. With a
    pipeline group smaller than the job (data parallelism), every replica's groups are made: the
    replicas' rank lists are gathered first, so all of them must build their Pipeline together.
    """
    sets = sorted({tuple(sorted(b.devices)) for b in p.blocks if len(b.devices) > 1})
    if not sets:
        return {}
    if group is None:
        replicas = [tuple(range(dist.get_world_size()))]
        mine = replicas[0]
    else:
        mine = tuple(dist.get_global_rank(group, r) for r in range(dist.get_world_size(group)))
        local = torch.tensor(mine, dtype=torch.int64, device=device)
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, local)
        replicas = sorted({tuple(int(x) for x in t.tolist()) for t in parts})
    out = {}
    for rep in replicas:
        if len(rep) != p.devices:
            raise PlacementError(f"a pipeline group of {len(rep)} ranks for a placement of {p.devices} devices")
        for s in sets:
            g = dist.new_group([rep[d] for d in s])
            if rep == mine:
                out[s] = g
    return out

"""A plan's pick on the user's own blocks: the plan's block ids mapped to the user's.

`tessel plan my_profile.json -o plan.json` may pick a placement whose blocks are not the user's:
a pipeline re-cut into stages (`s0.f` runs the user's `s0` and `s1`), or Chimera's two pipelines
(`u0.f` .. `u3.f` and `d0.f` .. `d3.f`, each a replica of the whole model). The schedule file
records the map in `meta["blocks"]`: plan forward block -> the user's blocks it runs, in order
(`{"u0.f": ["s0"], "d3.f": ["s3"], ...}`). `MappedPipeline` builds the plan's blocks from the
user's modules and runs the pick:

- a plan block of several user blocks runs them in sequence (`nn.Sequential` of the user's own
  module objects, so parameters stay the user's);
- a placement of R replicas (Chimera: R = 2) carries R micro-batches per schedule micro-batch:
  `step` cuts the batch into R x N micro-batches, the r-th of every R to replica r, scales each
  replica's loss by 1/R, and after the backward sums each user block's gradients over the ranks
  holding a copy of it, so every copy ends with the one-process gradient of the whole batch and
  the copies stay equal under any optimizer.

Every rank builds the same user model (same seed), as with `Pipeline`.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch import Tensor, nn

from ..schedule import Schedule
from .dataflow import Dataflow, dataflow
from .pipeline import TARGET, Pipeline, PipelineError


def block_map(schedule: Schedule) -> dict[str, tuple[str, ...]]:
    """Plan forward block -> the user's blocks it runs: `meta["blocks"]`, else each block itself."""
    flow = dataflow(schedule.placement)
    raw = schedule.meta.get("blocks")
    if raw is None:
        return {b: (b,) for b in flow.forwards}
    if not (isinstance(raw, Mapping) and all(isinstance(v, list) and v and all(isinstance(x, str) for x in v)
                                             for v in raw.values())):
        raise PipelineError("the schedule's meta 'blocks' must map each plan block to a list of block ids")
    missing = [b for b in flow.forwards if b not in raw]
    if missing:
        raise PipelineError(f"the schedule's meta 'blocks' does not say which of your blocks {missing[0]!r} runs")
    return {b: tuple(raw[b]) for b in flow.forwards}


def replicas(flow: Dataflow) -> list[tuple[str, ...]]:
    """The forward chains that share no block (Chimera's two pipelines), each in order; one for a plain pipeline."""
    chains: list[list[str]] = []
    for b in flow.forwards:
        preds = [a for a, _ in flow.in_edges[b]]
        for c in chains:
            if preds and preds[0] in c:
                c.append(b)
                break
        else:
            chains.append([b])
    return [tuple(c) for c in chains]


class Scaled(nn.Module):
    """A last block and the loss function, the loss divided by the replica count."""

    def __init__(self, block: nn.Module, loss_fn: Callable[..., Tensor], scale: float) -> None:
        super().__init__()
        self.block, self.loss_fn, self.scale = block, loss_fn, scale

    def forward(self, *args: Any) -> Tensor:
        return self.loss_fn(self.block(*args[:-1]), args[-1]) * self.scale


class MappedPipeline:
    """`Pipeline` of a plan's pick over the user's blocks (`{"s0": m0, ...}` or a list: s0, s1, ...)."""

    def __init__(self, blocks: Mapping[str, nn.Module] | Sequence[nn.Module], schedule: Schedule | str | Path, *,
                 loss_fn: Callable[..., Tensor], micro_batches: int | None = None, **options: Any) -> None:
        s = schedule if isinstance(schedule, Schedule) else Schedule.load(schedule, check=True)
        user = dict(blocks) if isinstance(blocks, Mapping) else {f"s{i}": m for i, m in enumerate(blocks)}
        self.map = block_map(s)
        flow = dataflow(s.placement)
        for b, units in self.map.items():
            absent = [u for u in units if u not in user]
            if absent:
                raise PipelineError(f"the plan's block {b!r} runs your block {absent[0]!r}; got modules for "
                                    f"{', '.join(user) or 'none'} (schedule meta 'blocks' maps plan blocks "
                                    "to yours: docs/runtime.md)")
        self.chains = replicas(flow)
        r = len(self.chains)
        modules: dict[str, nn.Module] = {}
        for chain in self.chains:
            for b in chain:
                mods = [user[u] for u in self.map[b]]
                m = mods[0] if len(mods) == 1 else nn.Sequential(*mods)
                modules[b] = Scaled(m, loss_fn, 1 / r) if b == chain[-1] else m
        feeds: dict[str, tuple[str, ...]] = {c[0]: (f"r{k}.input",) for k, c in enumerate(self.chains)}
        feeds |= {c[-1]: feeds.get(c[-1], ()) + (f"r{k}.{TARGET}",) for k, c in enumerate(self.chains)}
        self.pipe = Pipeline(modules, s, loss_fn=None, micro_batches=micro_batches, feeds=feeds, **options)
        self._sync = self._copies(user)

    def _copies(self, user: Mapping[str, nn.Module]) -> list[tuple[Any, nn.Module]]:
        """(process group, module) for each user block held on more than one rank, this rank's ones.
        Collective: every rank makes every group, in the user's block order."""
        flow = self.pipe.flow
        out = []
        for u in user:
            ranks = sorted({d for b, units in self.map.items() if u in units for d in flow.devices(b)})
            if len(ranks) < 2:
                continue
            group = dist.new_group(ranks)  # pipeline ranks == group ranks without data parallelism
            if self.pipe.rank in ranks:
                out.append((group, user[u]))
        return out

    def step(self, x: Tensor, *, target: Tensor) -> float:
        """Forward and backward of the batch (`x`, `target`: rows split along dim 0); its mean loss."""
        r, n = len(self.chains), self.pipe.schedule.micro_batches
        if x.shape[0] % (r * n) or target.shape[0] != x.shape[0]:
            raise PipelineError(f"the batch has {x.shape[0]} rows (target {target.shape[0]}): give a multiple "
                                f"of {r * n} ({r} replica(s) x {n} micro-batches) in both")
        fields = {}
        for k in range(r):  # micro-batch j of the whole batch goes to replica j mod r
            fields[f"r{k}.input"] = _every(x, r * n, k, r)
            fields[f"r{k}.{TARGET}"] = _every(target, r * n, k, r)
        before = {id(p): p.grad.clone() for _, m in self._sync for p in m.parameters() if p.grad is not None}
        loss = self.pipe.step(**fields)
        for group, module in self._sync:  # sum this step's gradients over the copies (earlier ones are equal)
            for p in module.parameters():
                if p.grad is not None:
                    old = before.get(id(p))
                    delta = p.grad if old is None else p.grad - old
                    dist.all_reduce(delta, group=group)
                    p.grad = delta if old is None else old + delta
        return loss

    def parameters(self) -> list[nn.Parameter]:
        return self.pipe.parameters()


def _every(t: Tensor, parts: int, first: int, stride: int) -> Tensor:
    import torch
    return torch.cat(t.chunk(parts)[first::stride])

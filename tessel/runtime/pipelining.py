"""Interop with torch.distributed.pipelining: a schedule as the action CSV it loads.

For a chain of forward blocks, each on one device and trained, stage k is the k-th forward block
of the chain, and each rank's compute tasks, in the schedule's order, become `{k}F{mb}`,
`{k}B{mb}` (or `{k}I{mb}` and `{k}W{mb}` when the backward is split into a weight block): one row
per rank. `_PipelineScheduleRuntime._load_csv(path, "compute_only")` reads it, infers which rank
holds which stage from the rows, adds its own sends and receives and runs it.

torchtitan lays stages out on ranks in two ways (`stage_ids_this_rank`): "loop" (stage s on rank
s mod p: one stage per rank for a plain chain, several for interleaved) and "v" (rank r holds
stages r and 2p-1-r, when `pipeline_parallel_schedule` is ZBVZeroBubble or DualPipeV). `export`
names the layout a schedule's placement has; any other stage-to-rank map ("custom") still runs
under `_PipelineScheduleRuntime` driven by hand, but not under torchtitan.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..io import atomic_write
from ..placement import PlacementError
from ..schedule import Schedule
from .dataflow import Dataflow
from .program import Programs, lower

ACTION = {"forward": "F", "backward": "B", "weight": "W"}
LAYOUTS = ("loop", "v", "custom")


def stage_of(flow: Dataflow) -> dict[str, int]:
    """Forward block -> pipeline stage index; PlacementError (why the CSV cannot say it) unless the
    placement is a chain of trained blocks, each with its backward on its own one device."""
    p = flow.placement
    fw = flow.forwards
    if any(len(flow.in_edges[b]) > 1 or len(flow.out_edges[b]) > 1 for b in fw) or len(flow.sinks) != 1:
        raise PlacementError(f"torch pipelining runs a chain of stages (each sends to the next only); "
                             f"placement {p.name} is not a chain (it has branches or joins)")
    for b in fw:
        if len(flow.devices(b)) != 1:
            raise PlacementError(f"torch pipelining runs each stage on one device; block {b} of {p.name} "
                                 f"spans devices {list(flow.devices(b))} (sharded or tensor-parallel)")
        if b not in flow.backward:
            raise PlacementError(f"torch pipelining trains every stage; block {b} of {p.name} has no backward")
        for g in (flow.backward[b], flow.weight.get(b)):
            if g is not None and flow.devices(g) != flow.devices(b):
                raise PlacementError(f"torch pipelining runs a stage's backward where its forward ran; block "
                                     f"{g} of {p.name} is on devices {list(flow.devices(g))}, its forward {b} "
                                     f"on {list(flow.devices(b))}")
    used = {flow.devices(b)[0] for b in fw}
    idle = [d for d in range(p.devices) if d not in used]
    if idle:
        raise PlacementError(f"torch pipelining gives every rank a stage; device {idle[0]} of {p.name} holds none")
    return {b: k for k, b in enumerate(fw)}


def stage_ids_this_rank(rank: int, ranks: int, stages: int, style: str) -> tuple[int, ...]:
    """The stages torchtitan builds on `rank` (its `stage_ids_this_rank`, restated)."""
    if stages % ranks:
        raise PlacementError(f"torchtitan needs a stage count divisible by the ranks; got {stages} stages "
                             f"on {ranks} ranks")
    per = stages // ranks
    if style == "loop":
        return tuple(rank + s * ranks for s in range(per))
    if style == "v" and per == 2:
        return (rank, stages - 1 - rank)
    raise PlacementError(f"torchtitan lays out {per} stages per rank as 'loop'" +
                         (" or 'v'" if per == 2 else "") + f", not {style!r}")


def layout_of(ranks: int, rank_of_stage: list[int]) -> str:
    """"loop", "v" (torchtitan builds them) or "custom" (any other stage -> rank map)."""
    s = len(rank_of_stage)
    for style in ("loop", "v"):
        try:
            if all(rank_of_stage[k] == r for r in range(ranks) for k in stage_ids_this_rank(r, ranks, s, style)):
                return style
        except PlacementError:
            continue
    return "custom"


@dataclass(frozen=True)
class Export:
    """A schedule as torch pipelining's compute-only action CSV, and how to lay its stages out."""
    rows: tuple[tuple[str, ...], ...]  # rank -> actions in order
    stages: tuple[str, ...]            # stage index -> forward block
    rank_of_stage: tuple[int, ...]
    layout: str                        # one of LAYOUTS
    micro_batches: int
    split_backward: bool               # I/W actions (weight blocks) rather than B

    @property
    def csv(self) -> str:
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows(self.rows)
        return out.getvalue()

    def stages_on(self, rank: int) -> tuple[int, ...]:
        return tuple(k for k, r in enumerate(self.rank_of_stage) if r == rank)

    def write(self, path: str | Path) -> None:
        atomic_write(path, self.csv)

    @property
    def torchtitan_schedule(self) -> str | None:
        """The `pipeline_parallel_schedule` whose stage layout and stage count torchtitan gives this
        CSV (it still runs the CSV's order): None for a layout torchtitan does not build."""
        per_rank = len(self.stages) // len(self.rows)
        if self.layout == "loop":
            return "1F1B" if per_rank == 1 else "Interleaved1F1B"
        return "ZBVZeroBubble" if self.layout == "v" else None

    def torchtitan_keys(self, csv_path: str) -> dict[str, Any]:
        """torchtitan's `[parallelism]` settings for this CSV; empty when it cannot lay it out."""
        if self.torchtitan_schedule is None:
            return {}
        return {"pipeline_parallel_degree": len(self.rows),
                "pipeline_parallel_schedule": self.torchtitan_schedule,
                "pipeline_parallel_schedule_csv": csv_path}


def export(schedule: Schedule) -> Export:
    """The CSV `_PipelineScheduleRuntime` loads for `schedule`; PlacementError naming why when the
    format cannot express its placement."""
    progs = lower(schedule)
    flow = progs.flow
    stage_of(flow)  # refuses, naming why, what the CSV cannot say
    ranks = tuple(flow.devices(b)[0] for b in flow.forwards)
    return Export(rows=tuple(tuple(r) for r in pipeline_actions(progs)), stages=tuple(flow.forwards),
                  rank_of_stage=ranks, layout=layout_of(schedule.placement.devices, list(ranks)),
                  micro_batches=schedule.micro_batches, split_backward=bool(flow.weight))


def pipeline_actions(programs: Programs) -> list[list[str]]:
    """One row of actions per rank, in program order."""
    flow = programs.flow
    stage = stage_of(flow)
    rows = []
    for prog in programs.ranks:
        row = []
        for ins in prog:
            if not ins.is_compute:
                continue
            fwd = ins.block if ins.op == "forward" else flow.forward_of[ins.block]
            kind = "I" if ins.op == "backward" and fwd in flow.weight else ACTION[ins.op]
            row.append(f"{stage[fwd]}{kind}{ins.micro_batch}")
        rows.append(row)
    return rows


def actions_csv(programs: Programs) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(pipeline_actions(programs))
    return out.getvalue()


def write_actions_csv(programs: Programs, path: str | Path) -> None:
    atomic_write(path, actions_csv(programs))


def torch_runtime(programs: Programs, csv_path: str | Path, modules: Mapping[str, Any], device: Any,
                  loss_fn: Any) -> Any:
    """A `_PipelineScheduleRuntime` over this rank's stages, loaded from the action CSV.

    `modules`: this rank's forward blocks (their stage module: the last one returns the output
    `loss_fn(output, target)` turns into the loss). The caller calls `.step(...)` like any
    torch pipelining schedule.
    """
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    stage = stage_of(programs.flow)
    stages = [PipelineStage(m, stage[b], len(stage), device) for b, m in
              sorted(modules.items(), key=lambda kv: stage[kv[0]])]
    runtime = _PipelineScheduleRuntime(  # type: ignore[no-untyped-call]
        stages, programs.micro_batches, loss_fn=loss_fn, scale_grads=True)
    runtime._load_csv(str(csv_path), format="compute_only")
    return runtime


def stage_module(block: Any) -> Any:
    """The stage module torch pipelining runs for an example block: a sink yields its output
    (`block.body`), since the schedule applies the loss function itself."""
    import torch

    class Body(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner.body(*args)

    return Body(block) if getattr(block, "loss", None) is not None else block

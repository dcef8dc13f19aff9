"""Interop with torch.distributed.pipelining: per-rank programs as the action CSV it loads.

For a chain placement with one device per forward block, stage k is the k-th forward block of the
chain, and each rank's compute tasks become `{k}F{mb}`, `{k}B{mb}` (or `{k}I{mb}` and `{k}W{mb}`
when the backward is split into a weight block). `_PipelineScheduleRuntime._load_csv(path,
"compute_only")` reads it (one row per rank), adds its own sends and receives and runs it.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..io import atomic_write
from ..placement import PlacementError
from .dataflow import Dataflow
from .program import Programs

ACTION = {"forward": "F", "backward": "B", "weight": "W"}


def stage_of(flow: Dataflow) -> dict[str, int]:
    """Forward block -> pipeline stage index; PlacementError unless the placement fits the format."""
    p = flow.placement
    fw = flow.forwards
    if any(len(flow.in_edges[b]) > 1 or len(flow.out_edges[b]) > 1 for b in fw) or len(flow.sinks) != 1:
        raise PlacementError(f"torch pipelining runs chains of stages; placement {p.name} is not a chain")
    for b in fw:
        if len(flow.devices(b)) != 1:
            raise PlacementError(f"torch pipelining runs one device per stage; block {b} of {p.name} "
                                 f"spans devices {list(flow.devices(b))}")
        if b not in flow.backward:
            raise PlacementError(f"torch pipelining trains every stage; block {b} of {p.name} has no backward")
    return {b: k for k, b in enumerate(fw)}


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

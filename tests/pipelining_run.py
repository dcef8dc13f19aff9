"""Runs exported schedule CSVs with torch pipelining on 4 gloo ranks; prints one JSON line.

Imports torch only (and torchtitan with `--torchtitan`), so that it runs in a virtual environment
without tessel: `python tests/pipelining_run.py CASES.json [--torchtitan]`. CASES.json lists
{"csv", "style", "stages", "micro_batches", "schedule"} (the last: torchtitan's
`pipeline_parallel_schedule` for it). Each rank builds the stages torchtitan would give it
for that style (toy stages: Linear + tanh, weights fixed by the stage index), runs one step from
the CSV, and reports per case the largest gradient difference from the same stages run on one
process and the compute actions it executed, in order (from the runtime's own debug log).

With `--torchtitan` the stage layout comes from torchtitan's `_get_pp_rank_to_stage_indices_mapping`
and the schedule from its `_build_pipeline_schedule` (the path of `pipeline_parallel_schedule_csv`).
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RANKS, DIM, MB_SIZE = 4, 8, 2
COMPUTE = re.compile(r"^\d+[FIBW]\d+$")


def stage_ids(rank: int, stages: int, style: str) -> tuple[int, ...]:
    """torchtitan's layout, restated (checked against torchtitan's own in the --torchtitan run)."""
    per = stages // RANKS
    return tuple(rank + s * RANKS for s in range(per)) if style == "loop" else (rank, stages - 1 - rank)


def make_stage(k: int) -> torch.nn.Module:
    torch.manual_seed(1000 + k)
    return torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh())


def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(n * MB_SIZE, DIM, generator=g), torch.randn(n * MB_SIZE, DIM, generator=g)


def reference(stages: int, n: int, scale: bool) -> list[list[torch.Tensor]]:
    """Gradients on one process: the sum of the micro-batches' losses (divided by n when scaled)."""
    mods = [make_stage(k) for k in range(stages)]
    x, y = batch(n)
    total = torch.zeros(())
    for xm, ym in zip(x.chunk(n), y.chunk(n)):
        h = xm
        for m in mods:
            h = m(h)
        total = total + torch.nn.functional.mse_loss(h, ym)
    (total / n if scale else total).backward()
    return [[p.grad for p in m.parameters()] for m in mods]


class Actions(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg.startswith("_PipelineScheduleRuntime running") and len(record.args or ()) == 2:
            action = str(record.args[1])  # type: ignore[index]
            if COMPUTE.match(action):
                self.seen.append(action)


def run_case(rank: int, case: dict[str, Any], titan: bool) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    s, n = case["stages"], case["micro_batches"]
    if titan:
        from torchtitan.config import ParallelismConfig
        from torchtitan.distributed.pipeline_parallel import (
            _build_pipeline_schedule,
            _get_pp_rank_to_stage_indices_mapping,
        )
        mine = _get_pp_rank_to_stage_indices_mapping(rank, RANKS, case["schedule"], s)
        assert tuple(mine) == stage_ids(rank, s, case["style"]), (mine, case)
    else:
        mine = stage_ids(rank, s, case["style"])
    mods = {k: make_stage(k) for k in mine}
    stages = [PipelineStage(mods[k], k, s, torch.device("cpu")) for k in mine]

    def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, target)
    if titan:
        config = ParallelismConfig(pipeline_parallel_degree=RANKS, pipeline_parallel_microbatch_size=MB_SIZE,
                                   pipeline_parallel_schedule=case["schedule"],
                                   pipeline_parallel_schedule_csv=case["csv"])
        sched = _build_pipeline_schedule(parallelism=config, local_batch_size=n * MB_SIZE, stages=stages,
                                         loss_fn=lambda out, target: (mse(out, target), None))
        assert isinstance(sched, _PipelineScheduleRuntime), type(sched)
    else:
        sched = _PipelineScheduleRuntime(stages, n, loss_fn=mse, scale_grads=True)
        sched._load_csv(case["csv"], format="compute_only")
    log = Actions()
    logger = logging.getLogger(_PipelineScheduleRuntime.__module__)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False  # ours only: torch's own handler would print every action
    logger.addHandler(log)
    x, y = batch(n)
    try:
        sched.step(*([x] if 0 in mine else []), target=y if s - 1 in mine else None)
    finally:
        logger.removeHandler(log)
    ref = reference(s, n, scale=not titan)
    diff = max(float((p.grad - q).abs().max()) for k in mine for p, q in zip(mods[k].parameters(), ref[k]))
    return {"diff": diff, "executed": log.seen}


def worker(rank: int, cases: list[dict[str, Any]], titan: bool, store: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=RANKS)
    try:
        results = [run_case(rank, c, titan) for c in cases]
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(results, f)


def main(argv: list[str]) -> None:
    with open(argv[0]) as f:
        cases = json.load(f)
    titan = "--torchtitan" in argv
    # imported once here, not in each forked rank (tens of seconds on a loaded machine)
    import torch.distributed.pipelining.schedules  # noqa: F401
    reference(2, 1, True)  # the first backward imports sympy
    if titan:
        import torchtitan.distributed.pipeline_parallel  # noqa: F401
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        mp.start_processes(worker, (cases, titan, os.path.join(tmp, "store"), out), nprocs=RANKS,
                           start_method="fork")
        per_rank = []
        for r in range(RANKS):
            with open(f"{out}.{r}") as f:
                per_rank.append(json.load(f))
    print(json.dumps([{"diff": max(per_rank[r][i]["diff"] for r in range(RANKS)),
                       "executed": [per_rank[r][i]["executed"] for r in range(RANKS)]}
                      for i in range(len(cases))]))


if __name__ == "__main__":
    main(sys.argv[1:])

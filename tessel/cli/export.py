"""`tessel export`: a schedule file as the action CSV torch.distributed.pipelining loads
(`_PipelineScheduleRuntime._load_csv`, torchtitan's `pipeline_parallel_schedule_csv`)."""
from __future__ import annotations

import argparse

from ..schedule import Schedule
from .outputs import output_path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("export", help="write a schedule as torch pipelining's action CSV (torchtitan)",
                       description="Write a schedule file as the compute-only action CSV that torch's "
                                   "_PipelineScheduleRuntime loads (one row per rank: 0F0, 0B0, 0I0, 0W0 ...) "
                                   "and print the torchtitan settings that run it (docs/torchtitan.md). "
                                   "Chains of one-device trained blocks only: interleaved ('loop') and V "
                                   "('v') layouts included; anything else is refused, saying why.")
    p.add_argument("schedule", metavar="SCHEDULE", help="a schedule JSON file (from search, baseline or plan)")
    p.add_argument("-o", "--output", metavar="FILE", type=output_path, required=True, help="write the CSV here")
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from ..runtime.pipelining import export
    s = Schedule.load(args.schedule)
    e = export(s)
    e.write(args.output)
    print(f"wrote {args.output}: {len(e.stages)} stages on {len(e.rows)} ranks, {e.micro_batches} micro-batches, "
          f"layout {e.layout}" + (", backward split into I and W" if e.split_backward else ""))
    for r in range(len(e.rows)):
        print(f"  rank {r}: stages {', '.join(str(k) for k in e.stages_on(r))}")
    keys = e.torchtitan_keys(args.output)
    if not keys:
        print("torchtitan lays stages out only as 'loop' (stage s on rank s mod p) or 'v' (rank r: stages r "
              "and 2p-1-r); run this CSV with _PipelineScheduleRuntime and the stages listed above")
        return 0
    per_rank = len(e.stages) // len(e.rows)
    print(f"torchtitan ({e.layout!r} layout, {per_rank} stage(s) per rank; docs/torchtitan.md), with M "
          f"samples per micro-batch:")
    flags = [f"--parallelism.{k} {v}" for k, v in keys.items()]
    flags += ["--parallelism.pipeline_parallel_microbatch_size M", f"--training.local_batch_size {e.micro_batches}*M"]
    print("  " + " \\\n  ".join(flags))
    if per_rank > 2:  # torchtitan makes 2 stages per rank unless told the layers per stage
        print(f"  and --parallelism.pipeline_parallel_layers_per_stage L such that it cuts {len(e.stages)} stages")
    return 0

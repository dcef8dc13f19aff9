"""Runtime: execute a schedule on a PyTorch model with torch.distributed.

Torch-free, imported here: `dataflow` (which tensor moves where) and `program` (lowering a
schedule into per-rank programs, and the check that they cannot deadlock). With torch, import
from their modules: `comm` (process set-up, abort on failure), `signed` (the local job's store:
hidden names, signed values), `executor` (runs one rank's
program), `launch` (local launcher), `tp` (tensor-parallel layers), `networks` (example networks bound
to placements), `train` (training jobs, checked against one process) and `pipelining` (export to
torch.distributed.pipelining's action CSV).

The library API: `pipeline.Pipeline` (your modules, a schedule, a loss; `step(batch) -> loss`),
`split` (cut a model into blocks; chain placements), `checkpoint` (torch.distributed.checkpoint of
a pipeline's sharded model and optimizer), `hf` (a Hugging Face GPT-2 on the M shape); beneath
them `pack` (pytree outputs as one tensor) and `share` (the same schedule on every rank);
`profiler` (measure a model's blocks into a placement in ms and MiB).
Tutorial: docs/runtime.md.
"""
from .dataflow import Dataflow, dataflow
from .program import Instruction, Programs, Transfer, check_programs, lower, lower_orders

__all__ = ["Dataflow", "Instruction", "Programs", "Transfer", "check_programs", "dataflow", "lower",
           "lower_orders"]

"""`tessel plan`: the fastest placement and schedule of a model on a cluster, ranked with why."""
from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator

from ..costmodel import HARDWARE, SPECS, hardware
from ..plan import Cluster, Plan, Row, load_model, plan
from ..plan.planner import Progress
from ..search.budget import command_clock
from .common import UsageError, positive_float, positive_int, print_table, seconds
from .outputs import add_output_args, write_outputs


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="choose placement and schedule together for a model on a cluster",
                       description="Enumerate placements of a model (shape, tensor-parallel degree, stage "
                                   "split, sharded or in-stage embedding/head, recomputation), prune them by "
                                   "memory and by their lower bound, search the survivors and the baselines, "
                                   "and print the ranked plans. The plan is never slower than a baseline it "
                                   "evaluated.")
    p.add_argument("model", metavar="MODEL",
                   help=f"a cost-model name ({', '.join(SPECS)}), a placement file (e.g. from "
                        "`tessel profile`, ms and MiB) or a placement-family file ({\"family\": \"kshape\", ...})")
    p.add_argument("--gpu", choices=list(HARDWARE), default="a100-80g", help="device type (default a100-80g)")
    p.add_argument("--devices", type=positive_int, default=8, help="devices in all (default 8)")
    p.add_argument("--devices-per-node", type=positive_int, metavar="P", help="devices per node (default the GPU's)")
    p.add_argument("--memory", type=positive_float("memory", "GiB"), metavar="GIB", help="device memory in GiB (default the GPU's)")
    p.add_argument("--micro-batches", "-n", type=positive_int, default=64, metavar="N", help="micro-batches (64)")
    p.add_argument("--time-limit", type=seconds, default=90.0, metavar="S", help="seconds of search in all (90)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a model option, e.g. layers=48 hidden=4096 lm_head=false recompute=true (repeatable)")
    p.add_argument("--placement-out", metavar="FILE", help="write the chosen placement (JSON or YAML) here")
    add_output_args(p)
    p.set_defaults(func=_plan)


def parse_options(items: list[str]) -> dict[str, int | float | bool]:
    out: dict[str, int | float | bool] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        low = value.strip().lower()
        if low in ("true", "false"):
            out[key] = low == "true"
            continue
        try:
            out[key] = int(value) if low.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise UsageError(f"--set {key}: expected a number or true/false, got {value!r}") from None
    return out


def _plan(args: argparse.Namespace) -> int:
    hw = hardware(args.gpu)
    try:
        cluster = Cluster.of(hw, args.devices, args.devices_per_node, args.memory * 1024 ** 3 if args.memory else None)
    except ValueError as e:
        raise UsageError(str(e)) from None
    model = load_model(args.model, cluster, parse_options(args.set))
    with _bar() as progress:
        # the time limit counts from the command's start, as `tessel search`'s does
        clock = command_clock(args.time_limit, getattr(args, "started", None))
        result = plan(model.spec, cluster, args.micro_batches, time_limit=args.time_limit, given=model.given,
                      progress=progress, clock=clock)
    print_plan(result)
    best = result.best
    if args.placement_out:
        best.candidate.placement.save(args.placement_out)
        print(f"wrote {args.placement_out}")
    if best.schedule is not None:
        write_outputs(best.schedule.with_meta(plan=result.why, placement_family=best.candidate.name), args)
    return 0


def print_plan(result: Plan) -> None:
    rows = [_cells(k, r) for k, r in enumerate(result.rows, 1)]
    print_table(["#", "placement", "method", "period bound ms", "makespan s", "peak/budget GiB", "search s",
                 "status"], rows, title=f"{result.model} on {result.devices} devices, "
                                        f"{result.micro_batches} micro-batches")
    print(result.why)


def _cells(k: int, r: Row) -> list[str]:
    peak = r.peak
    mem = "-" if peak is None else f"{peak[0] / 1024:.1f}/{peak[1] / 1024:.1f}"
    span = "-" if r.makespan is None else f"{r.makespan / 1e3:.3f}"
    status = r.status if not r.reason else f"{r.status}: {r.reason[:70]}"
    return [str(k), r.candidate.name, r.method, f"{r.period_bound:.1f}", span, mem, f"{r.seconds:.1f}", status]


@contextlib.contextmanager
def _bar() -> Iterator[Progress | None]:
    """A rich progress bar on a terminal; nothing when the output is piped."""
    from rich.console import Console
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar
    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with Bar(TextColumn("plan"), BarColumn(), TextColumn("{task.completed}/{task.total} {task.description}"),
             TimeElapsedColumn(), console=console, transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)
        yield update

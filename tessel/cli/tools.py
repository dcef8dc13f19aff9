"""`tessel profile` (a real model's blocks -> placement JSON) and `tessel simulate` (replay a
schedule's orders with other costs: noise, latency, profiled durations; robustness)."""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..schedule import Schedule
from ..simulate import MAX_NOISE
from .common import UsageError, finite_float, fmt, int_in, positive_int, print_summary, print_table
from .outputs import add_output_args, output_path, write_outputs
from .runtime import MAX_SEED, MODEL_NAMES

if TYPE_CHECKING:
    from ..runtime.profiler import Profile

MAX_REPLAYS = 1_000_000  # task replays one `simulate --trials` may ask for (trials x tasks of every schedule)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_profile(sub)
    _register_simulate(sub)


# ---- profile -------------------------------------------------------------------------------------
def _register_profile(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("profile", help="measure a model's blocks into a placement (ms, MiB)",
                       description="Measure forward/backward time, activation memory and message sizes of "
                                   "an example model's blocks on this machine; write a placement JSON.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", choices=MODEL_NAMES, help="example model")
    which.add_argument("--module", metavar="PKG.MOD:FUNC",
                       help="your model: FUNC() returns (blocks, inputs): a chain of modules (list or "
                            "{id: module}, e.g. from tessel.runtime.split) and the first block's arguments "
                            "for one micro-batch; placed one block per device (--devices: fewer wraps around)")
    p.add_argument("--split-weight", action="store_true",
                   help="with --module: measure each backward as input-gradient and weight-gradient blocks")
    p.add_argument("--layout", choices=("loop", "v"), default="loop",
                   help="with --module: block i on device i mod --devices (loop, default), or device d "
                        "holding blocks d and 2*devices-1-d (v: 2 blocks per device, torchtitan's ZB-V layout)")
    p.add_argument("--placement", metavar="NAME", help="built-in placement to bind it to "
                   "(default: the model's own: gpt->mllm, kshape->kshape, mlp->vshape)")
    p.add_argument("--devices", type=positive_int,
                   help="device count (default: 4 with --model; with --module one block per device, "
                        "two with --layout v; more devices than that is refused)")
    p.add_argument("--micro-batch-size", type=positive_int, default=8, help="samples per micro-batch (default 8)")
    g = p.add_argument_group("model size")
    for name, default in (("dim", 128), ("ffn", 512), ("seq", 32), ("vocab", 512), ("layers", 2)):
        g.add_argument(f"--{name}", type=positive_int, default=default, help=f"default {default}")
    p.add_argument("--repeats", type=positive_int, default=10,
                   help="timed runs per block (the fastest, once a quarter of them are within 10%% of it; "
                        "up to 4x more until then; default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1, as one rank)")
    p.add_argument("--bandwidth", type=float, metavar="BYTES_PER_S",
                   help="link bandwidth for the latency of cross-device edges (default: latency 0)")
    p.add_argument("--alpha", type=float, default=0.0, metavar="SECONDS", help="per-message start-up time")
    p.add_argument("-o", "--output", metavar="FILE", type=output_path, required=True,
                   help="write the placement JSON here")
    p.set_defaults(func=_profile)


def _profile(args: argparse.Namespace) -> int:
    import torch

    from .. import library
    from ..runtime.networks import MODELS, Config, example
    from ..runtime.profiler import profile
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {args.device[:40]!r}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("--device cuda: CUDA is not available on this machine")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.module:
        return _profile_module(args)
    placement = library.build(args.placement or MODELS[args.model].placement, devices=args.devices or 4)
    cfg = Config(dim=args.dim, ffn=args.ffn, seq=args.seq, vocab=args.vocab, layers=args.layers)
    ex = example(args.model, placement, cfg)
    batch = ex.batch(args.micro_batch_size)
    inputs = {b: [batch[f] for f in ex.feeds[b]] for b in ex.flow.forwards}
    modules = {b: ex.whole(b) for b in ex.flow.forwards}
    prof = profile(placement, modules, inputs, device=args.device, warmup=args.warmup, repeats=args.repeats,
                   bandwidth=args.bandwidth, alpha=args.alpha, threads=args.threads)
    return _write_profile(prof, args.model, args)


def _profile_module(args: argparse.Namespace) -> int:
    """`--module pkg.mod:func`: the user's own code, named on their own command line, imported."""
    import importlib
    import os
    import sys

    from ..placement import PlacementError
    from ..runtime.profiler import profile_modules
    mod_name, _, func_name = args.module.partition(":")
    if not mod_name or not func_name.isidentifier():
        raise UsageError(f"--module {args.module!r}: expected PKG.MOD:FUNC")
    sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's modules next to them
    try:
        func = getattr(importlib.import_module(mod_name), func_name)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"--module {args.module}: {e}") from None
    got = func()
    if not (isinstance(got, tuple) and len(got) == 2):
        raise UsageError(f"--module {args.module}: {func_name}() must return (blocks, inputs), "
                         f"got {type(got).__name__}")
    blocks, inputs = got
    try:
        prof = profile_modules(blocks, inputs if isinstance(inputs, (tuple, list)) else (inputs,),
                               devices=args.devices or _default_devices(len(blocks), args.layout),
                               split_weight=args.split_weight, layout=args.layout,
                               device=args.device, warmup=args.warmup, repeats=args.repeats,
                               bandwidth=args.bandwidth, alpha=args.alpha, threads=args.threads)
    except PlacementError as e:
        raise UsageError(f"--module {args.module}: {e}") from None
    return _write_profile(prof, args.module, args)


def _default_devices(blocks: int, layout: str) -> int:
    return max(1, blocks // 2) if layout == "v" else blocks


def _write_profile(prof: Profile, what: str, args: argparse.Namespace) -> int:
    heads, rows = prof.table()
    print_table(heads, rows, title=f"{what} on {prof.placement.name} ({prof.device}, fastest of "
                                   f"{args.repeats} or more runs)")
    for w in prof.warnings:
        print(f"tessel: warning: {w}", file=sys.stderr)
    print(f"latency: {fmt(prof.placement.latency)} ms")
    prof.placement.save(args.output)
    print(f"wrote {args.output}")
    return 0


# ---- simulate ------------------------------------------------------------------------------------
def _register_simulate(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("simulate", help="replay a schedule's orders with noisy, profiled or communicating costs",
                       description="Replay each device's task order of SCHEDULE with other durations and "
                                   "latency; print the new figures, or with --trials the makespan "
                                   "distribution (against --against schedules under the same draws).")
    p.add_argument("schedule", metavar="SCHEDULE", help="schedule JSON")
    p.add_argument("--noise", type=finite_float("--noise", 0, MAX_NOISE), default=0.0,
                   help="relative log-normal spread of durations (e.g. 0.1)")
    p.add_argument("--scope", choices=("block", "task"), default=None,
                   help="one draw per block (cost error) or per task (jitter); default block, "
                        "task with --trials")
    p.add_argument("--latency", type=float, help="cross-device edge latency to use instead of the placement's")
    p.add_argument("--durations", metavar="PLACEMENT", help="placement JSON whose block durations to use "
                   "(e.g. from `tessel profile`)")
    p.add_argument("--cores", type=float, metavar="C", help="the devices are processes sharing C CPU cores "
                   "(e.g. CPU ranks on one host): durations stretch while more than C compute")
    p.add_argument("--seed", type=int_in("--seed", 0, MAX_SEED), default=0, help="noise seed (default 0)")
    p.add_argument("--trials", type=int_in("--trials", 1, MAX_REPLAYS), default=1,
                   help="replays under independent draws (default 1)")
    p.add_argument("--against", nargs="+", metavar="SCHEDULE", default=[],
                   help="other schedules of the same placement to compare under the same draws")
    add_output_args(p)
    p.set_defaults(func=_simulate)


def _load(path: str) -> Schedule:
    return Schedule.load(path, check=True)


def _simulate(args: argparse.Namespace) -> int:
    from ..placement import load_placement
    from ..simulate import robustness, simulate
    if args.noise < 0:
        raise UsageError(f"--noise must be >= 0, got {args.noise:g}")
    if args.latency is not None and args.latency < 0:
        raise UsageError(f"--latency must be >= 0, got {args.latency:g}")
    if args.cores is not None and not args.cores > 0:
        raise UsageError(f"--cores must be > 0, got {args.cores:g}")
    s = _load(args.schedule)
    durations = load_placement(args.durations) if args.durations else None
    if args.trials > 1 or args.against:
        if durations is not None:
            raise UsageError("--durations applies to a single replay, not to --trials/--against")
        if any(getattr(args, k, None) for k in ("output", "plot", "trace", "cores")):
            raise UsageError("-o/--plot/--trace/--cores apply to one replay; drop --trials/--against")
        named = {_name(args.schedule, s, {}): s}
        for path in args.against:
            other = _load(path)
            named[_name(path, other, named)] = other
        _check_replays(args.trials, [len(x.tasks) for x in named.values()])
        r = robustness(named, args.noise, args.trials, args.seed, args.scope or "task", latency=args.latency)
        heads, rows = r.table()
        print_table(heads, rows, title=f"makespan under noise {args.noise:g} ({r.scope} draws), "
                                       f"{r.trials} trials, seed {r.seed}")
        return 0
    out = simulate(s, durations=durations, noise=args.noise, scope=args.scope or "block", seed=args.seed,
                   latency=args.latency, cores=args.cores)
    print_summary(out)
    change = out.makespan / s.makespan - 1
    print(f"{'nominal':>14}: {fmt(s.makespan)} ({change:+.2%})")
    write_outputs(out, args)
    return 0


def _check_replays(trials: int, tasks: Sequence[int]) -> None:
    """Refused before any replay: more task replays than MAX_REPLAYS (about 40 us each: a billion
    trials ran until killed)."""
    total = trials * sum(tasks)
    if total > MAX_REPLAYS:
        raise UsageError(f"--trials {trials:,} x {sum(tasks):,} tasks ({len(tasks)} schedule(s)) = {total:,} task "
                         f"replays, more than the {MAX_REPLAYS:,} accepted; use at most "
                         f"{max(1, MAX_REPLAYS // sum(tasks)):,} trials")


def _name(path: str, s: Schedule, taken: Mapping[str, Any]) -> str:
    """The method that made the schedule, or its file name when that is missing or taken."""
    method = s.meta.get("method")
    return method if isinstance(method, str) and method not in taken else Path(path).name

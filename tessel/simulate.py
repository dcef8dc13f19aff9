"""Simulator: replay a schedule's per-device ORDERS with other costs and get the new timeline.

A schedule fixes, on every device, which task runs after which. Real costs differ from the
searched ones (a profile, a cost-model error, run-to-run jitter, communication), so the start
times change but the orders stay: the runtime executes orders, not clocks. The replay is the
event walk of `timing.earliest_starts` (each task starts when its inputs have arrived and every
one of its devices has finished the task before it); this module only chooses the durations
and latencies it walks with, and wraps the result into a validated `Schedule`.

Memory never breaks in a replay: on a device, an allocation happens at a task start and a
release at a task end, and the device runs its tasks one after another in a fixed order, so the
sequence of memory events per device -- hence its peak -- depends on the order alone.

Noise is multiplicative and log-normal with mean 1: factor = exp(sigma * z - sigma^2 / 2),
z ~ N(0, 1), so `noise=0.1` means about 10% relative spread and never a negative duration.
Draws are keyed by (seed, trial, block[, micro-batch]) through `random.Random(str)` (seeded by
SHA-512 of the string, stable across runs and processes), so two schedules of the same
placement see the same draws: comparisons under noise are paired.

Two scopes:
- `block`: one factor per block, the same for every micro-batch -- the searched costs were wrong
  (a cost model's or profiler's error). The result is a schedule of the placement with those
  durations.
- `task`: one factor per (block, micro-batch) -- run-to-run jitter. A schedule has one duration
  per block, so the result is the *unfolded* schedule: one micro-batch of a placement whose
  blocks are `block#m`, each with its own duration; every rule, figure and picture applies.

`cores`: the devices are processes sharing that many CPU cores (CPU ranks on one host), so
durations stretch while more of them compute than there are cores (`shared_cores`); the result
is unfolded too.
"""
from __future__ import annotations

import logging
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from .errors import TesselError
from .key import Key
from .placement import MAX_VALUE, MIN_DURATION, Block, Number, Placement, PlacementError, make_placement
from .schedule import Schedule
from .timing import earliest_starts, orders_of

log = logging.getLogger(__name__)

Scope = Literal["block", "task"]
SCOPES: tuple[str, ...] = ("block", "task")
MAX_NOISE = 10.0  # the widest log-normal spread accepted (sigma**2 overflows long before 1e300)


def noise_factor(sigma: float, seed: int, *key: object) -> float:
    """Log-normal factor with mean 1 and log-spread `sigma`, a pure function of its key."""
    if sigma == 0:
        return 1.0
    z = random.Random(f"{seed}:" + ":".join(map(str, key))).gauss(0.0, 1.0)
    return math.exp(sigma * z - sigma * sigma / 2)


def recost(p: Placement, durations: Mapping[str, Number] | Placement | None = None,
           latency: Number | None = None) -> Placement:
    """The placement with other block durations (by id, e.g. a profiled placement) or latency."""
    if isinstance(durations, Placement):
        durations = {b.id: b.duration for b in durations.blocks}
    durations = durations or {}
    unknown = sorted(set(durations) - set(p.by_id))
    if unknown:
        raise PlacementError(f"durations name block {unknown[0]!r}, which placement {p.name!r} lacks")
    blocks = [replace(b, duration=durations.get(b.id, b.duration)) for b in p.blocks]
    return make_placement(p.name, p.devices, blocks, p.edges, p.latency if latency is None else latency)


def perturb(p: Placement, noise: float, seed: int = 0, trial: int = 0) -> Placement:
    """Every block's duration times its own noise factor (scope `block`)."""
    _check_noise(noise)
    blocks = [replace(b, duration=noisy(b.duration, noise_factor(noise, seed, trial, b.id))) for b in p.blocks]
    return make_placement(p.name, p.devices, blocks, p.edges, p.latency)


def noisy(duration: Number, factor: float) -> float:
    """`duration` times a noise factor, kept in the range a placement's durations may take: a
    wide spread draws factors of 1e-3 and below, and a block of 1e-6 would leave it."""
    return min(max(duration * factor, MIN_DURATION), MAX_VALUE)


def _check_noise(noise: float) -> None:
    if not (isinstance(noise, (int, float)) and not isinstance(noise, bool) and 0 <= noise <= MAX_NOISE):
        raise TesselError(f"noise must be a number in 0..{MAX_NOISE:g} (a log-spread: {MAX_NOISE:g} already draws "
                          f"factors past e**30), got {noise!r}")


def simulate(s: Schedule, *, durations: Mapping[str, Number] | Placement | None = None,
             noise: float = 0.0, scope: Scope = "block", seed: int = 0, trial: int = 0,
             latency: Number | None = None, cores: float | None = None) -> Schedule:
    """Replay the orders of `s` with other costs; return the new timeline, validated.

    `durations` replaces block durations (a profiled placement or {block: duration}); `latency`
    replaces the cross-device edge latency; `noise` perturbs durations after that, per `scope`.
    `cores`: the devices are processes sharing that many CPU cores (see `shared_cores`).
    Replaying a schedule with its own costs gives it back when it runs every task as early as
    its order allows (baselines, completed repetends); otherwise the replay is never later.
    """
    if scope not in SCOPES:
        raise TesselError(f"noise scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if cores is not None and not cores > 0:
        raise TesselError(f"cores must be > 0, got {cores!r}")
    _check_noise(noise)
    p = recost(s.placement, durations, latency)
    meta = {**s.meta, "simulated": {"noise": noise, "scope": scope, "seed": seed, "trial": trial,
                                    "latency": p.latency, "durations": durations is not None,
                                    "cores": cores},
            "nominal_makespan": s.makespan}
    per_task = bool(noise) and scope == "task"
    if noise and not per_task:
        p = perturb(p, noise, seed, trial)
    if not per_task and cores is None:
        starts = earliest_starts(p, s.micro_batches, orders_of(s))
        out = Schedule.build(p, s.micro_batches, starts, s.memory_limit, None, meta)
        if p == s.placement and out.start == s.start:
            out = replace(out, repetend=s.repetend)  # the very same timeline: its steady state holds
        return out

    def base(b: str, m: int) -> float:
        return noisy(p.by_id[b].duration, noise_factor(noise, seed, trial, b, m)) if per_task \
            else p.by_id[b].duration * 1.0

    dur = {(b.id, m): base(b.id, m) for b in p.blocks for m in range(s.micro_batches)}
    if cores is not None:
        dur = shared_cores(p, s.micro_batches, orders_of(s), dur, cores)
    starts = earliest_starts(p, s.micro_batches, orders_of(s), duration=lambda b, m: dur[(b, m)])
    flat = unfold(p, s.micro_batches, lambda b, m: dur[(b, m)])
    flat_starts = {(task_id(b, m), 0): t for (b, m), t in starts.items()}
    return Schedule.build(flat, 1, flat_starts, s.memory_limit, None, {**meta, "unfolded": s.micro_batches})


def shared_cores(p: Placement, micro_batches: int, orders: Sequence[Sequence[Key]],
                 base: Mapping[Key, float], cores: float, rounds: int = 40, tol: float = 1e-4) -> dict[Key, float]:
    """Per-task durations when the devices are processes sharing `cores` CPU cores.

    Processor sharing: while k processes compute (a task on several devices counts once per
    device), each runs at min(1, cores / k) of its speed, so a task of base duration d that
    sees on average k busy processes (itself included) lasts d * max(1, k / cores). The busy
    count depends on the timeline and the timeline on the durations: iterate the event walk of
    `earliest_starts` to a fixed point (damped by half each round) within `tol` of the makespan.
    """
    dur = dict(base)
    last = -1.0
    for _ in range(rounds):
        starts = earliest_starts(p, micro_batches, orders, duration=_lookup(dur))
        load = _mean_busy(p, starts, dur)
        dur = {k: (dur[k] + base[k] * max(1.0, load[k] / cores)) / 2 for k in dur}
        span = max(starts[k] + dur[k] for k in starts)
        if abs(span - last) <= tol * span:
            break
        last = span
    return dur


def _lookup(dur: Mapping[Key, float]) -> Callable[[str, int], float]:
    return lambda b, m: dur[(b, m)]


def _mean_busy(p: Placement, starts: Mapping[Key, Number], dur: Mapping[Key, float]) -> dict[Key, float]:
    """Each task's mean number of busy processes over its run, from the integral of the busy count."""
    deltas: dict[float, int] = {}
    for (b, m), t in starts.items():
        w = len(p.by_id[b].devices)
        deltas[t] = deltas.get(t, 0) + w
        deltas[t + dur[(b, m)]] = deltas.get(t + dur[(b, m)], 0) - w
    times = sorted(deltas)
    area, level, acc = [0.0], 0, 0.0  # area[i]: integral of the busy count up to times[i]
    for t0, t1 in zip(times, times[1:]):
        level += deltas[t0]
        acc += level * (t1 - t0)
        area.append(acc)

    at = dict(zip(times, area))  # every start and end is a breakpoint
    return {k: (at[starts[k] + dur[k]] - at[starts[k]]) / dur[k] for k in starts}


def task_id(block: str, micro_batch: int) -> str:
    """The id of one task as a block of the unfolded placement."""
    return f"{block}#{micro_batch}"


def unfold(p: Placement, micro_batches: int, duration: Callable[[str, int], Number]) -> Placement:
    """One micro-batch standing for `micro_batches`: block `b#m` per task, with its own duration."""
    blocks = [Block(task_id(b.id, m), b.kind, duration(b.id, m), b.memory, b.devices,
                    None if b.grad_of is None else task_id(b.grad_of, m))
              for m in range(micro_batches) for b in p.blocks]
    edges = [(task_id(a, m), task_id(b, m)) for m in range(micro_batches) for a, b in p.edges]
    return make_placement(f"{p.name}-x{micro_batches}", p.devices, blocks, edges, p.latency)


# ---- robustness -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Spread:
    """Distribution of a sample: mean, 5th/50th/95th percentiles, worst (largest)."""
    mean: float
    p5: float
    p50: float
    p95: float
    worst: float

    @staticmethod
    def of(xs: Sequence[float]) -> Spread:
        if not xs:
            raise TesselError("a spread needs at least one value")
        q = sorted(xs)

        def pct(f: float) -> float:
            return q[min(len(q) - 1, max(0, math.ceil(f * len(q)) - 1))]
        return Spread(statistics.fmean(q), pct(0.05), statistics.median(q), pct(0.95), q[-1])


@dataclass(frozen=True)
class MethodRobustness:
    """One schedule under noise: its nominal makespan, slowdown, and standing against the reference.

    `slowdown`: noisy makespan / nominal makespan per trial. `versus_reference`: this method's
    noisy makespan / the reference's noisy makespan in the same trial (same draws): above 1
    means the reference stays faster. `reference_wins`: share of trials where it is ratio >= 1.
    """
    method: str
    nominal: Number
    makespan: Spread
    slowdown: Spread
    versus_reference: Spread
    reference_wins: float


@dataclass(frozen=True)
class Robustness:
    noise: float
    scope: str
    trials: int
    seed: int
    reference: str
    methods: tuple[MethodRobustness, ...]

    def table(self) -> tuple[list[str], list[list[object]]]:
        """Headers and rows, one per method, for a CLI table or a Markdown report."""
        heads = ["method", "nominal", "mean", "p95", "slowdown mean", "slowdown p95",
                 f"vs {self.reference} mean", f"vs {self.reference} p5..p95", f"{self.reference} wins"]
        rows: list[list[object]] = [[m.method, m.nominal, round(m.makespan.mean, 4), round(m.makespan.p95, 4),
                 round(m.slowdown.mean, 4), round(m.slowdown.p95, 4), round(m.versus_reference.mean, 4),
                 f"{m.versus_reference.p5:.3f}..{m.versus_reference.p95:.3f}", f"{m.reference_wins:.0%}"]
                for m in self.methods]
        return heads, rows


def robustness(schedules: Mapping[str, Schedule], noise: float, trials: int = 100, seed: int = 0,
               scope: Scope = "task", reference: str | None = None,
               latency: Number | None = None) -> Robustness:
    """Replay every schedule under the same `trials` noise draws; compare with `reference`.

    Blocks with the same id get the same draws in every schedule, so schedules of one placement
    are compared pairwise; `reference` defaults to the first schedule (typically the searched one).
    """
    if not schedules:
        raise TesselError("robustness needs at least one schedule")
    if trials < 1:
        raise TesselError(f"trials must be >= 1, got {trials}")
    ref = reference if reference is not None else next(iter(schedules))
    if ref not in schedules:
        raise TesselError(f"reference {ref!r} is not one of the schedules: {', '.join(schedules)}")
    spans = {name: [simulate(s, noise=noise, scope=scope, seed=seed, trial=k, latency=latency).makespan
                    for k in range(trials)] for name, s in schedules.items()}
    log.info("robustness: %d schedules x %d trials at noise %g (%s)", len(schedules), trials, noise, scope)
    rows = []
    for name, s in schedules.items():
        versus = [a / r for a, r in zip(spans[name], spans[ref])]
        rows.append(MethodRobustness(name, s.makespan, Spread.of(spans[name]),
                                     Spread.of([x / s.makespan for x in spans[name]]), Spread.of(versus),
                                     sum(v >= 1 - 1e-12 for v in versus) / trials))
    return Robustness(noise, scope, trials, seed, ref, tuple(rows))


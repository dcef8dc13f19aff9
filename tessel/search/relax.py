"""A lower bound from a small exact relaxation: one device at a time, or several at once, solved
by CP-SAT.

The relaxation of device d keeps every task on d and, of the rest of the problem, only what
bounds.device_lower_bound already proves about it; it drops the other devices' capacity:
- each task (b, k) of a block b on d starts at or after the least start of the k-th task of b
  in time order (bounds.staggered_releases) and leaves at least the tail of the (N-1-k)-th
  last (bounds.staggered_tails) before the makespan. Micro-batches are interchangeable, so on
  the blocks where taking them in order loses no schedule (exact.fifo_blocks: a tree part of the
  graph) the k-th task in time order is micro-batch k's; on the others every task gets the
  block's least release and least tail;
- two tasks of one micro-batch on d keep the longest path between them, latencies included,
  as a least delay from start to start (rule 2 along the path);
- d runs one task at a time (rule 3), and its memory events are all kept (rule 4: allocations
  at starts, releases at ends, one reservoir; events at one time count together, which only
  lets more through).
An optimal schedule, its micro-batches relabelled as above, restricted to d, is a schedule of
the relaxation of the same makespan, so the relaxation's optimum, and any bound CP-SAT proves
on it, is a lower bound. Times go onto a grid rounded *down* (starts, durations, delays,
releases and tails: floor(x + y) >= floor(x) + floor(y) keeps every constraint of the image of a
real schedule), so the grid bound stays below the real optimum.

Unlike the preemptive one-machine bound of bounds.device_lower_bound, it sees that a task
waits for its own micro-batch's earlier task and that memory caps the micro-batches in flight
at once: on a V (zbv) the device at the tip can start only so many micro-batches before the
first one's round trip returns, so it idles at the start, and again at the end, where the last
ones' round trips leave nothing to run. On zbv with 16 devices, 24 micro-batches, unit costs,
latency 0.5 and 1F1B's memory it proves 116.5 where the arguments prove 103; the best known
schedule (the zero-bubble repository's) is 116.5.

Several devices at once (group_bound): the same relaxation with every task of the group's
devices, each of them running one task at a time with its memory events, the delays between two
tasks of one micro-batch the longest path through the dropped devices' blocks. It sees what one
device cannot: a round trip that waits on another device busy with other micro-batches under
its own memory. With every device in the group it is the whole problem with the releases, tails
and micro-batch order as cuts (still a relaxation: the grid rounds down); V-Min's memory on zbv
with 4 devices, 8 micro-batches, profiled costs: one device proves 26.968, every device at once
27.936, the exact optimum being 27.976. A group may keep the memory limits of only some of its
devices (Group): a dropped limit only lets more through, and a reservoir is the largest part of
the model. Every device with the limit of the tip of a V alone still sees the contention along
the whole V in a fraction of the model: zbv, 6 devices, 18 micro-batches, profiled costs, V-Min's
memory, it proves 55.284 in 40 deterministic s, where every device with every limit proves
nothing above 54.724 in 200. Asked for a bound (group_bound's target: a gap to prove), each group
tries it first, then bisects.

The same model of every device is a search pass too (passes/whole.cuts). First probed at
horizons from the proven bound up (probe_starts): below the optimum propagation often refutes a
horizon at once, which proves a higher bound; at the optimum a tight horizon leads CP-SAT to it
(interleaved-zb, 16 devices, 32 micro-batches, unit costs, latency 0.5, torch's
ScheduleInterleavedZeroBubble's memory: 141.5, the bound, where the search's passes stop at
154); on larger problems, where the probe at the bound can take minutes, halving down from the
best schedule (interleaved-zb, 16 devices, 48 micro-batches, the same costs and memory: 197
against the search's 204.5, the bound 189.5). Then hinted by a valid schedule (cut_starts):
where the grid is exact its schedules are valid ones' orders, and the cuts steer CP-SAT to the
short ones (zbv, 8 devices, unit costs, latency 0.5, V-Min's memory: the optimum 133.5 at 24
micro-batches in about 18 s, from the search's 143.5).

CP-SAT's work on it is capped in deterministic seconds (one worker: the same bound every run);
a device with more than RELAX_TASKS tasks is left out (the reservoir grows with the square of
its events).
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from .. import bounds
from ..key import Key
from ..numeric import EPS, snap
from ..placement import Number, Placement
from .budget import Clock
from .exact import fifo_blocks
from .problem import Problem
from .solver import Expr, Model, work_done

log = logging.getLogger(__name__)

RELAX_TASKS = 300  # most tasks of one device the relaxation models
RELAX_WORK = 0.5  # deterministic seconds of CP-SAT's work per solve
RELAX_PROBES = 4  # solves per device, each below a lower horizon
RELAX_UNITS = 20_000  # most time steps below the horizon
PROBE_TASKS = 3200  # most tasks probe_starts models from the bound up (interleaved-zb, 16 devices, 32 micro-batches: 3,072)
PROBE_TOP_TASKS = 8192  # ... and from the top down, beyond that (16 devices, 64 micro-batches on zbv: 6,144)
PROBE_COUNT = 16  # probes of probe_starts at most (refuted ones take milliseconds: zbv, 4 devices, 16 micro-batches,
# profiled costs, V-Min's memory: the 11th is the first undecided)
PROBE_WORK = 1.0  # deterministic seconds the probe at the bound may take at most ...
PROBE_CLIMB = 0.25  # ... and this share of it each probe above
GROUP_TASKS = 1600  # most tasks the relaxation of every device at once models (zbv, 8 devices, 32 micro-batches: 1,536)
GROUP_WORK = 5.0  # deterministic seconds of CP-SAT's work per solve of a group
GROUP_PROBES = 6  # solves per group
GROUP_COUNT = 3  # groups group_bound tries
RELAX_WALL = 60.0  # wall seconds per deterministic second of work a solve may take at most
GRID_EPS = 1e-9  # a value within this many grid steps of a grid point counts as on it (float dust)


def relaxed_bound(problem: Problem, micro_batches: int, upper: Number, floor: Number = 0,
                  work: float = RELAX_WORK, devices: int | None = None) -> Number:
    """The best lower bound of the makespan that the one-device relaxations prove (module doc),
    at least `floor` (a proven bound); `upper` is the makespan of a valid schedule: the proof
    stops there and its horizons start below it (the bound holds whatever `upper` says: it only
    rises by proofs). At most `devices` devices are tried, those whose preemptive bound is highest
    first (then those that start latest); each gets RELAX_PROBES solves of `work` deterministic
    seconds at most (_probes)."""
    p, n = problem.placement, micro_batches
    if tasks(p, n) > bounds.STAGGER_TASKS or \
            all(n * len(p.blocks_on(d)) > RELAX_TASKS for d in range(p.devices)):
        return floor
    memory, rows, fifo, res = _inputs(problem, n, upper)
    best = floor
    for d in _order(p, n, rows, memory)[:devices]:
        if best >= upper - EPS:
            break
        units = _probes(problem, res, n, d, rows, fifo, _down(best, res), _down(upper, res), work)
        best = max(best, snap(units * res))
    return best


def group_bound(problem: Problem, micro_batches: int, upper: Number, floor: Number = 0,
                work: float = GROUP_WORK, groups: int = GROUP_COUNT, clock: Clock | None = None,
                target: Number | None = None) -> Number:
    """The best lower bound of the makespan that the relaxations of several devices at once
    prove (module doc: the group's devices exact, capacity and memory, the others dropped), at
    least `floor`; `upper` is the makespan of a valid schedule (it only sets the horizons). Up to
    `groups` groups (_groups: every device, with every memory limit and with the tip's alone,
    then pairs), each GROUP_PROBES solves of `work` deterministic seconds at most (_bisect), and
    none once `clock` runs out (a solve it cuts short proves less, never a wrong bound). With a
    `target` (a bound that would settle the question asked: a gap), each group first gets one
    solve that would prove it (until one does), then its bisection as above. Seconds to minutes:
    bench/bound_gap.py and a search asked to prove call it, never a default search."""
    p, n = problem.placement, micro_batches
    if tasks(p, n) > bounds.STAGGER_TASKS:
        return floor
    memory, rows, fifo, res = _inputs(problem, n, upper)
    best, todo = floor, _groups(p, n, rows, memory)[:groups]
    # the target's solves first: a bisection halfway whose solve decides nothing would spend the
    # clock below the target on one group (the whole V) where a pair proves the target in seconds
    # (zbv, 4 devices, 16 micro-batches, profiled, V-Min's memory: the tip pair, 49.304 in 17 s)
    goal = None if target is None else math.ceil(target / res - GRID_EPS) - 1
    solves = [] if goal is None else [(g, goal, 1) for g in todo]
    for group, first, probes in solves + [(g, None, GROUP_PROBES) for g in todo]:
        lo = _down(best, res)
        if best >= upper - EPS or (clock is not None and clock.expired()) or (first is not None and lo > first):
            continue
        units = _bisect(problem, res, n, group, rows, fifo, lo, _down(upper, res), work, clock, first, probes)
        best = max(best, snap(units * res))
    return best


@dataclass(frozen=True)
class Group:
    """The devices a relaxation models exactly (one task at a time each) and, of them, those
    whose memory limit it keeps: dropping a limit only loosens the relaxation, and spares its
    reservoir, the largest part of the model."""
    devices: tuple[int, ...]
    memory: tuple[int, ...]


def _groups(p: Placement, n: int, rows: tuple[bounds.Rows, bounds.Rows], memory: bounds.Memory) -> list[Group]:
    """The device groups group_bound tries, in turn: every device (the whole problem with the
    releases, tails and order of micro-batches as cuts) where it has at most GROUP_TASKS tasks,
    first with every memory limit, then with the limit of the device whose first task starts
    latest alone (the tip of a V); the tip alone (relaxed_bound's, asked for more work: zbv, 16
    devices, 48 micro-batches, profiled costs, latency, V-Min's memory, it proves 173.664 in 7 s
    of 40 deterministic s where relaxed_bound's solves prove 173.136); then pairs of adjacent
    devices and the two ends, the pair of the device _order puts first first. On zbv, 8 devices,
    unit costs, V-Min's memory the whole problem proves 97.5 where one device proves 95 (and has
    a valid schedule of 97.5); on 4 devices, profiled costs, 12 micro-batches, the pair at the tip
    proves 39.2 where every device at once proves 38.15 in the same work, one device 37.856; on 6
    devices, 18 micro-batches, with the tip's memory alone every device proves 55.284 in 40
    deterministic s, where with every memory it proves nothing above 54.724 in 200."""
    d, everything = p.devices, tuple(range(p.devices))
    starts = _first_starts(p, rows, everything)
    tip = max(starts, key=lambda x: (starts[x], x), default=d - 1)
    out: list[Group] = []
    if tasks(p, n) <= GROUP_TASKS:
        out += [Group(everything, everything), Group(everything, (tip,))]
    if n * len(p.blocks_on(tip)) <= RELAX_TASKS:
        out.append(Group((tip,), (tip,)))
    if d > 2:
        first = (_order(p, n, rows, memory) or [d - 1])[0]
        pairs = {tuple(sorted((x, x + 1))) for x in (first - 1, first) if 0 <= x < d - 1} | {(0, d - 1)}
        out += [Group(g, g) for g in sorted(pairs, key=lambda g: (first not in g, g))]
    return out


def _bisect(problem: Problem, res: float, n: int, group: Group, rq: tuple[bounds.Rows, bounds.Rows],
            fifo: set[str], lo: int, hi: int, work: float, clock: Clock | None = None, first: int | None = None,
            probes: int = GROUP_PROBES) -> int:
    """The bound the group's relaxation proves, in grid units, between `lo` (proven) and `hi`
    (above it, the relaxation is not worth proving: a valid schedule's makespan). Each probe goes
    halfway between the proven bound and the lowest horizon still open (the first at `first`
    where that is open; `probes` solves at most): nothing below it raises the proven bound past
    it; a schedule found closes every horizon above its makespan (the relaxation's optimum is at
    most that); a solve that decides neither closes the horizons above the one it tried (proofs
    there would take more work)."""
    for _ in range(probes):
        if lo >= hi or (clock is not None and clock.expired()):
            break
        h = first if first is not None and lo <= first < hi else (lo + hi) // 2
        first = None
        status, bound, found = _solve(problem, res, n, group.devices, rq, fifo, h, lo, work, clock, group.memory)
        log.info("relaxation of devices %s, memory of %s, below %d: %s, bound %d", group.devices, group.memory, h,
                 status, bound)
        lo = max(lo, bound)
        if status != "infeasible":
            hi = min(h, found if found is not None else h)
    return lo


def _inputs(problem: Problem, n: int, upper: Number) -> tuple[bounds.Memory, tuple[bounds.Rows, bounds.Rows],
                                                               set[str], float]:
    """What every relaxation reads: the memory holds, every task's least release and tail (in
    full: RELAX_TERM_WORK), the blocks taken in micro-batch order and the grid."""
    p = problem.placement
    memory = problem.real_holds()
    rows = (bounds.staggered_releases(p, n, memory, bounds.RELAX_TERM_WORK),
            bounds.staggered_tails(p, n, memory, bounds.RELAX_TERM_WORK))
    return memory, rows, set(fifo_blocks(problem)), grid(p, upper)


def tasks(p: Placement, n: int) -> int:
    """(task, device) pairs of n micro-batches: what the relaxations' size limits count."""
    return n * sum(len(b.devices) for b in p.blocks)


def event_pairs(problem: Problem, n: int) -> int:
    """Pairs of memory events in each device's reservoir of n micro-batches (_reservoir: two a
    memory pair, else one a memory block), summed over the devices: what CP-SAT expands."""
    if problem.limit is None:
        return 0
    pairs = [problem.memory_pairs(d) for d in range(problem.placement.devices)]
    return sum((n * (2 * len(x) if x is not None else len(problem.memory_blocks(d)))) ** 2 for d, x in enumerate(pairs))


def grid(p: Placement, upper: Number) -> float:
    """The relaxation's time step: the largest that divides every duration and the latency
    (as fractions of denominator up to 10**6: 0.004 for 0.5, 0.488, 0.252 and 0.032), unless
    the horizon would take more than RELAX_UNITS of it; then the horizon / RELAX_UNITS, the
    durations rounded down to it (still a relaxation, a little weaker). Few units keep the
    solves short: the search's binary grid of the same durations (2**-11) stalled them."""
    values = [Fraction(v).limit_denominator(10**6) for v in [b.duration for b in p.blocks] + [p.latency] if v]
    step = Fraction(math.gcd(*(v.numerator for v in values)), math.lcm(*(v.denominator for v in values)))
    return max(float(step), float(upper) / RELAX_UNITS)


def _order(p: Placement, n: int, rows: tuple[bounds.Rows, bounds.Rows], memory: bounds.Memory) -> list[int]:
    """The devices small enough to model, highest preemptive bound first, then those whose first
    release is furthest from the middle of all devices' (the ends of the pipeline: the tip of a V,
    whose round trips split its work, and the first device of a loop, whose last backward comes
    back through all the others), the later first: only the order in which the budget is spent
    (every device's relaxation is a bound)."""
    pre = bounds.device_bounds(p, n, memory, rows, ramp=False)  # the one-machine bound: where a device's tasks crowd
    small = [d for d in pre if n * len(p.blocks_on(d)) <= RELAX_TASKS]
    first = _first_starts(p, rows, small)
    mid = (max(first.values(), default=0.0) + min(first.values(), default=0.0)) / 2
    return sorted(small, key=lambda d: (-pre[d], -abs(first[d] - mid), -first[d], d))


def _first_starts(p: Placement, rows: tuple[bounds.Rows, bounds.Rows], devices: Sequence[int]) -> dict[int, float]:
    """The least release of each device's first task (of those with tasks): the tip of a V
    starts latest."""
    return {d: min(float(rows[0][b.id][0]) for b in p.blocks_on(d)) for d in devices if p.blocks_on(d)}


def _down(x: Number, res: float) -> int:
    return math.floor(float(x) / res + GRID_EPS)


def _probes(problem: Problem, res: float, n: int, d: int, rq: tuple[bounds.Rows, bounds.Rows], fifo: set[str],
            lo: int, hi: int, work: float) -> int:
    """The bound device d's relaxation proves, in grid units, between `lo` (proven) and `hi`
    (a relaxed schedule of that makespan exists: the image of a valid one). Each probe solves
    the relaxation below a horizon h: with nothing below h, h + 1 is proven; otherwise the
    solve's own bound holds and its schedule lowers hi. A probe goes just below hi after a
    schedule is found (one infeasibility proves it optimal), else halfway."""
    just_below = True  # a schedule was just found: is it the relaxation's optimum?
    for _ in range(RELAX_PROBES):
        if lo >= hi:
            break
        h = hi - 1 if just_below else (lo + hi) // 2
        status, bound, found = _solve(problem, res, n, (d,), rq, fifo, h, lo, work)
        log.info("relaxation of device %d below %d: %s, bound %d", d, h, status, bound)
        lo = max(lo, bound)  # h + 1 where nothing fits below h
        if found is not None:
            hi, just_below = found, True
        elif status == "infeasible" or just_below:
            just_below = False
        else:  # neither a schedule nor a proof halfway: give up on this device
            break
    return lo


def _solve(problem: Problem, res: float, n: int, group: tuple[int, ...], rq: tuple[bounds.Rows, bounds.Rows],
           fifo: set[str], horizon: int, floor: int, work: float,
           clock: Clock | None = None, memory: Sequence[int] | None = None) -> tuple[str, int, int | None]:
    """The relaxation of the devices of `group` (with the memory limits of `memory`, default
    the group's) with every task ending by `horizon` (grid units), its makespan at least `floor`:
    the solve's status, its proven bound and the makespan it found (or None)."""
    built = _model(problem, res, n, group, rq, fifo, horizon, floor, memory)
    if built is None:
        return "infeasible", horizon + 1, None
    # one worker and a budget of deterministic work: the same bound every run; the wall clock
    # only guards against a machine so loaded that the work never ends (and a search's own end)
    wall = Clock(RELAX_WALL * work) if clock is None else clock.within(RELAX_WALL * work)
    out = built[0].solve(wall, 1, phase=f"relaxation of {group}", work=work, presolve=False)
    if out.status == "infeasible":
        return out.status, horizon + 1, None
    return out.status, max(floor, out.bound or floor), out.objective


def _model(problem: Problem, res: float, n: int, group: tuple[int, ...], rq: tuple[bounds.Rows, bounds.Rows],
           fifo: set[str], horizon: int, floor: int,
           memory: Sequence[int] | None = None) -> tuple[Model, dict[Key, Expr]] | None:
    """The relaxation of `group`'s devices below `horizon`, minimising its makespan (at least
    `floor`), and its start variables; None when a task alone cannot end by the horizon. Every
    task on the group's devices is modelled, with the memory limits of the devices `memory`
    names (default: the group's); the other devices are dropped, their tasks left as the delays
    between the group's (_delays)."""
    p = problem.placement
    r, q = rq
    m = Model()
    # where the makespan and the no-overlaps stand among the constraints steers CP-SAT's search
    # under a budget of work: one device as its bounds were measured (makespan first, no-overlap
    # before the delays: 48.744 on zbv, 4 devices, 16 micro-batches, profiled, V-Min's memory, 45.84
    # otherwise), a group as its own were
    one = len(group) == 1
    makespan = m.aux_var("makespan", floor, horizon) if one else None
    ends: list[Expr] = []
    start: dict[Key, Expr] = {}
    blocks = [b for b in p.blocks if set(b.devices) & set(group)]
    for b in blocks:
        dur, ordered = _down(b.duration, res), b.id in fifo
        for k in range(n):
            own = k if ordered else 0  # the k-th in time order is micro-batch k's
            lo, tail = _down(r[b.id][own], res), _down(q[b.id][n - 1 - own if ordered else 0], res)
            if lo > horizon - dur - tail:  # this task alone cannot end by the horizon
                return None
            s = start[(b.id, k)] = m.int_var((b.id, k), lo, horizon - dur - tail)
            m.occupy(s, dur, [d for d in b.devices if d in group])
            if makespan is not None:
                m.at_most(s + dur + tail, makespan)
            ends.append(s + dur + tail)
            if k and ordered:
                m.precede(start[(b.id, k - 1)], s, dur)
    if one:
        m.close_devices()
    for (x, y), gap in _delays(p, [b.id for b in blocks], prune=not one).items():
        for k in range(n):
            m.precede(start[(x, k)], start[(y, k)], _down(gap, res))
    for d in group if memory is None else memory:
        _reservoir(m, problem, res, d, n, start)
    m.minimize(makespan if makespan is not None else m.latest("makespan", floor, horizon, ends))
    return m, start


def _reservoir(m: Model, problem: Problem, res: float, d: int, n: int, start: Mapping[Key, Expr]) -> None:
    """Rule 4 on device d, every event of every micro-batch (memory units of the problem). Each
    allocation goes next to its micro-batch's release where the memory pairs up (memory_pairs):
    the same constraint, but CP-SAT proved the V's bounds with these in a fraction of the work."""
    if problem.limit is None:
        return

    def end(b: str, k: int) -> Expr:
        return start[(b, k)] + _down(problem.placement.by_id[b].duration, res)
    pairs = problem.memory_pairs(d)
    events: list[tuple[Expr, int]] = []
    if pairs is not None:
        events = [e for a, r, x in pairs for k in range(n) for e in ((start[(a, k)], x), (end(r, k), -x))]
    else:  # allocations at starts, releases at ends
        events = [(start[(b.id, k)] if x > 0 else end(b.id, k), x) for b in problem.placement.blocks_on(d)
                  if (x := problem.memory[b.id]) for k in range(n)]
    m.reservoir([t for t, _ in events], [x for _, x in events], problem.cap(d))


def _delays(p: Placement, kept: Sequence[str], prune: bool = True) -> dict[tuple[str, str], Number]:
    """Least time from the start of a to the start of b, both among the `kept` blocks, one
    micro-batch: the longest path, durations and latencies along it. With `prune`, a pair whose
    path runs through another kept block at no loss is left out: the two pairs through it imply
    it (a group's thousands of pairs; one device keeps them all, as its bounds were measured)."""
    dist: dict[str, dict[str, Number]] = {}
    for a in kept:
        far: dict[str, Number] = {a: 0}
        for x in p.topo_order:
            if x in far:
                for y in p.succs[x]:
                    far[y] = max(far.get(y, 0), far[x] + p.by_id[x].duration + p.edge_latency(x, y))
        dist[a] = {b: far[b] for b in kept if b != a and b in far}  # in kept's order: the same model every run
    return {(a, b): g for a, row in dist.items() for b, g in row.items()
            if not prune or not any(b in dist[z] and row[z] + dist[z][b] >= g - EPS for z in row if z != b)}


@dataclass(frozen=True)
class Probed:
    """What probe_starts found: the shortest schedule of the relaxation (grid units, None if
    none) and its makespan there, and the bound its probes proved (real time)."""
    starts: dict[Key, int] | None
    makespan: int | None
    bound: Number


def probe_starts(problem: Problem, n: int, hint: Mapping[Key, Number], floor: Number, clock: Clock,
                 work: float, probes: int = PROBE_COUNT, top: bool = False) -> Probed:
    """Schedules of the relaxation of every device at once (cut_starts' model, hinted by a valid
    schedule's real starts: its values lead CP-SAT's first dives, though they end past the
    horizon) searched from the proven bound `floor` up to the hint's makespan: the first probe
    asks for the bound itself, the next ones climb from the lowest horizon still open in steps
    that double, and once a schedule is found go halfway between that horizon and it, until one
    decides nothing. Below the optimum propagation alone often refutes a horizon at no
    cost (the proven bound rises: an infeasible horizon is a proof, module doc); at a bound that
    is the optimum the horizon steers CP-SAT straight to it, where a descent from a long hint
    takes many times the work (interleaved-zb, 16 devices, 32 micro-batches, unit costs, latency
    0.5, torch's ScheduleInterleavedZeroBubble's memory: 141.5, the bound, in 0.3 deterministic
    s; the descent from the search's 154 needed 25). At most `work` deterministic seconds in all,
    PROBE_WORK the probe at the bound and a PROBE_CLIMB share of it each one above, on one
    worker, and the clock.

    `top` (beyond PROBE_TASKS tasks): every probe halves the range between the lowest horizon still
    open and the best schedule, and an undecided one only moves that horizon above itself. There
    the probe at the bound can take minutes where one halfway down finds a schedule in a second:
    interleaved-zb, 16 devices, 48 micro-batches, unit costs, latency 0.5, torch's
    ScheduleInterleavedZeroBubble's memory: the probe below 190 (the bound 189.5) undecided after 5
    deterministic s (165 s of wall time), the one below 197 finds 197 in 0.7 s against the search's 204.5.

    Each memory reservoir stays one constraint with its own propagator (Model.solve's
    expand=False), where CP-SAT would add a literal and a precedence per pair of its events: on
    these models a search node costs a fraction of the expanded one's. The probe at the bound
    on interleaved-zb, 6 devices, 24 micro-batches, unit costs, latency 0.5, torch's
    ScheduleInterleavedZeroBubble's memory finds 87.5, the bound, in 3.6 s of wall time (0.28
    deterministic s) where the expanded model took 6.9 s (0.98), more than a 20 s search gives
    it; at 16 devices, 32 micro-batches, 3.3 s against 12.4 s. Below the optimum it refutes
    further in the same work (zbv, 4 devices, 16 micro-batches, profiled costs, V-Min's memory:
    46.896 where the expanded probes stopped at 46.38). The bound solves (_solve) and the
    descent (cut_starts) keep the expansion: without it one device's relaxation proves less
    (zbv, 4 devices, 12 micro-batches, profiled, V-Min's memory: 36.756 against 37.856) and the
    descent came out 0.4-1.4% longer on four interleaved-zb rows with profiled costs."""
    p = problem.placement
    t0, upper = _span(p, hint)
    _, rows, fifo, res = _inputs(problem, n, upper)
    lo, hi = _down(floor, res), _down(upper, res)
    starts, found, left, step, first = None, None, work, 0, None if top else lo
    seek = lo  # the lowest horizon still open: lo, or above an undecided probe (top)
    for _ in range(probes):
        if seek >= hi or left <= 0 or clock.expired():
            break
        h = min(seek + step, hi - 1) if found is None and not top else (seek + hi) // 2
        step = max(1, 2 * step)
        built = _model(problem, res, n, tuple(range(p.devices)), rows, fifo, h, lo)
        if built is None:  # a task alone cannot end by h
            lo = seek = h + 1
            continue
        built[0].hints({k: _down(v - t0, res) for k, v in hint.items()})
        done = work_done()
        # a probe above the bound gets a share of the work: where the optimum is far above the bound
        # (V-Min's memory, profiled costs: 5-13%) the one that decides nothing takes the descent's time
        cap = PROBE_WORK if h == first else PROBE_WORK * PROBE_CLIMB
        out = built[0].solve(clock, 1, phase=f"probe below {h}", work=min(left, cap), presolve=False,
                             probing=False, lp=False, expand=False, first=top)
        left -= work_done() - done
        if out.status == "infeasible":
            lo = seek = h + 1
        elif out.found and out.objective is not None:
            hi, starts, found = out.objective, out.starts(), out.objective
        else:  # undecided: the horizons above are the descent's (cut_starts) to work on, or the next probe's (top)
            lo = max(lo, out.bound or lo)
            if not top:
                break
            seek = max(lo, h + 1)
    return Probed(starts, found, max(floor, snap(lo * res)))


def cut_starts(problem: Problem, n: int, hint: Mapping[Key, Number], floor: Number, clock: Clock,
               workers: int | None, work: float) -> dict[Key, int] | None:
    """A schedule of the relaxation of every device at once (the whole problem with the
    releases, tails and micro-batch order as cuts, module doc) no longer than the `hint` (a valid
    schedule's real starts, each block taking its micro-batches in order: polish.in_order),
    in the relaxation's grid units (`grid`), or None: at most `work` deterministic seconds.
    Where the grid is exact (no duration rounded down) its per-device orders replay to a valid
    schedule no longer than it; the caller replays them."""
    p = problem.placement
    if tasks(p, n) > GROUP_TASKS:
        return None
    t0, upper = _span(p, hint)
    _, rows, fifo, res = _inputs(problem, n, upper)
    built = _model(problem, res, n, tuple(range(p.devices)), rows, fifo, _down(upper, res), _down(floor, res))
    if built is None:
        return None
    m, start = built
    m.hints({k: _down(v - t0, res) for k, v in hint.items()})
    out = m.solve(clock, workers, phase="relaxation of every device", work=work, probing=False)
    return out.starts() if out.found else None


def _span(p: Placement, starts: Mapping[Key, Number]) -> tuple[Number, Number]:
    """A schedule's first start and its makespan from there."""
    t0 = min(starts.values())
    return t0, max(t - t0 + p.by_id[b].duration for (b, _), t in starts.items())

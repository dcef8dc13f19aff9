"""Order polish on the real durations: pull a task that was ready into the idle gap before it.

The repetend and the completion are solved on an integer grid; with fractional costs and edge
latency the grid rounds every block up, and a completion solve stopped on a stall leaves idle
gaps in the warm-up and the cool-down. Replayed on the real durations (orders kept), such a gap
often has a task behind it on the same device whose inputs were ready before the task after the
gap ends: a ZB-V-like warm-up needs the forward of the next micro-batch or a pending W run there, not the
task the grid's order put first.

First every block takes its micro-batches in increasing order (a solver's warm-up often starts
them scrambled, each overtaking costing a latency and a wait), when that is better. Then one
move takes such a task (single-device, at most LOOKAHEAD places later) and puts it in front of
the task after the gap; the orders are replayed as early as they allow (tessel.timing) and the move
is kept when the makespan, then the sum of the task ends (a sink's, a W's, weighing SINK_WEIGHT),
gets smaller and no device's memory goes over its limit (memory depends on the order only: a
device allocates at a task's start and frees at the end of an earlier one, so the level along its
order is a running sum). When no gap move helps, a task on the critical path that waited for its
device (not for its inputs) jumps a few places earlier on it (the job shop's critical-path
neighbourhood); then a sink that held up the task after it moves a few places later (ZB's deferred
W: the cool-down's B passes run back to back and the W passes fill its bubbles). The moves are
one list per schedule, scanned from the first gap again after each kept move until that stalls
(RESTART_STALL replays without a shorter makespan), then from where the last kept move was
found: starting over replays the moves that had just failed, going round alone settles early
(on zbv-4 with profiled costs each left some rows 1-1.5% above ZB-V's where the two in turn
came within 1% of it on every row tried, on the same budget). The walk repeats until no move helps or
its budget is spent; every kept schedule is validated by the four rules. Replays run on
search/replay.py (the same floats as tessel.timing, without its heap: 4-7x faster).
The repetend is kept when the polished schedule still unrolls with it, dropped otherwise (the
schedule is still the one for its micro-batches).

The walk's budget is work, not time: at most `work` tasks replayed in all (a replay of the whole
schedule costs its task count), so the same schedule comes back on a loaded machine, later. The
deadline is only a safety net for the search's time limit (only a polish cut by it can differ
between runs, as with a solve cut by CP-SAT's time limit).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS, Schedule, ScheduleError
from ..timing import order_peak, orders_of, settled
from .replay import Replayer

log = logging.getLogger(__name__)
LOOKAHEAD = 24  # places later a task may come from
JUMP = 4  # places earlier a critical task may jump
RESTART_STALL = 150  # replays without a shorter makespan before the scan goes round instead of starting over
MOST_TASKS = 20_000  # above this many tasks one replay costs too much for the walk to pay
WORK = 2_000_000  # tasks replayed in all by default, some 2-5 s on one core (a search passes Budget.order_budget)
STALL = 500  # replays without a shorter makespan before the walk stops (Budget.order_stall)
# a sink (a W: nothing waits for it) ending later costs only this much of the tie-break: running
# one after the task it held up (ZB's deferred W) is then a gain, not a loss of the same size
SINK_WEIGHT = 0.01


@dataclass(frozen=True)
class _State:
    orders: list[list[Key]]
    start: dict[Key, Number]
    makespan: Number
    ends: Number  # the task ends summed (sinks weigh SINK_WEIGHT): shorter warm-ups show here first


class Work:
    """The walk's budget, one for several walks (the search's seeds share it): `tasks` replayed
    in all (a replay costs the schedule's task count), and `stall` replays since the makespan last
    got shorter in the walk at hand (only a shorter makespan is kept; on the
    library placements each step down came within 70 replays of the last); both deterministic.
    The wall-clock deadline of the search's time limit, on `now`'s clock, is only a safety net."""

    def __init__(self, tasks: int, stall: int, deadline: float, now: Callable[[], float]) -> None:
        self.left, self.stall, self.deadline, self.now = tasks, stall, deadline, now
        self.since = self.replays = 0
        self.replayer: Replayer | None = None

    def going(self) -> bool:
        return self.left > 0 and self.since < self.stall and self.now() < self.deadline

    def replay(self, p: Placement, n: int, orders: list[list[Key]]) -> _State | None:
        """The orders replayed as early as they allow, charged to the budget; None on a deadlock."""
        self.left -= n * len(p.blocks)
        self.since += 1
        self.replays += 1
        if self.replayer is None or self.replayer.p is not p or self.replayer.n != n:
            self.replayer = Replayer(p, n)
        got = self.replayer.timed(orders, SINK_WEIGHT)
        return None if got is None else _State(orders, *got)


def polish(s: Schedule, work: int | Work = WORK, stall: int = STALL, deadline: float = math.inf,
           now: Callable[[], float] = time.perf_counter) -> Schedule:
    """`s` with idle gaps filled by later ready tasks, replaying at most `work` tasks in all and
    `stall` times since the makespan last got shorter (and stopping at `deadline` on `now`'s
    clock, the search's time limit); `s` itself when no move makes it shorter. A `Work` passed
    as `work` is the budget left of earlier walks (its own stall and deadline)."""
    p, n = s.placement, s.micro_batches
    budget = work if isinstance(work, Work) else Work(work, stall, deadline, now)
    budget.since = 0
    if n * len(p.blocks) > MOST_TASKS or not budget.going():
        return s
    cur = budget.replay(p, n, orders_of(s))
    if cur is None:
        return s
    moves = 0
    fifo = budget.replay(p, n, in_order(orders_of(s)))
    if fifo is not None and _better(fifo, cur):
        cur, moves = fifo, 1
    at, rotate = 0, False
    while budget.going():
        if not rotate and budget.since >= RESTART_STALL:  # the scan from the first gap stalled
            rotate, budget.since = True, 0
        got = _improve(p, n, cur, s.memory_limit, budget, at)
        if got is None:  # no move helps (either scan tries them all)
            break
        nxt, at = got
        at = at if rotate else 0
        if nxt.makespan < cur.makespan - EPS:
            budget.since = 0
        cur, moves = nxt, moves + 1
    log.info("polish: %d moves in %d replays (%d tasks of work left)", moves, budget.replays, budget.left)
    if moves == 0 or cur.makespan >= s.makespan - EPS:
        return s
    log.info("polish: makespan %s -> %s", s.makespan, cur.makespan)
    return _rebuilt(s, cur)


def in_order(orders: list[list[Key]]) -> list[list[Key]]:
    """Every block takes its micro-batches in increasing order, each device keeping the places of
    its blocks (so its memory along the order is unchanged). Micro-batches are interchangeable,
    but a solver's warm-up often starts them in a scrambled order per block, and each overtaking
    waits for the latency and the upstream device twice."""
    out = []
    for order in orders:
        mbs: dict[str, list[int]] = {}
        for b, m in order:
            mbs.setdefault(b, []).append(m)
        for ms in mbs.values():
            ms.sort(reverse=True)
        out.append([(b, mbs[b].pop()) for b, _ in order])
    return out


def _improve(p: Placement, n: int, cur: _State, limit: Sequence[Number] | None, budget: Work,
             at: int) -> tuple[_State, int] | None:
    """The first move that makes the schedule better, scanning the moves (_moves) from place `at`
    round to the one before it, and the place it was found at (the next scan starts there: the
    moves before it failed on a schedule that differs from this one only after the change, so
    starting over from the first gap replays them for nothing); None when none does (or the
    budget is spent)."""
    moves = _moves(p, cur)
    for k in range(len(moves)):
        i = (at + k) % len(moves)
        d, src, dst = moves[i]
        order = cur.orders[d]
        moved = order[:src] + order[src + 1:]
        moved.insert(dst, order[src])
        if limit is not None and order_peak(p, moved) > limit[d] + EPS:
            continue
        if not budget.going():
            return None
        new = budget.replay(p, n, [moved if e == d else o for e, o in enumerate(cur.orders)])
        if new is not None and _better(new, cur):
            return new, i
    return None


def _moves(p: Placement, cur: _State) -> list[tuple[int, int, int]]:
    """(device, from, to): a task taken from place `from` of the device's order and put at place
    `to`. First a ready single-device task (at most LOOKAHEAD places later) into each idle gap,
    earliest gap first; then a task on the critical path that waited for its device (not for its
    inputs) up to JUMP places earlier (the job shop's critical-path neighbourhood); then a sink (a
    W) that held up the task after it up to JUMP places later (ZB's deferred W: the cool-down's B
    passes run back to back and the W passes fill its bubbles)."""
    by = p.by_id
    end = {k: t + by[k[0]].duration for k, t in cur.start.items()}
    gaps = sorted((end[order[i - 1]], d, i) for d, order in enumerate(cur.orders) for i in range(1, len(order))
                  if cur.start[order[i]] > end[order[i - 1]] + EPS)
    ready: dict[Key, Number] = {}  # a task's inputs ready, once per schedule (a task is in many gaps' reach)
    out = []
    for _, d, i in gaps:
        order = cur.orders[d]
        for j in range(i + 1, min(i + 1 + LOOKAHEAD, len(order))):
            if len(by[order[j][0]].devices) == 1:
                r = ready[order[j]] if order[j] in ready else ready.setdefault(order[j], _ready(p, *order[j], end))
                if r < end[order[i]] - EPS:
                    out.append((d, j, i))
    out += [(d, i, k) for d, i in _critical_arcs(p, cur, end) for k in range(i - 1, max(i - 1 - JUMP, -1), -1)]
    for d, order in enumerate(cur.orders):
        out += [(d, i, k - 1) for i in range(len(order) - 1)
                if not p.succs[order[i][0]] and p.succs[order[i + 1][0]] and cur.start[order[i + 1]] <= end[order[i]] + EPS
                for k in range(i + 2, min(i + 2 + JUMP, len(order) + 1))]
    return out


def _critical_arcs(p: Placement, cur: _State, end: dict[Key, Number]) -> list[tuple[int, int]]:
    """(device, place) of each single-device task on the critical path that started when the task
    before it on its device ended (its inputs may have arrived just then too), from the end backwards."""
    by = p.by_id
    place = {(k, d): i for d, order in enumerate(cur.orders) for i, k in enumerate(order)}
    x = max(end, key=lambda k: end[k])
    out = []
    while cur.start[x] > EPS:
        b, m = x
        at = cur.start[x]
        prev = [(d, place[(x, d)]) for d in by[b].devices if place[(x, d)] > 0
                and end[cur.orders[d][place[(x, d)] - 1]] >= at - EPS]
        if prev and len(by[b].devices) == 1:  # waited for its device (maybe its inputs too, on a tie)
            out.append(prev[0])
        ready = max(((end[(a, m)] + p.edge_latency(a, b), (a, m)) for a in p.preds[b]), default=None)
        if ready is not None and ready[0] >= at - EPS:
            x = ready[1]
        elif prev:
            d, i = prev[0]
            x = cur.orders[d][i - 1]
        else:
            break
    return out


def _better(a: _State, b: _State) -> bool:
    """A shorter makespan, or the same one with task ends earlier in sum."""
    return a.makespan < b.makespan - EPS or (a.makespan <= b.makespan + EPS and a.ends < b.ends - EPS)


def _ready(p: Placement, b: str, m: int, end: dict[Key, Number]) -> Number:
    return max((end[(a, m)] + p.edge_latency(a, b) for a in p.preds[b]), default=0)


def _rebuilt(s: Schedule, cur: _State) -> Schedule:
    """The polished schedule, validated, with `s`'s repetend moved onto it where it still unrolls."""
    p, n = s.placement, s.micro_batches
    meta = dict(s.meta)
    try:
        plain = settled(p, n, cur.start, s.memory_limit, None, meta)  # float dust settled (tessel.dust)
    except ScheduleError as e:
        log.info("polish dropped: %s", e)
        return s
    rep = s.repetend
    if rep is not None:
        kept = _with_window(s, plain)
        if kept is not None:
            return kept
    return plain.with_meta(repetend="none") if rep is not None else plain


def _with_window(s: Schedule, plain: Schedule) -> Schedule | None:
    """`plain` with `s`'s repetend window, moved by how far its first task moved, if it unrolls."""
    rep = s.repetend
    assert rep is not None
    first = min((t for t in s.tasks if t.start >= rep.start - EPS), key=lambda t: (t.start, t.micro_batch, t.block))
    shift = plain.start[(first.block, first.micro_batch)] - first.start
    window = type(rep)(rep.period, rep.start + shift, rep.end + shift)
    cand = Schedule.build(plain.placement, plain.micro_batches, plain.start, plain.memory_limit, window,
                          plain.meta, check=False)
    kernel = cand.kernel()
    if kernel is None:
        return None
    try:
        cand.unroll(cand.micro_batches + max(1, kernel.shift))
    except ScheduleError:
        return None
    return cand

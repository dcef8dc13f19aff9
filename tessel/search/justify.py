"""Forward-backward improvement (double justification) of a whole schedule, for mode fast.

At 32 devices and more the warm-up and cool-down of a constructed repetend span tens of
micro-batches, far more than a completion solve can free, and the plain unroll leaves devices
idle there: a device waits for its first backward with memory to spare for more forwards, and
at the end the weight passes are not kept back to fill the drain. Justification fixes both
without a solver, by list scheduling the whole problem twice:

- backward: the time-reversed problem (edges reversed, every allocation a release and every
  release an allocation, micro-batch m numbered N-1-m) is list scheduled with the tasks that
  end last first; read back, every task runs as late as the others allow, so the cool-down is
  packed (ZB-H2's deferred weight passes come out of this, found, not copied);
- forward: the problem itself, the tasks that start first in the backward result first: the
  warm-up is packed too.

The list scheduler keeps memory by reservation as tessel.baselines.engine does (so it never
deadlocks and never passes a limit), with releases given back as they end (Pools.release_early).
On placements whose blocks each run on one device (the pipelines, V and X shapes) it is the
walk below, about twice as fast as the engine's (which handles blocks on several devices and
runs the others); both take the same decisions there. The rounds are a fixed budget of work
(JUSTIFY_ROUNDS at most, fewer where the search's limit says so: Budget.justify_rounds; stopping
at the first round that improves nothing or at the proven bound), not a wall clock, so the same inputs give the same schedule on a loaded
machine. In the RCPSP literature: Valls, Ballestin and Quintanilla, EJOR 165 (2005).
"""
from __future__ import annotations

import heapq
import logging
from collections.abc import Hashable, Mapping
from dataclasses import replace

from ..baselines.engine import Pools, list_schedule, memory_need, one_group
from ..key import Key
from ..placement import Number, Placement
from ..timing import DeadlockError
from .completion import compact, makespan, plain_unroll
from .modulo import Modulo, fits
from .problem import Problem

log = logging.getLogger(__name__)
# backward-forward rounds at most (each two walks of N x blocks tasks; the caller's budget may allow
# fewer): at 32 devices and N = 128 the first round gives most of the gain (zbv 892 -> 805, bound 799;
# the next three 805 -> 799), and each walk costs a few tenths of a second there
JUSTIFY_ROUNDS = 4
JUSTIFY_TASKS = 40_000  # justification runs up to this many tasks (N x blocks): a walk is linear in them
# listed_repetend: unrolls of this many micro-batches justified (one round each) until a window at the load
# bound shows, and at most this many tasks (zbv-4 with profiled costs settled at 32, not at 16 or 24)
LISTED_MICRO_BATCHES = (24, 32, 48)
LISTED_TASKS = 10_000
LISTED_COPIES = 8  # micro-batches per repetend read off at most (the fewest that give one are kept)
Starts = Mapping[Key, int]


def justified(problem: Problem, micro_batches: int, starts: Starts, bound: int = 0,
              rounds: int = JUSTIFY_ROUNDS) -> dict[Key, int] | None:
    """The grid starts after at most `rounds` justification rounds from `starts` (grid starts
    of all N micro-batches), stopping at `bound` (a makespan that cannot be improved), when
    shorter than `starts`; None when not, or when the walk cannot run (no round, too many
    tasks, memory that does not balance per device, a limit below a micro-batch's reservation)."""
    n, units = micro_batches, problem.units
    pools = _pools(units, problem, n)
    if rounds < 1 or pools is None or n * len(units.blocks) > JUSTIFY_TASKS or not _balanced(units):
        return None
    back = reversed_placement(units)
    back_pools = _pools(back, problem, n)
    if back_pools is None:
        return None
    first = makespan(problem, starts)
    best, length = dict(starts), first
    for _ in range(min(rounds, JUSTIFY_ROUNDS)):
        if length <= bound:
            break
        try:
            late = _backward(problem, back, back_pools, n, best)
            tops = [(makespan(problem, late), late)]
            if tops[0][0] > bound:
                early = _forward(problem, pools, n, late)
                tops.insert(0, (makespan(problem, early), early))
        except DeadlockError as e:  # the reservations rule it out: a bug, but the search goes on
            log.warning("justification stopped: %s", e)
            break
        top, starts_top = min(tops, key=lambda x: x[0])  # the forward one among equals
        if top >= length:
            break
        best, length = starts_top, top
    if length >= first:
        return None
    log.info("justification: makespan %d -> %d (grid)", first, length)
    return best


def listed_repetend(problem: Problem, seed: Modulo) -> Modulo | None:
    """A repetend read off the steady state of the justified unroll of `seed` (the list
    scheduler settles into one, often at the load bound where no construction fits memory, as on
    V and looped placements with fractional costs): the middle micro-batches' windows that
    repeat without overlap and fit memory, the least period per micro-batch (then span) first;
    None when no window does or the walk cannot run. It beats `seed` only by luck: the caller
    keeps the better. A handful of linear walks, no solver."""
    best = None
    for n in LISTED_MICRO_BATCHES:
        if n * len(problem.block_ids) > LISTED_TASKS:
            break
        starts = justified(problem, n, compact(problem, n, plain_unroll(seed, n)), 0, 1)
        for mod in _windows(problem, n, starts) if starts is not None else ():
            if best is None or (mod.per_micro_batch, mod.span(problem)) < (best.per_micro_batch, best.span(problem)):
                best = mod
        if best is not None and best.per_micro_batch <= problem.period_floor:
            break
    return best


def best_window(problem: Problem, n: int, starts: Starts) -> Modulo | None:
    """The repetend of least period per micro-batch (then span) read off the middle of a
    schedule of `n` micro-batches (`_windows`), or None."""
    return min(_windows(problem, n, starts), key=lambda m: (m.per_micro_batch, m.span(problem)), default=None)


def _windows(problem: Problem, n: int, starts: Starts) -> list[Modulo]:
    """The valid repetends in the middle third of a schedule: for c copies (a looped pipeline's
    list schedule cycles through p micro-batches), micro-batches k..k+c-1 repeated every c
    load bounds, or every time micro-batch k + c is shifted by (their dependencies hold as they
    did in the schedule; devices and memory are checked)."""
    first, out = problem.block_ids[0], []
    for c in range(1, min(LISTED_COPIES, n // 3) + 1):
        for k in range(n // 3, 2 * n // 3 - c):
            pattern = {(b, j): starts[(b, k + j)] for b in problem.block_ids for j in range(c)}
            for period in sorted({c * problem.period_bound, starts[(first, k + c)] - starts[(first, k)]}):
                mod = Modulo.from_starts(period, pattern, c) if period >= c * problem.period_bound else None
                if mod is not None and no_overlap(problem, mod) and fits(problem, mod):
                    out.append(mod)
                    break
        if any(mod.per_micro_batch <= problem.period_floor for mod in out):
            break
    return out


def no_overlap(problem: Problem, mod: Modulo) -> bool:
    """No two tasks of a device overlap modulo the period (the repetend's device rule)."""
    busy: dict[int, list[tuple[int, int]]] = {}
    for (b, _), r in mod.phase.items():
        for d in problem.devices_of[b]:
            busy.setdefault(d, []).append((r, problem.duration[b]))
    for spans in busy.values():
        spans.sort()
        for (r, d), (q, _) in zip(spans, spans[1:] + [(spans[0][0] + mod.period, 0)]):
            if q - r < d:
                return False
    return True


_no_overlap = no_overlap  # the old private name (branches written against it)


def reversed_placement(p: Placement) -> Placement:
    """The same blocks in reversed time: edges reversed, memory negated (an allocation at a
    start becomes a release at an end read backwards). Latency is symmetric."""
    blocks = tuple(replace(b, memory=-b.memory) for b in p.blocks)
    return Placement(f"{p.name}-reversed", p.devices, blocks, tuple((b, a) for a, b in p.edges), p.latency)


def _balanced(p: Placement) -> bool:
    """Every device frees what one micro-batch allocates on it: then the reversed problem starts
    from empty memory too, and its walk's limits are the real ones."""
    return all(sum(b.memory for b in p.blocks_on(d)) == 0 for d in range(p.devices))


def _pools(p: Placement, problem: Problem, n: int) -> Pools | None:
    """One pool per device capped at its limit, releases given back early; None when a pool
    cannot let one micro-batch through (its reservation is over the limit)."""
    group = one_group(p)
    if problem.limit is None:
        return Pools(group, {}, release_early=True)
    caps: dict[tuple[int, Hashable], Number] = {}
    for (d, g), need in memory_need(p, n, group).items():
        if need > problem.limit[d]:
            return None
        caps[(d, g)] = problem.limit[d]
    return Pools(group, caps, release_early=True)


def _backward(problem: Problem, back: Placement, pools: Pools, n: int, starts: Starts) -> dict[Key, int]:
    """Every task as late as the others allow: the reversed problem, latest end first."""
    dur = problem.duration
    end = {(b, n - 1 - m): s + dur[b] for (b, m), s in starts.items()}  # numbered as in `back`
    horizon = max(end.values())
    out = _walk(back, n, {key: horizon - e for key, e in end.items()}, pools)
    last = max(v + dur[b] for (b, _), v in out.items())
    return {(b, n - 1 - m): last - (v + dur[b]) for (b, m), v in out.items()}


def _forward(problem: Problem, pools: Pools, n: int, starts: Starts) -> dict[Key, int]:
    """Every task as early as the others allow, earliest start first."""
    return _walk(problem.units, n, starts, pools)


def _walk(p: Placement, n: int, time: Starts, pools: Pools) -> dict[Key, int]:
    """List scheduling on the grid: when a device frees, the ready task of least `time` (then
    micro-batch, then data order) that memory admits."""
    if any(len(b.devices) > 1 for b in p.blocks):
        rank = {b: i for i, b in enumerate(p.topo_order)}
        out = list_schedule(p, n, lambda b, m: (time[(b, m)], m, rank[b]), pools)
        return {key: int(v) for key, v in out.items()}
    return _Walk(p, n, time, pools).run()


class _Walk:
    """The engine's walk for blocks on one device each: a heap of ready tasks per device, so a
    free device looks only at its own tasks (the engine sorts every waiting block per event).
    Tasks are numbers m * blocks + i, i in data order; the priority is one integer."""

    def __init__(self, p: Placement, n: int, time: Starts, pools: Pools) -> None:
        self.n, self.order = n, p.topo_order
        nb = self.nb = len(self.order)
        index = {b: i for i, b in enumerate(self.order)}
        by = p.by_id
        self.dev = [by[b].devices[0] for b in self.order]
        self.dur = [int(by[b].duration) for b in self.order]
        self.mem = [int(by[b].memory) for b in self.order]  # memory units: integers on the grid
        self.succs = [[(index[s], int(p.edge_latency(b, s))) for s in p.succs[b]] for b in self.order]
        npred = [len(p.preds[b]) for b in self.order]
        self.left = [npred[i] for _ in range(n) for i in range(nb)]
        self.ready_at = [0] * (n * nb)
        span = n * nb
        self.key = [0] * (n * nb)
        for (b, m), t in time.items():
            self.key[m * nb + index[b]] = int(t) * span + m * nb + index[b]
        self.caps = {d: c for (d, _), c in pools.caps.items()}
        self.reserve = [0] * p.devices
        self.leave = [0] * p.devices
        self.count = [0] * p.devices  # memory blocks per device
        for i in range(nb):
            if self.mem[i]:
                d = self.dev[i]
                self.reserve[d] += max(self.mem[i], 0)
                self.leave[d] += self.mem[i]
                self.count[d] += 1
        self.leave = [max(x, 0) for x in self.leave]
        self.used = [0] * p.devices
        self.next_in = [0] * p.devices
        self.open: dict[tuple[int, int], list[int]] = {}  # (device, m) -> [memory tasks left, given back]
        self.heaps: list[list[tuple[int, int]]] = [[] for _ in range(p.devices)]
        self.busy = [0] * p.devices
        self.start: dict[Key, int] = {}
        self.roots = [i for i in range(nb) if not npred[i]]

    def run(self) -> dict[Key, int]:
        """The walk; the per-task steps inline, state in locals (16-24% faster than a method per step)."""
        nb, total, dev, heaps, busy = self.nb, self.n * self.nb, self.dev, self.heaps, self.busy
        key, push, pop = self.key, heapq.heappush, heapq.heappop
        mem, succs, left, ready_at = self.mem, self.succs, self.left, self.ready_at
        running: list[tuple[int, int]] = []
        pending: list[tuple[int, int]] = []
        dirty: set[int] = set()
        for m in range(self.n):
            for i in self.roots:
                push(heaps[dev[i]], (key[m * nb + i], m * nb + i))
                dirty.add(dev[i])
        t = 0
        while len(self.start) < total:
            for d in sorted(dirty):
                if busy[d] <= t and heaps[d]:
                    self._dispatch(d, t, running)
            dirty = set()
            if running and (not pending or running[0][0] <= pending[0][0]):
                t = running[0][0]
            elif pending:
                t = pending[0][0]
            else:
                raise DeadlockError(f"list scheduling stuck at time {t} with {total - len(self.start)} tasks left")
            while running and running[0][0] <= t:
                end, task = pop(running)
                m, i = divmod(task, nb)
                dirty.add(dev[i])
                if mem[i]:
                    self._close(dev[i], m, mem[i])
                base = m * nb
                for x, lat in succs[i]:
                    x += base
                    left[x] -= 1
                    if end + lat > ready_at[x]:
                        ready_at[x] = end + lat
                    if not left[x]:
                        push(pending, (ready_at[x], x))
            while pending and pending[0][0] <= t:
                task = pop(pending)[1]
                d = dev[task % nb]
                push(heaps[d], (key[task], task))
                dirty.add(d)
        return self.start

    def _admissible(self, task: int) -> bool:
        i = task % self.nb
        d = self.dev[i]
        if not self.mem[i] or d not in self.caps or (d, task // self.nb) in self.open:
            return True
        return self.next_in[d] == task // self.nb and self.used[d] + self.reserve[d] <= self.caps[d]

    def _dispatch(self, d: int, t: int, running: list[tuple[int, int]]) -> None:
        heap, skipped = self.heaps[d], []
        while heap and not self._admissible(heap[0][1]):
            skipped.append(heapq.heappop(heap))
        if heap:
            task = heapq.heappop(heap)[1]
            self._begin(task, d, t, running)
        for x in skipped:
            heapq.heappush(heap, x)

    def _begin(self, task: int, d: int, t: int, running: list[tuple[int, int]]) -> None:
        m, i = divmod(task, self.nb)
        self.start[(self.order[i], m)] = t
        end = self.busy[d] = t + self.dur[i]
        if self.mem[i] and (d, m) not in self.open:
            self.open[(d, m)] = [self.count[d], 0]
            self.used[d] += self.reserve[d]
            self.next_in[d] += 1
        heapq.heappush(running, (end, task))

    def _close(self, d: int, m: int, mem: int) -> None:
        """A memory task of micro-batch m ended on device d: a release gives its memory back at
        once (never more than the close would), the last one closes the reservation."""
        state = self.open[(d, m)]
        state[0] -= 1
        if mem < 0:
            back = min(-mem, self.reserve[d] - self.leave[d] - state[1])
            self.used[d] -= back
            state[1] += back
        if not state[0]:
            del self.open[(d, m)]
            self.used[d] -= self.reserve[d] - self.leave[d] - state[1]

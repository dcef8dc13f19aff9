"""Event-driven list scheduling: when devices free, start the ready task of best priority.

Shared by `greedy`, `1f1b` and `chimera`. Memory is kept by reservation, which is what makes
the walk deadlock-free under a limit:

- A *pool* is (device, group); groups split a placement's blocks (one group for greedy and
  1F1B, one per pipeline for Chimera). A micro-batch reserves `R` on a pool when its first
  memory-changing task there starts, where `R` is the sum of the positive memory of the group's
  blocks on that device (no order of one micro-batch's tasks can hold more), and gives back
  `R` minus what it leaves behind once all those tasks have ended.
- A pool with a cap admits micro-batches in increasing order and only while its reservations
  fit under the cap. So the oldest unfinished micro-batch always finds room (everything older is
  done, nothing younger got in first) and the walk never deadlocks; the real memory never
  exceeds the reservations, so it never exceeds the caps either.

Multi-device tasks need all their devices at once. A ready task whose devices are partly busy
claims the free ones until the busy ones end: lower-priority tasks may use a claimed device only
if they finish before (backfilling). The first multi-device block kept waiting so also holds its
devices against higher-priority work until it starts; otherwise a stream of single-device tasks
of older micro-batches, always somewhere on its devices, would starve it and serialise the
whole run.
"""
from __future__ import annotations

import contextlib
import contextvars
import heapq
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..key import Key
from ..placement import Number, Placement
from ..schedule import EPS
from ..timing import DeadlockError
from .shapes import BaselineError

# a wall clock for the walks started inside `deadline(...)` (plan's clock at 4,096 devices: one
# walk there takes minutes); None: no limit
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("tessel_walk_deadline", default=None)
CHECK_EVERY = 256  # events between looks at the clock


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Walks started inside stop with BaselineError once time.perf_counter() passes `at`."""
    token = _DEADLINE.set(at)
    try:
        yield
    finally:
        _DEADLINE.reset(token)

Pool = tuple[int, Hashable]
Priority = Callable[[str, int], tuple[Any, ...]]


@dataclass(frozen=True)
class Pools:
    """Memory pools: the group of each block, and a cap per (device, group); no cap = unlimited."""
    group: Mapping[str, Hashable]
    caps: Mapping[Pool, Number] = field(default_factory=dict)
    release_early: bool = False  # a release's memory goes back to the pool when it ends


def one_group(p: Placement) -> dict[str, Hashable]:
    return {b.id: 0 for b in p.blocks}


def reservations(p: Placement, group: Mapping[str, Hashable]) -> tuple[dict[Pool, Number], dict[Pool, Number]]:
    """Per pool: the reservation R of one micro-batch, and the memory it leaves behind (>= 0)."""
    pos: dict[Pool, Number] = defaultdict(int)
    net: dict[Pool, Number] = defaultdict(int)
    for b in p.blocks:
        for d in b.devices:
            if b.memory:
                pos[(d, group[b.id])] += max(b.memory, 0)
                net[(d, group[b.id])] += b.memory
    return dict(pos), {k: max(v, 0) for k, v in net.items()}


def memory_need(p: Placement, micro_batches: int, group: Mapping[str, Hashable]) -> dict[Pool, Number]:
    """The least cap with which a pool still lets every micro-batch through."""
    r, left = reservations(p, group)
    return {k: r[k] + (micro_batches - 1) * left[k] for k in r}


class _Walk:
    """State of one list-scheduling walk; `run` returns {(block, micro_batch): start}."""

    def __init__(self, p: Placement, n: int, priority: Priority, pools: Pools) -> None:
        self.p, self.n, self.priority = p, n, priority
        self.group = pools.group
        self.caps = pools.caps
        self.release_early = pools.release_early
        self.given: dict[tuple[Pool, int], Number] = defaultdict(int)  # given back early, per pool and micro-batch
        self.reserve, self.leave = reservations(p, pools.group)
        self.pools_of = {b.id: [(d, self.group[b.id]) for d in b.devices] if b.memory else [] for b in p.blocks}
        self.mem_tasks: dict[Pool, int] = defaultdict(int)
        for ks in self.pools_of.values():
            for k in ks:
                self.mem_tasks[k] += 1
        self.busy = [0.0] * p.devices
        self.left = {b.id: [len(p.preds[b.id])] * n for b in p.blocks}
        self.ready_at = {b.id: [0.0] * n for b in p.blocks}
        self.ready: dict[str, list[int]] = {b.id: [] for b in p.blocks}
        self.pending: list[tuple[float, str, int]] = []
        self.running: list[tuple[float, str, int]] = []
        self.used: dict[Pool, Number] = defaultdict(int)
        self.next_in: dict[Pool, int] = defaultdict(int)
        self.open: dict[tuple[Pool, int], int] = {}
        self.start: dict[Key, Number] = {}
        self.held: str | None = None
        self.waiting = {b.id for b in p.blocks if not p.preds[b.id]}  # blocks with ready tasks
        for b in self.waiting:
            self.ready[b] = list(range(n))

    def run(self) -> dict[Key, Number]:
        t, total = 0.0, self.n * len(self.p.blocks)
        stop, events = _DEADLINE.get(), 0
        while len(self.start) < total:
            events += 1
            if stop is not None and events % CHECK_EVERY == 0 and time.perf_counter() > stop:
                raise BaselineError(f"time limit: the walk stopped with {total - len(self.start):,} of {total:,} "
                                    "tasks left")
            self._dispatch(t)
            nxt = [q[0][0] for q in (self.running, self.pending) if q]
            if not nxt:
                raise DeadlockError(f"list scheduling stuck at time {t:g} with {total - len(self.start)} tasks left")
            t = min(nxt)
            while self.running and self.running[0][0] <= t + EPS:
                self._finish(*heapq.heappop(self.running))
            while self.pending and self.pending[0][0] <= t + EPS:
                _, b, m = heapq.heappop(self.pending)
                heapq.heappush(self.ready[b], m)
                self.waiting.add(b)
        return self.start

    # ---- dispatch -------------------------------------------------------------------------
    def _dispatch(self, t: float) -> None:
        # a device is free while busy[d] <= t: _begin makes it busy past t, so this is the set of
        # free devices at the start less those taken since, without a scan of every device per
        # event (quadratic at 4,096 devices)
        busy, tol, by = self.busy, t + EPS, self.p.by_id
        cands = sorted((self.priority(b, self.ready[b][0]), b, self.ready[b][0]) for b in self.waiting
                       if any(busy[d] <= tol for d in by[b].devices))
        if not cands:
            return
        claim = self._reserved()
        for _, b, m in cands:
            devs = by[b].devices
            if not self._admissible(b, m):
                continue
            if all(busy[d] <= tol for d in devs):
                end = t + by[b].duration
                if b == self.held or all(end <= claim.get(d, end) + EPS for d in devs):
                    self._begin(b, m, t, end)
            else:
                when = max(busy[d] for d in devs)
                if len(devs) > 1 and self.held is None:
                    self.held = b
                for d in devs:
                    if busy[d] <= tol:
                        claim[d] = min(claim.get(d, when), when)

    def _reserved(self) -> dict[int, float]:
        """The devices held for the multi-device block first kept waiting, until they all free."""
        if self.held is None:
            return {}
        devs = self.p.by_id[self.held].devices
        when = max(self.busy[d] for d in devs)
        return {d: when for d in devs}

    def _admissible(self, b: str, m: int) -> bool:
        for k in self.pools_of[b]:
            if (k, m) in self.open or k not in self.caps:
                continue
            if self.next_in[k] != m or self.used[k] + self.reserve[k] > self.caps[k] + EPS:
                return False
        return True

    def _begin(self, b: str, m: int, t: float, end: float) -> None:
        heapq.heappop(self.ready[b])
        if not self.ready[b]:
            self.waiting.discard(b)
        if b == self.held:
            self.held = None
        self.start[(b, m)] = t
        for d in self.p.by_id[b].devices:
            self.busy[d] = end
        for k in self.pools_of[b]:
            if (k, m) not in self.open:
                self.open[(k, m)] = self.mem_tasks[k]
                self.used[k] += self.reserve[k]
                self.next_in[k] += 1
        heapq.heappush(self.running, (end, b, m))

    def _finish(self, end: float, b: str, m: int) -> None:
        mem = self.p.by_id[b].memory
        for k in self.pools_of[b]:
            self.open[(k, m)] -= 1
            if self.release_early and mem < 0:  # never more than the close would give back
                back = min(-mem, self.reserve[k] - self.leave[k] - self.given[(k, m)])
                self.used[k] -= back
                self.given[(k, m)] += back
            if not self.open[(k, m)]:
                del self.open[(k, m)]
                self.used[k] -= self.reserve[k] - self.leave[k] - self.given.pop((k, m), 0)
        for s in self.p.succs[b]:
            self.left[s][m] -= 1
            self.ready_at[s][m] = max(self.ready_at[s][m], end + self.p.edge_latency(b, s))
            if not self.left[s][m]:
                heapq.heappush(self.pending, (self.ready_at[s][m], s, m))


def list_schedule(p: Placement, micro_batches: int, priority: Priority, pools: Pools) -> dict[Key, Number]:
    """Start times of every task under the policy; raises DeadlockError only on a bug."""
    return _Walk(p, micro_batches, priority, pools).run()


def backward_first(p: Placement) -> Priority:
    """Backward and weight tasks before forward ones, then the lowest micro-batch, then data order.

    Within each of the two, a task on more devices goes first: it can only start when all its
    devices are free at once, and the single-device work of older micro-batches would otherwise
    keep one of them busy until the whole older micro-batch is done (a sharded embedding would
    serialise the pipeline)."""
    rank = {b: i for i, b in enumerate(p.topo_order)}
    key = {b.id: (b.kind in ("forward", "other"), -len(b.devices)) for b in p.blocks}
    return lambda b, m: (*key[b], m, rank[b])

"""Orders replayed as early as they allow, fast, for walks that replay the same placement's
orders thousands of times (the order polish, polish.py).

The same start times as timing.earliest_starts, float for float (each start is the same max of
the same sums, compared in the same order), without its heap and its checks: the walk only ever
permutes a valid order within a device. The devices are swept in turn, each running its order
until a task's inputs are not done yet; a sweep that runs nothing leaves a deadlock. Placements
with a task on several devices are left to earliest_starts (their task waits for every device).
"""
from __future__ import annotations

from collections.abc import Sequence

from ..bulk import paused_gc
from ..key import Key
from ..placement import Number, Placement
from ..timing import DeadlockError, earliest_starts


class Replayer:
    """One placement and micro-batch count, set up once; `starts` per set of orders."""

    def __init__(self, p: Placement, n: int) -> None:
        ids = [b.id for b in p.blocks]
        index = {b: i for i, b in enumerate(ids)}
        self.p, self.n, self.index = p, n, index
        self.keys = [(b, m) for b in ids for m in range(n)]
        self.inputs = [[(index[a] * n, p.edge_latency(a, b)) for a in p.preds[b]] for b in ids]
        self.duration = [p.by_id[b].duration for b in ids]
        self.single = all(len(b.devices) == 1 for b in p.blocks)
        self.task_duration = [d for d in self.duration for _ in range(n)]
        self.task_feeds = [bool(p.succs[b]) for b in ids for _ in range(n)]  # False: a sink

    def starts(self, orders: Sequence[Sequence[Key]]) -> dict[Key, Number] | None:
        """{task: start} of each device running its order back to back; None on a deadlock."""
        start = self._starts(orders)
        keys = self.keys
        return None if start is None else {keys[t]: x for t, x in enumerate(start)}

    def timed(self, orders: Sequence[Sequence[Key]], sink_weight: float) -> tuple[dict[Key, Number], Number, Number] | None:
        """The starts, the makespan and the task ends summed (a sink's, nothing after it, weighing
        `sink_weight`); None on a deadlock."""
        start = self._starts(orders)
        if start is None:
            return None
        ends = [x + d for x, d in zip(start, self.task_duration)]
        weighted = sum(e if w else e * sink_weight for e, w in zip(ends, self.task_feeds))
        keys = self.keys
        return {keys[t]: x for t, x in enumerate(start)}, max(ends) - min(start), weighted

    def _starts(self, orders: Sequence[Sequence[Key]]) -> list[Number] | None:
        if not self.single:
            try:
                got = earliest_starts(self.p, self.n, orders)
            except DeadlockError:
                return None
            return [got[k] for k in self.keys]
        n, index = self.n, self.index
        seqs = [[index[b] * n + m for b, m in order] for order in orders]
        with paused_gc():
            return self._swept(seqs)

    def _swept(self, seqs: list[list[int]]) -> list[Number] | None:
        n, inputs, duration = self.n, self.inputs, self.duration
        end: list[Number | None] = [None] * len(self.keys)
        start: list[Number] = [0] * len(self.keys)
        pos = [0] * len(seqs)
        free: list[Number] = [0] * len(seqs)
        moved = True
        while moved:
            moved = False
            for d, seq in enumerate(seqs):
                i, t_free = pos[d], free[d]
                while i < len(seq):
                    tid = seq[i]
                    b, m = divmod(tid, n)
                    t: Number = t_free
                    for base, la in inputs[b]:
                        e = end[base + m]
                        if e is None:
                            break
                        if e + la > t:
                            t = e + la
                    else:
                        start[tid] = t
                        t_free = end[tid] = t + duration[b]
                        i += 1
                        continue
                    break
                if i != pos[d]:
                    pos[d], free[d], moved = i, t_free, True
        if any(pos[d] < len(seq) for d, seq in enumerate(seqs)):
            return None
        return start

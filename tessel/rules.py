"""The four validity rules of FORMAT.md, checked on a Schedule (`Schedule.violations` calls here).

1. every (block, micro-batch) task once, at a start in range; 2. a task starts after its inputs
are ready (duration plus the edge's latency); 3. one task at a time per device; 4. memory within
each device's limit at every moment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .bulk import paused_gc
from .errors import quote
from .numeric import EPS
from .numeric import snap as _num
from .placement import MAX_VALUE, Number, in_range

if TYPE_CHECKING:
    from .schedule import Schedule


@dataclass(frozen=True)
class Violation:
    """One broken rule of FORMAT.md: its number and what breaks it."""
    rule: int
    message: str

    def __str__(s) -> str:
        return f"rule {s.rule}: {s.message}"


def violations(s: Schedule, limit: int = 10) -> list[Violation]:
    """Broken rules, first ones first; empty when the schedule is valid. Rules 2-4 are only
    checked once rule 1 holds (they need every task, once, at a real start)."""
    with paused_gc():  # sets and orders of every task, and no cycle among them (tessel.bulk)
        errs = _rule1(s)
        if errs:
            return errs[:limit]
        for rule in (_rule2, _rule3, _rule4):
            errs += rule(s)
    return errs[:limit]


def _rule1(s: Schedule) -> list[Violation]:
    if _rule1_holds(s):
        return []
    by, n = s.placement.by_id, s.micro_batches
    errs: list[Violation] = []
    seen: set[tuple[str, int]] = set()
    if n < 1:
        errs.append(Violation(1, f"micro_batches must be >= 1, got {n}"))
    for t in s.tasks:
        key = (t.block, t.micro_batch)
        if t.block not in by:
            errs.append(Violation(1, f"task of unknown block {quote(t.block)}"))
        elif not 0 <= t.micro_batch < n:
            errs.append(Violation(1, f"task {t.block}#{t.micro_batch} micro-batch out of 0..{n - 1}"))
        elif key in seen:
            errs.append(Violation(1, f"task {t.block}#{t.micro_batch} appears twice"))
        elif not in_range(t.start, -EPS, MAX_VALUE):
            errs.append(Violation(1, f"task {t.block}#{t.micro_batch} has bad start {quote(t.start)} "
                                     f"(not a number in 0..{MAX_VALUE:g})"))
        seen.add(key)
        if len(errs) >= 10:
            break
    if not errs and len(seen) != len(by) * n:
        missing = next((b, m) for m in range(n) for b in by if (b, m) not in seen)
        errs.append(Violation(1, f"{len(by) * n - len(seen)} tasks missing, e.g. {missing[0]}#{missing[1]}"))
    return errs

def _rule1_holds(s: Schedule) -> bool:
    """Rule 1 in bulk, the common case (a schedule of 524k tasks checked in a few passes): as
    many tasks as blocks x N, none twice, each of a known block and micro-batch, at a start in
    range. False sends the check through _rule1's task-by-task walk, which says what is wrong."""
    by, n, tasks = s.placement.by_id, s.micro_batches, s.tasks
    if n < 1 or len(tasks) != len(by) * n:
        return False
    # over the tasks, not the set of keys: a walk over a large set's scattered tuples is slower
    return {t.block for t in tasks} <= by.keys() \
        and all(type(t.micro_batch) is int and 0 <= t.micro_batch < n for t in tasks) \
        and all(in_range(t.start, -EPS, MAX_VALUE) for t in tasks) \
        and len({(t.block, t.micro_batch) for t in tasks}) == len(tasks)


def _rule2(s: Schedule) -> list[Violation]:
    p, n = s.placement, s.micro_batches
    at: dict[str, list[Number]] = {b: [0] * n for b in p.by_id}  # per block, by micro-batch: no tuple keys
    for t in s.tasks:
        at[t.block][t.micro_batch] = t.start
    for a, b in p.edges:
        need = p.by_id[a].duration + p.edge_latency(a, b)
        xs, ys = at[a], at[b]
        if all(y + EPS >= x + need for x, y in zip(xs, ys)):
            continue
        m = next(m for m in range(n) if ys[m] + EPS < xs[m] + need)
        return [Violation(2, f"{b}#{m} starts at {ys[m]} before its input {a}#{m} "
                             f"is ready at {_num(xs[m] + need)}")]
    return []

def _rule3(s: Schedule) -> list[Violation]:
    by, errs = s.placement.by_id, []
    duration = {b: x.duration for b, x in by.items()}  # a dict of numbers: the loop runs 524k times
    for d, tasks in enumerate(s.device_orders()):
        for x, y in zip(tasks, tasks[1:]):
            if y.start + EPS < x.start + duration[x.block]:
                errs.append(Violation(3, f"device {d}: {y.block}#{y.micro_batch} at {y.start} overlaps "
                                         f"{x.block}#{x.micro_batch} running "
                                         f"{x.start}..{_num(x.start + by[x.block].duration)}"))
                break
    return errs

def _rule4(s: Schedule) -> list[Violation]:
    if s.memory_limit is None:
        return []
    errs = []
    for d, (peak, at) in enumerate(s._peaks()):
        if peak > s.memory_limit[d] + EPS:
            errs.append(Violation(4, f"device {d}: memory reaches {_num(peak)} at time {at}, "
                                     f"over its limit {s.memory_limit[d]}"))
    return errs

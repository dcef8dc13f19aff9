"""The four validity rules of FORMAT.md, checked on a Schedule (`Schedule.violations` calls here).

1. every (block, micro-batch) task once, at a start in range; 2. a task starts after its inputs
are ready (duration plus the edge's latency); 3. one task at a time per device; 4. memory within
each device's limit at every moment.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import quote
from .numeric import EPS
from .numeric import snap as _num
from .placement import MAX_VALUE, in_range

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
    errs = _rule1(s)
    if errs:
        return errs[:limit]
    for rule in (_rule2, _rule3, _rule4):
        errs += rule(s)
    return errs[:limit]


def _rule1(s: Schedule) -> list[Violation]:
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

def _rule2(s: Schedule) -> list[Violation]:
    p, st = s.placement, s.start
    for a, b in p.edges:
        need = p.by_id[a].duration + p.edge_latency(a, b)
        for m in range(s.micro_batches):
            if st[(b, m)] + EPS < st[(a, m)] + need:
                return [Violation(2, f"{b}#{m} starts at {st[(b, m)]} before its input {a}#{m} "
                                     f"is ready at {_num(st[(a, m)] + need)}")]
    return []

def _rule3(s: Schedule) -> list[Violation]:
    by, errs = s.placement.by_id, []
    for d, tasks in enumerate(s.device_orders()):
        for x, y in zip(tasks, tasks[1:]):
            if y.start + EPS < x.start + by[x.block].duration:
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

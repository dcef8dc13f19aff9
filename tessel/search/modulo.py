"""The repetend as a value: period, copies, per-copy phase and offset, on the grid.

A repetend holds `copies` micro-batches (P), each with its own pattern: block b of micro-batch
m = c * P + j starts at (offset[b, j] + c) * period + phase[b, j]. With P = 1 this is plain
modulo scheduling; P > 1 reaches periods per micro-batch that are not whole grid steps
(e.g. 3 micro-batches every 16), which memory-tight placements need.

Steady-state memory of a device at phase phi is sum over (b, j) of m_b * ([phi >= rho] - Q),
where each memory event (allocation at a start, release at an end) happens at time
Q * period + rho, rho in [0, period); at equal phases releases count first, as in rule 4.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..key import Key
from .problem import Problem

Slot = tuple[str, int]  # (block, copy)


@dataclass(frozen=True)
class Modulo:
    period: int  # of one repetition of the pattern, grid units
    phase: Mapping[Slot, int]
    offset: Mapping[Slot, int]
    copies: int = 1

    @staticmethod
    def from_starts(period: int, starts: Mapping[Slot, int], copies: int = 1) -> Modulo:
        """The repetend of the pattern's start times, shifted so the earliest starts at 0."""
        t0 = min(starts.values())
        return Modulo(period, {x: (s - t0) % period for x, s in starts.items()},
                      {x: (s - t0) // period for x, s in starts.items()}, copies)

    @property
    def per_micro_batch(self) -> Fraction:
        return Fraction(self.period, self.copies)

    def start(self, block: str, micro_batch: int = 0) -> int:
        c, j = divmod(micro_batch, self.copies)
        return (self.offset[(block, j)] + c) * self.period + self.phase[(block, j)]

    def starts(self) -> dict[Slot, int]:
        return {(b, j): self.start(b, j) for b, j in self.phase}

    def span(self, problem: Problem) -> int:
        """Time from the first start to the last end of one repetition's micro-batches."""
        s = self.starts()
        return max(t + problem.duration[b] for (b, _), t in s.items()) - min(s.values())

    def unrolled(self, micro_batches: range) -> dict[Key, int]:
        """The plain unroll: micro-batch c * P + j at copy j's pattern, c periods later."""
        first = {x: self.offset[x] * self.period + self.phase[x] for x in self.phase}  # each copy's, c = 0
        by_copy = [[(b, t) for (b, j), t in first.items() if j == copy] for copy in range(self.copies)]
        out: dict[Key, int] = {}
        for k in micro_batches:  # a shift per micro-batch, not a start() per task (524k at 4,096 devices)
            c, j = divmod(k, self.copies)
            shift = c * self.period
            for b, t in by_copy[j]:
                out[(b, k)] = t + shift
        return out

    def in_flight(self, problem: Problem) -> int:
        """How many repetitions overlap one window of the steady state."""
        return -(-self.span(problem) // self.period)


def steady_memory(problem: Problem, mod: Modulo) -> list[int]:
    """Per device, the highest memory level of the steady state (0 without memory events)."""
    out = []
    for d in range(problem.units.devices):
        events = sorted((rho, m, q) for q, rho, m in
                        (_event(problem, mod, b, j) for b in problem.memory_blocks(d) for j in range(mod.copies)))
        # the level at an allocation's phase rho_a: the events at phases <= rho_a, less what each
        # event's whole periods q carry (one sort and a running sum, not a sum per event: a
        # 16-copy repetend at 16 devices has ~100 events a device)
        base = -sum(m * q for _, m, q in events)
        best: int | None = None
        level, i = base, 0
        while i < len(events):
            rho, alloc = events[i][0], False
            while i < len(events) and events[i][0] == rho:
                level += events[i][1]
                alloc = alloc or events[i][1] > 0
                i += 1
            if alloc and (best is None or level > best):
                best = level
        out.append(0 if best is None else best)
    return out


def memory_time(problem: Problem, start: Callable[[str, int], Any], copies: int, d: int) -> Any:
    """Memory-time one repetition holds on device d: each release's end minus each allocation's
    start, weighted by the amount; `start(block, copy)` is a start time or a solver variable.
    Over one period, the steady-state level integrates to it plus the period times what a
    repetition leaves (problem.memory_left), so its average is at most the peak (Little's law)."""
    return sum(-problem.memory[b] * (start(b, j) + _event_offset(problem, b))
               for b in problem.memory_blocks(d) for j in range(copies))


def _event_offset(problem: Problem, block: str) -> int:
    """When a memory event falls after its block's start: an allocation at the start, a release
    at the end."""
    return problem.duration[block] if problem.memory[block] < 0 else 0


def _event(problem: Problem, mod: Modulo, block: str, copy: int) -> tuple[int, int, int]:
    m = problem.memory[block]
    t = mod.start(block, copy) + _event_offset(problem, block)
    return t // mod.period, t % mod.period, m


def fits(problem: Problem, mod: Modulo) -> bool:
    if problem.limit is None:
        return True
    return all(level <= lim for level, lim in zip(steady_memory(problem, mod), problem.limit))

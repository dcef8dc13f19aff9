"""A search problem on an integer grid: durations, latency and memory scaled to integers.

CP-SAT works on integers. Durations and latency are scaled by a stated `resolution` (real time
per grid unit) and rounded *up*, so a schedule valid on the grid stays valid with the real
durations: every real task ends no later than its grid task, so dependencies and device
exclusivity still hold, and memory is only released earlier. Memory is scaled by a power of ten
that makes every value and limit an integer (exact up to six decimals). Time steps are powers
of two or integers so that grid times are exact in floating point (see _time_resolution).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cached_property
from typing import Any

from .. import bounds, graph, holds
from ..errors import LimitError, TesselError
from ..key import Key
from ..numeric import fmt, snap
from ..placement import MAX_VALUE, Number, Placement
from ..schedule import EPS, Repetend, Schedule, normalise_limit

# an exact grid keeps the busiest device's load under MAX_LOAD_UNITS units; an approximate one
# (durations rounded up) uses about APPROX_LOAD_UNITS, i.e. 0.01% of the load per block
MAX_LOAD_UNITS = 100_000
APPROX_LOAD_UNITS = 10_000
# every duration and the latency stays under MAX_SPAN_UNITS grid units: 2,000,000 tasks' grid
# times then stay under 2**53 (exact in floating point, far inside CP-SAT's int64 domains). A
# latency 1e10 over durations of 1e-6 (both in range) asked for 10**20 units and overflowed; such
# a grid is coarsened to the power-of-two step that fits, durations rounded up to it (still valid)
MAX_SPAN_UNITS = 2**31


class MemoryLimitError(TesselError):
    """No schedule can fit the memory limit; the message gives the least limit per device."""


@dataclass(frozen=True)
class Problem:
    """The placement scaled to the grid (`units`), its limits, and the way back to real numbers."""
    placement: Placement
    units: Placement
    limit: tuple[int, ...] | None  # per device, memory units
    resolution: Number  # real time of one grid unit
    exact_time: bool  # the grid durations equal the real ones
    memory_scale: int  # memory units per real memory unit

    @cached_property
    def duration(self) -> dict[str, int]:
        return {b.id: int(b.duration) for b in self.units.blocks}

    @cached_property
    def memory(self) -> dict[str, int]:
        return {b.id: int(b.memory) for b in self.units.blocks}

    @cached_property
    def devices_of(self) -> dict[str, tuple[int, ...]]:
        return {b.id: b.devices for b in self.units.blocks}

    @property
    def block_ids(self) -> tuple[str, ...]:
        return self.units.topo_order

    def gap(self, a: str, b: str) -> int:
        """Least time from the start of a to the start of b on edge a -> b."""
        return self.duration[a] + int(self.units.edge_latency(a, b))

    def memory_blocks(self, device: int) -> list[str]:
        return [b.id for b in self.units.blocks_on(device) if b.memory]

    def memory_left(self, device: int) -> int:
        """Memory one micro-batch leaves held on the device (0 where its blocks balance)."""
        return sum(self.memory[b] for b in self.memory_blocks(device))

    @cached_property
    def ancestors(self) -> dict[str, int]:
        """Each block's ancestors as a bit set over block_ids (graph.ancestor_bits)."""
        return graph.ancestor_bits(self.units.topo_order, self.units.preds)

    def memory_pairs(self, device: int) -> list[tuple[str, str, int]] | None:
        """_memory_pairs, once per device (Little's law and the bounds each ask for every device's)."""
        if device not in self._pairs:
            self._pairs[device] = self._memory_pairs(device)
        return self._pairs[device]

    @cached_property
    def _pairs(self) -> dict[int, list[tuple[str, str, int]] | None]:
        return {}

    def _memory_pairs(self, device: int) -> list[tuple[str, str, int]] | None:
        """The device's memory as holds (allocating block, releasing block, amount) of one
        micro-batch, each release matched to allocations of its ancestors (latest first), so
        memory is held from the allocation's start to the release's end; None when some
        memory cannot be matched that way (then only event-wise accounting is exact)."""
        blocks = self.memory_blocks(device)
        left = {b: self.memory[b] for b in blocks if self.memory[b] > 0}
        order = self._topo_index  # once: a device's call stays linear in its blocks
        pairs = []
        for r in sorted((b for b in blocks if self.memory[b] < 0), key=order.__getitem__):
            need = -self.memory[r]
            ancestors = self.ancestors[r]
            for a in sorted((a for a, x in left.items() if x and ancestors >> order[a] & 1), key=order.__getitem__,
                            reverse=True):
                take = min(need, left[a])
                pairs.append((a, r, take))
                left[a] -= take
                need -= take
                if not need:
                    break
            if need:
                return None
        return None if any(left.values()) else pairs

    @cached_property
    def memory_period_bound(self) -> Fraction:
        """Little's law: a device holding `amount` for at least `hold` time per micro-batch
        carries amount * hold / period on average, which may not exceed its limit; so the
        period per micro-batch is at least the largest sum(amount * hold) / limit."""
        best = Fraction(0)
        devices = [(d, pairs) for d in self.limited_devices() if (pairs := self.memory_pairs(d)) and self.cap(d) > 0]
        # on the grid (integer durations and latency) every hold is an integer, exact or a path's
        hold = holds.holds_of(self.units, sum(len(pairs) for _, pairs in devices))
        for d, pairs in devices:
            held = sum(amount * int(hold(a, r)) for a, r, amount in pairs)
            best = max(best, Fraction(held, self.cap(d)))
        return best

    @cached_property
    def _topo_index(self) -> dict[str, int]:
        return {b: i for i, b in enumerate(self.block_ids)}

    def real_holds(self) -> dict[int, tuple[Number, list[tuple[str, str, Number]]]]:
        """Per limited device whose memory pairs up (memory_pairs), its real limit and holds:
        the `memory` argument of bounds.device_lower_bound."""
        limit = self.real_limit()
        out: dict[int, tuple[Number, list[tuple[str, str, Number]]]] = {}
        for d in self.limited_devices():
            pairs = self.memory_pairs(d)
            if pairs and limit is not None:
                out[d] = (limit[d], [(a, r, _unscale(x, self.memory_scale)) for a, r, x in pairs])
        return out

    def device_bound(self, micro_batches: int) -> Number:
        """bounds.device_lower_bound of the real placement under the real limits (computed once
        per N: it walks every task of every device)."""
        if micro_batches not in self._device_bounds:
            self._device_bounds[micro_batches] = bounds.device_lower_bound(self.placement, micro_batches,
                                                                           self.real_holds())
        return self._device_bounds[micro_batches]

    @cached_property
    def _device_bounds(self) -> dict[int, Number]:
        return {}

    def cap(self, device: int) -> int:
        """The memory limit of a limited device, in memory units."""
        assert self.limit is not None, "only limited devices have a cap"
        return self.limit[device]

    def limited_devices(self) -> list[int]:
        if self.limit is None:
            return []
        return [d for d in range(self.units.devices) if self.memory_blocks(d)]

    @cached_property
    def period_bound(self) -> int:
        return int(bounds.period_lower_bound(self.units))

    @cached_property
    def period_floor(self) -> Fraction:
        """No repetend has a smaller period per micro-batch: the device-load bound and Little's
        law on the memory limits (memory_period_bound), whichever is larger."""
        return max(Fraction(self.period_bound), self.memory_period_bound)

    def lower_bound(self, micro_batches: int) -> int:
        return int(bounds.lower_bound(self.units, micro_batches))

    def real(self, units: int) -> Number:
        return snap(units * self.resolution)

    def real_limit(self) -> tuple[Number, ...] | None:
        if self.limit is None:
            return None
        return tuple(_unscale(x, self.memory_scale) for x in self.limit)

    def schedule(self, micro_batches: int, starts: Mapping[Key, int], repetend_at: tuple[int, int] | None,
                 period: int | None, meta: Mapping[str, Any]) -> Schedule:
        """The real schedule of grid starts; `repetend_at` = (start, end) of the kernel on the grid."""
        real = dict(starts) if self.resolution == 1 else {k: self.real(v) for k, v in starts.items()}
        rep = None
        if repetend_at is not None and period is not None:
            rep = Repetend(self.real(period), self.real(repetend_at[0]), self.real(repetend_at[1]))
        return Schedule.build(self.placement, micro_batches, real, self.real_limit(), rep, meta)

    def grid_schedule(self, micro_batches: int, starts: Mapping[Key, int], check: bool = True) -> Schedule:
        """The same starts against the grid placement: integer arithmetic, for checks inside searches."""
        return Schedule.build(self.units, micro_batches, starts, self.limit, check=check)


def make_problem(placement: Placement, memory: Number | Sequence[Number] | None = None,
                 micro_batches: int | None = None) -> Problem:
    """The grid problem; with `micro_batches`, refused up front (LimitError) when even the lower
    bound of the makespan runs past the largest time a schedule may hold."""
    if micro_batches is not None:
        check_horizon(placement, micro_batches)
    resolution, exact = _time_resolution(placement)
    limit_real = normalise_limit(memory, placement.devices)
    mem_values = [b.memory for b in placement.blocks] + list(limit_real or ())
    scale = _memory_scale(mem_values)
    blocks = [replace(b, duration=_to_units(b.duration, resolution),
                      memory=_scaled(b.memory, scale)) for b in placement.blocks]
    units = Placement(placement.name, placement.devices, tuple(blocks), placement.edges,
                      _to_units(placement.latency, resolution) if placement.latency else 0)
    limit = None if limit_real is None else tuple(math.floor(x * scale + EPS) for x in limit_real)
    problem = Problem(placement, units, limit, resolution, exact, scale)
    check_memory(problem)
    return problem


def check_horizon(placement: Placement, micro_batches: int) -> None:
    lb = bounds.lower_bound(placement, micro_batches)
    if not lb <= MAX_VALUE:
        raise LimitError(f"{micro_batches:,} micro-batches of {placement.name} take at least {fmt(lb)} (a lower bound "
                         f"of the makespan), past the {MAX_VALUE:g} a schedule's times may reach: use fewer "
                         "micro-batches, or shorter durations and latency")


def _to_units(x: Number, resolution: Number) -> int:
    return max(1, math.ceil(x / resolution - 1e-9)) if x > 0 else 0


def _time_resolution(p: Placement) -> tuple[Number, bool]:
    """The grid step: the gcd of integer durations, else a power of two.

    A binary step keeps every grid time exact in floating point. With a decimal step (0.001)
    a release ending at s + d and an allocation starting at the same grid time differ in
    their last bits, and rule 4 (releases before allocations at equal times) would then see
    the allocation first. Durations that are not multiples of the step are rounded up, so a
    real release ends strictly before the grid time of anything that waits for it."""
    values = [b.duration for b in p.blocks] + ([p.latency] if p.latency else [])
    res, exact = _fine_resolution(p, values)
    longest = max(values)
    if longest / res <= MAX_SPAN_UNITS:
        return res, exact
    coarse = 2.0 ** math.ceil(math.log2(longest / MAX_SPAN_UNITS))
    step = int(coarse) if coarse >= 1 else coarse
    return step, all(float(v / step).is_integer() for v in values)


def _fine_resolution(p: Placement, values: Sequence[Number]) -> tuple[Number, bool]:
    load = max(p.loads)
    if all(float(v).is_integer() for v in values):
        step = math.gcd(*(int(v) for v in values))
        if load / step <= MAX_LOAD_UNITS:
            return step, True
    for k in range(31):
        if all(float(v * 2**k).is_integer() for v in values) and load * 2**k <= MAX_LOAD_UNITS:
            return 2.0**-k, True
    res = 2.0 ** math.ceil(math.log2(load / APPROX_LOAD_UNITS))
    res = int(res) if res >= 1 else res
    return res, all(float(v / res).is_integer() for v in values)


def _memory_scale(values: Sequence[Number]) -> int:
    for k in range(7):
        s: int = 10**k
        if all(abs(v * s - round(v * s)) < 1e-9 * max(1.0, abs(v * s)) for v in values):
            return s
    return 10**6


def _scaled(x: Number, scale: int) -> int:
    return int(round(x * scale))


def _unscale(x: int, scale: int) -> Number:
    return x if scale == 1 else x / scale


def least_memory(units: Placement, ancestors: Mapping[str, int] | None = None) -> list[int]:
    """Per device, the memory any schedule needs at least: a block's allocation on top of
    everything its ancestors allocated (and released) on that device before it can start.
    `ancestors`: graph.ancestor_bits of the units (Problem.ancestors), computed when not given.
    A device's blocks are grouped by their memory, one bit set a group, so a block's level is a
    popcount per group (a walk over its ancestors was quadratic: seconds at 8,192 blocks)."""
    order = units.topo_order
    anc = graph.ancestor_bits(order, units.preds) if ancestors is None else ancestors
    index = {x: i for i, x in enumerate(order)}
    groups: list[dict[Number, int]] = [{} for _ in range(units.devices)]  # per device: memory -> its blocks
    for b in units.blocks:
        for d in b.devices if b.memory else ():
            groups[d][b.memory] = groups[d].get(b.memory, 0) | 1 << index[b.id]
    need = [0] * units.devices
    for b in units.blocks:
        if b.memory <= 0:
            continue
        bits = anc[b.id]
        for d in b.devices:
            level = b.memory + sum(m * (bits & mask).bit_count() for m, mask in groups[d].items())
            need[d] = max(need[d], int(level))
    return need


def check_memory(problem: Problem) -> None:
    """Fail early, naming devices and the least limits, when one micro-batch cannot fit, or
    when memory that never balances would outgrow any limit as micro-batches accumulate."""
    if problem.limit is None:
        return
    for d in problem.limited_devices():
        left = problem.memory_left(d)
        if left > 0:
            raise MemoryLimitError(f"placement {problem.placement.name!r}: memory on device {d} grows by "
                                   f"{_fmt(_unscale(left, problem.memory_scale))} per micro-batch (its blocks "
                                   f"do not release what they allocate), so no limit holds for many "
                                   f"micro-batches; search it without a memory limit (memory=None; no --memory "
                                   f"on the command line)")
    need = least_memory(problem.units, problem.ancestors)
    short = [d for d, (n, lim) in enumerate(zip(need, problem.limit)) if n > lim]
    if short:
        raise memory_error(problem, need, short)


def memory_error(problem: Problem, need: Sequence[int], short: Sequence[int]) -> MemoryLimitError:
    s = problem.memory_scale
    limit = problem.real_limit() or ()
    where = ", ".join(f"device {d} needs at least {_fmt(_unscale(need[d], s))} (limit {_fmt(limit[d])})"
                      for d in short)
    least = [_unscale(max(n, 0), s) for n in need]
    return MemoryLimitError(f"memory limit too small for placement {problem.placement.name!r}: {where}; "
                            f"the smallest limits that could work are {limits_hint(least)}")


def limits_hint(limits: Sequence[Number]) -> str:
    """Per-device limits as both the Python argument and the command-line option say them, in the
    placement's memory unit (MiB for a profiled one)."""
    values = [_fmt(x) for x in limits]
    return (f"memory=[{', '.join(values)}] (in the placement's memory unit; `--memory {','.join(values)}` "
            f"on the command line)")


def _fmt(x: Number) -> str:
    return fmt(x, digits=6)

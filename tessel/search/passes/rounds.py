"""Pass (mode tessel): the grouped repetends of a looped placement (grouped.py), unrolled and
completed.

On interleaved placements the period search's repetends hold one or two micro-batches and
complete long where latency must be hidden; a group of p micro-batches going through each chunk
round in turn hides it, and no solve finds that repetend in seconds. So, after the completion
and only while the best is more than Budget.settle from the proven bound (a settle pass), each
grouped repetend is unrolled and compacted (linear builds, no solver: they run even when the
completion took the clock, as the plain unroll does; a longer period per micro-batch than the
repetend's may still unroll shorter on few micro-batches: interleaved-zb, 6 devices, unit costs,
latency 0.5, 18 micro-batches, 12 activations a device: 79 at 7.67 per micro-batch, where the
repetend at 7 completes to 81.5);
the shortest is offered, then completed like the repetend (complete.completed) while the clock
lasts and when the unroll is within Budget.settle of the best (a grouped unroll well behind a
repetend that meets the load bound completes behind it too: the clock is left to the others). Ranked by the compacted unroll, not by span: at 4 devices, profiled costs and latency,
12 micro-batches, the grouped repetend of least span unrolls to 33.06 (completed: 32.82), the
other to 32.50 (the peer's hand-made order: 32.48).
"""
from __future__ import annotations

from ...schedule import Schedule
from ..budget import Clock
from ..completion import compact, plain_unroll
from ..grouped import grouped
from ..modulo import Modulo
from ..state import State
from .complete import completed, sizes, with_kernel

BASE = "grouped"  # meta.base of a grouped repetend's compacted unroll


def rounds(state: State, clock: Clock) -> None:
    """The shortest compacted unroll of a grouped repetend offered, then that repetend completed
    when the unroll is close to the best; the repetend becomes it when either is kept."""
    mod = state.modulo
    if mod is None or not state.affords(state.budget.own_builds):
        return
    todo = [(s, m) for m in grouped(state.problem) for s in [unrolled(state, m)] if s is not None]
    if not todo:
        return
    s, m = min(todo, key=lambda x: x[0].makespan)
    state.statuses["grouped"] = [x.makespan for x, _ in todo]
    if state.offer(s):
        state.modulo = m
    if not clock.expired() and state.best is not None and \
            state.value(s) <= state.value(state.best) * (1 + state.budget.settle) and \
            state.offer(completed(state, m, clock, "completion_grouped")):
        state.modulo = m


def unrolled(state: State, mod: Modulo) -> Schedule | None:
    """`mod` unrolled on the completion's working micro-batches and compacted, then to N (None
    when that needs a kernel and none of it unrolls; on N itself, without one, as the completion's)."""
    p, n = state.problem, state.micro_batches
    _, work = sizes(p, mod, n)
    starts = compact(p, work, plain_unroll(mod, work))
    s = with_kernel(p, work, starts, [(mod.period, mod.copies)], BASE)
    if n == work:
        return s or with_kernel(p, n, starts, [], BASE)
    return s.unroll(n) if s is not None else None

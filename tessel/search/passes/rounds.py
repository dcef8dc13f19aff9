"""Passes (mode tessel): the grouped repetends of a looped placement (grouped.py), unrolled,
then completed.

On interleaved placements the period search's repetends hold one or two micro-batches and
complete long where latency must be hidden; a group of p micro-batches going through each chunk
round in turn hides it, and no solve finds that repetend in seconds. So, before the period
search and the completion (their solves may take the rest of a loaded machine's clock: at 8
devices the list schedules alone take it a second or two), each grouped repetend is unrolled
and compacted (linear builds, no solver), and the shortest becomes a seed (State.seeds, offered
after the completion by passes/justify.justify_both and polished by passes/orders.py) and
State.grouped; the shortest of the variants' own list schedules of N micro-batches
(grouped.grouped_lists) is a seed too (interleaved-zb, 16 devices, profiled costs, 32
micro-batches, 32 activations a device: 90.40 where the grouped unroll compacts to 102.22).
Ranked by the compacted unroll, not by span nor by period: at 4 devices,
profiled costs and latency, 12 micro-batches, the grouped repetend of least span unrolls to
33.06 (completed: 32.82), the other to 32.50 (the peer's hand-made order: 32.48); a longer period
per micro-batch than the repetend's may still unroll shorter on few micro-batches
(interleaved-zb, 6 devices, unit costs, latency 0.5, 18 micro-batches, 12 activations a device:
79 at 7.67 per micro-batch, where the repetend at 7 completes to 81.5).

After the completion and only while the best is more than Budget.settle from the proven bound
(a settle pass), the grouped repetend is completed like the search's own (complete.completed)
when its unroll is within Budget.settle of the best and the clock lasts; the repetend becomes
it when its unroll or completion is the best.
"""
from __future__ import annotations

from ...schedule import Schedule
from ..budget import Clock
from ..completion import compact, makespan, plain_unroll
from ..grouped import grouped, grouped_lists
from ..modulo import Modulo
from ..state import State
from .complete import completed, sizes, with_kernel

BASE = "grouped"  # meta.base of a grouped repetend's compacted unroll
LISTED = "grouped-list"  # ... and of a grouped variant's list schedule of N micro-batches
# of the clock left, the variants' list schedules of N at most: a bound, not a budget (16 devices,
# profiled costs, latency: 0.18 s at 32 micro-batches, 0.3-0.4 s at 64 under 32 or 20 activations
# a device, load 11.5 on 2 cores; under a limit no cap fits, 33 list schedules for none)
LISTS_SHARE = 0.3


def grouped_seed(state: State, clock: Clock) -> None:
    """The shortest compacted unroll of a grouped repetend: a seed, and State.grouped; the
    shortest of the variants' own list schedules of N micro-batches another seed."""
    if clock.expired() or not state.affords(state.budget.own_builds):
        return
    lists = grouped_lists(state.problem, state.micro_batches, clock.share(LISTS_SHARE).deadline)
    if lists:
        state.seeds.append(state.problem.schedule(state.micro_batches, lists[0], None, None,
                                                  {"base": LISTED, "repetend": "none"}))
        state.statuses["grouped_list"] = state.problem.real(makespan(state.problem, lists[0]))
    todo = [(s, m) for m in grouped(state.problem, clock.deadline) if not clock.expired()
            for s in [unrolled(state, m)] if s is not None]
    if not todo:
        return
    state.statuses["grouped"] = [x.makespan for x, _ in todo]
    state.grouped = min(todo, key=lambda x: x[0].makespan)
    state.seeds.append(state.grouped[0])


def grouped_completion(state: State, clock: Clock) -> None:
    """The grouped repetend completed when its unroll is close to the best; the repetend is it
    when either is the best."""
    if state.grouped is None or state.best is None:
        return
    s, m = state.grouped
    if state.best is s:
        state.modulo = m
    if not clock.expired() and state.value(s) <= state.value(state.best) * (1 + state.budget.settle) \
            and state.offer(completed(state, m, clock, "completion_grouped")):
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

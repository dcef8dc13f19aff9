"""Pass (mode tessel): which repetend at the period found to complete, by a quick completion.

The period search keeps the repetend of least span at its period, a proxy for the warm-up's
length. On interleaved placements with latency the proxy misleads: at the same period (the load
bound, proven) the constructions of fast.py (each block at the earliest phase free after its
inputs) complete shorter, their micro-batches following each other chunk by chunk as in a
hand-made interleaved order (interleaved-zb, 4 devices, unit costs, latency 0.5, Interleaved1F1B's
memory: at 8 / 12 / 16 micro-batches the least-span repetend completes to 34.5 / 45 / 57, the
construction to 33.5 / 44 / 56.5; torch's Interleaved1F1B runs 32 / 44 / 56). So, after the
completion and only while the best is more than Budget.settle from the proven bound (a settle
pass: the public suite meets its bounds and never pays for it), when a construction at that
period fits memory and differs from the repetend, each candidate gets a quick completion
(compaction, then one warm-up and one cool-down solve freeing QUICK micro-batches, on the
completion's stall: deterministic work); a construction shorter there is completed like the
repetend (complete.completed) and kept when that is shorter too. The quick completion is a
proxy, and misleads at times (8 micro-batches above: the construction's 33.5 against 33): the
full completion decides.
"""
from __future__ import annotations

from ..budget import Clock
from ..completion import compact, complete, makespan, plain_unroll
from ..fast import constructions
from ..modulo import Modulo, fits
from ..state import State
from .complete import completed, sizes

QUICK = 3  # micro-batches freed at each end by the quick completion (the completion's first, cheap size)
MOST = 2  # constructions ranked at most (each a quick completion)


def shapes(state: State, clock: Clock) -> None:
    """After the completion: the construction at the repetend's period whose quick completion is
    shorter than the repetend's, completed like it; it replaces the best (and the repetend) when shorter."""
    mod = state.modulo
    if mod is None or clock.expired() or not state.affords(state.budget.own_builds):
        return
    todo = others(state, mod, clock)
    if not todo:
        return
    best, length = mod, quick(state, mod, clock)
    lengths = [length]
    for other in todo:
        if clock.expired():
            break
        x = quick(state, other, clock)
        lengths.append(x)
        if x < length:
            best, length = other, x
    state.statuses["shapes"] = [state.problem.real(x) for x in lengths]
    if best is not mod and not clock.expired() and state.offer(completed(state, best, clock, "completion_construct")):
        state.modulo = best


def quick(state: State, mod: Modulo, clock: Clock) -> int:
    """The makespan (grid) of `mod` completed quickly on the working number of micro-batches."""
    p, b = state.problem, state.budget
    free, work = sizes(p, mod, state.micro_batches)
    plain = compact(p, work, plain_unroll(mod, work))
    if not free:
        return makespan(p, plain)
    k = min(QUICK, max(free))
    stall = b.completion_stall(k, len(p.block_ids))
    done = complete(p, plain, work, [k], clock, state.workers, stall, 0, b.cap(stall, state.workers))
    return makespan(p, done.starts)


def others(state: State, mod: Modulo, clock: Clock) -> list[Modulo]:
    """The constructions at `mod`'s period (one micro-batch each) that fit memory and are not `mod`."""
    p = state.problem
    if mod.copies != 1:
        return []
    seen = {tuple(sorted(mod.starts().items()))}
    out = []
    for m in constructions(p, mod.period, clock.deadline):
        key = tuple(sorted(m.starts().items()))
        if key not in seen and fits(p, m):
            seen.add(key)
            out.append(m)
    return out[:MOST]

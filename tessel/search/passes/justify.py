"""Passes (mode fast): justification (search/justify.py) of the best schedule so far, the
raced baselines' included; kept when shorter. At 32 devices this, not the completion solves,
is what packs the long warm-up and cool-down, so fast justifies first, from its repetend
unrolled and compacted, and completes only when that is not enough and the clock still allows
completion solves (an answer at the bound skips the completion's builds altogether)."""
from __future__ import annotations

import logging
from collections.abc import Mapping

from ...key import Key
from ...schedule import Schedule, ScheduleError
from ..budget import Clock
from ..completion import compact, makespan, plain_unroll
from ..justify import JUSTIFY_ROUNDS, justified
from ..modulo import Modulo
from ..problem import Problem
from ..state import State
from .complete import completed, completion, grid_starts, sizes, with_kernel

log = logging.getLogger(__name__)
BASE = "justified"  # meta.base of a justified schedule
KERNEL_TRIES = 1  # a try builds and unrolls the whole schedule (seconds at 32 devices)
SHIFTS = (1, 2)  # micro-batches a kernel of the justified schedule may advance


def justification(state: State, clock: Clock) -> None:
    """The best seed justified: state.best (else the repetend unrolled and compacted) or a
    raced baseline on the grid, whichever is shortest; nothing when the best is justified
    already (its rounds stopped where they could not improve)."""
    p, n = state.problem, state.micro_batches
    if state.best is not None and state.best.meta.get("base") == BASE \
            or state.budget.justify_rounds(state.clock.limit, n * len(p.block_ids)) < 1:
        return
    seeds = [grid_starts(p, s) for s in [state.best, *state.rivals] if s is not None]
    if state.best is None and state.modulo is not None:
        seeds.insert(0, compact(p, n, plain_unroll(state.modulo, n)))
    ready = [s for s in seeds if s is not None]
    if not ready:
        return
    seed = min(ready, key=lambda st: makespan(p, st))  # stable: our own first among equals
    rounds = state.budget.justify_rounds(state.clock.limit, n * len(p.block_ids))
    new = justified(p, n, seed, state.grid_bound(n), rounds)
    if new is None:
        return
    try:
        state.offer(_with_kernel(p, n, new, state.modulo))
    except ScheduleError as e:  # the walks keep every rule; should one not, the search goes on without it
        log.warning("justified schedule refused: %s", e)


def unrolled(state: State, clock: Clock) -> None:
    """Mode tessel, before the completion solves (which may take the rest of a loaded machine's
    clock): the repetend's plain unroll justified, a seed (State.seeds) that `justify_both`
    offers and the order polish starts from too. On the real durations either it or the
    completed schedule may polish shorter (zbv-4, profiled costs and latency, 8 micro-batches:
    polished, the completed one 21.81 where the unrolled one gives 22.56, and 22.14 where it
    gives 22.58)."""
    p, n, mod = state.problem, state.micro_batches, state.modulo
    # only where the completion works on N itself (few micro-batches: the ramps are most of the schedule)
    if mod is None or sizes(p, mod, n)[1] != n or state.budget.justify_rounds(state.clock.limit, n * len(p.block_ids)) < 1 \
            or not state.affords(state.budget.own_builds):  # a walk, a kernel check, the schedule: as a completion
        return
    seed = _justified_unroll(state, mod)
    if seed is not None:
        state.seeds.append(seed)


def construction(state: State, clock: Clock) -> None:
    """Mode tessel, when its answer is still more than Budget.settle above the bound: the
    starting construction's unroll justified, mode fast's seed, offered. At any N (the repetend's
    own unroll is a seed only at few micro-batches): interleaved at 32 devices, N = 128, memory
    64, tessel stopped at 1245 where fast, from the construction, reaches 1232."""
    p, n, start = state.problem, state.micro_batches, state.start
    if start is None or start is state.modulo or not state.affords(state.budget.own_builds):
        return
    state.offer(_justified_unroll(state, start, state.budget.justify_rounds(state.clock.limit, n * len(p.block_ids))))


def _justified_unroll(state: State, mod: Modulo, rounds: int = JUSTIFY_ROUNDS) -> Schedule | None:
    """`mod`'s plain unroll, compacted and justified, as a schedule; None when the walks find
    nothing shorter (or refuse it)."""
    p, n = state.problem, state.micro_batches
    new = justified(p, n, compact(p, n, plain_unroll(mod, n)), state.grid_bound(n), rounds)
    if new is None:
        return None
    try:
        return _with_kernel(p, n, new, mod)
    except ScheduleError as e:  # as in justification
        log.warning("justified schedule refused: %s", e)
        return None


def justify_both(state: State, clock: Clock) -> None:
    """Mode tessel: the completed schedule justified (`justification`), then the seeds offered
    (the justified unroll: `unrolled`); those that lose stay seeds of the order polish. Not when
    the clock cannot hold the builds a completion takes (then the plain unroll is the answer)."""
    if not state.affords(state.budget.own_builds):
        return
    justification(state, clock)
    for s in list(state.seeds):
        if state.offer(s):
            state.seeds.remove(s)


def completion_after(state: State, clock: Clock) -> None:
    """Completion when nothing is justified yet (state.best is then the completed repetend),
    else its result offered, when the clock still allows its solves (without them it is the
    compaction that justification starts from)."""
    if state.best is None:
        completion(state, clock)
    elif state.modulo is not None and not clock.expired():
        state.offer(completed(state, state.modulo, clock))


def _with_kernel(p: Problem, n: int, starts: Mapping[Key, int], mod: Modulo | None) -> Schedule:
    """The justified schedule with a kernel when one of the guesses unrolls, else without."""
    for kernel in _guesses(p, n, starts, mod):
        s = with_kernel(p, n, starts, [kernel], BASE, KERNEL_TRIES)
        if s is not None:
            return s
    s = with_kernel(p, n, starts, [], BASE)
    assert s is not None, "a schedule without a kernel is always built"
    return s


def _guesses(p: Problem, n: int, starts: Mapping[Key, int], mod: Modulo | None) -> list[tuple[int, int]]:
    """Kernels (period, shift) to try: the steady state the justification settled into, read
    off the first block in the middle micro-batches (it may be shorter than the repetend's
    period: the walk is not held to the construction's memory pattern), then the repetend's."""
    b, mid, out = p.block_ids[0], n // 2, []
    for k in SHIFTS:
        if mid + k < n:
            out.append((starts[(b, mid + k)] - starts[(b, mid)], k))
    if mod is not None:
        out.append((mod.period, mod.copies))
    return [x for i, x in enumerate(out) if x[0] > 0 and x not in out[:i]]

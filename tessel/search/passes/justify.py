"""Pass (mode fast): the best schedule so far, the raced baselines' included, justified
backward and forward (search/justify.py); kept when shorter. At 32 devices this, not the
completion solves, is what packs the long warm-up and cool-down."""
from __future__ import annotations

from collections.abc import Mapping

from ...key import Key
from ...schedule import Schedule
from ..budget import Clock
from ..justify import justified
from ..modulo import Modulo
from ..problem import Problem
from ..state import State
from .complete import grid_starts, with_kernel

KERNEL_TRIES = 1  # a try builds and unrolls the whole schedule (seconds at 32 devices)
SHIFTS = (1, 2)  # micro-batches a kernel of the justified schedule may advance


def justification(state: State, clock: Clock) -> None:
    p, n = state.problem, state.micro_batches
    seeds = [s for s in [state.best, *state.rivals] if s is not None]
    if not seeds:
        return
    seed = min(seeds, key=state.value)  # stable: our own schedule first among equals
    starts = grid_starts(p, seed)
    new = None if starts is None else justified(p, n, starts, state.grid_bound(n))
    if new is not None:
        state.offer(_with_kernel(p, n, new, state.modulo))


def _with_kernel(p: Problem, n: int, starts: Mapping[Key, int], mod: Modulo | None) -> Schedule:
    """The justified schedule with a kernel when one of the guesses unrolls, else without."""
    for kernel in _guesses(p, n, starts, mod):
        s = with_kernel(p, n, starts, [kernel], "justified", KERNEL_TRIES)
        if s is not None:
            return s
    s = with_kernel(p, n, starts, [], "justified")
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

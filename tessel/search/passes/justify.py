"""Pass (mode fast): the best schedule so far, the raced baselines' included, justified
backward and forward (search/justify.py); kept when shorter. At 32 devices this, not the
completion solves, is what packs the long warm-up and cool-down."""
from __future__ import annotations

from ..budget import Clock
from ..justify import justified
from ..state import State
from .complete import grid_starts, with_kernel

KERNEL_TRIES = 1  # a try builds and unrolls the whole schedule (seconds at 32 devices)


def justification(state: State, clock: Clock) -> None:
    p, n = state.problem, state.micro_batches
    seeds = [s for s in [state.best, *state.rivals] if s is not None]
    if not seeds:
        return
    seed = min(seeds, key=state.value)  # stable: our own schedule first among equals
    starts = grid_starts(p, seed)
    new = None if starts is None else justified(p, n, starts, state.grid_bound(n))
    if new is None:
        return
    kernels = [] if state.modulo is None else [(state.modulo.period, state.modulo.copies)]
    s = with_kernel(p, n, new, kernels, "justified", KERNEL_TRIES) if kernels else None
    state.offer(s or with_kernel(p, n, new, [], "justified"))

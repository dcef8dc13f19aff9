"""Pass: a repetend that fits memory before any period search, so the search holds a valid
schedule from the start (it is anytime)."""
from __future__ import annotations

from collections.abc import Sequence

from ...numeric import fmt, rounded
from ...placement import Number
from ..budget import Clock
from ..completion import makespan
from ..exact import solve_exact
from ..fast import NoFitError, sequential, starting_repetend
from ..justify import listed_repetend
from ..modulo import Modulo, steady_memory
from ..problem import MemoryLimitError, Problem, least_memory, limits_hint
from ..state import State
from .race import race


def start(state: State, clock: Clock) -> None:
    """state.start: the smallest construction that fits (Budget.start_share of the clock), else
    one micro-batch at a time, else a solve of one micro-batch (Budget.fit_share); raises
    MemoryLimitError when the solver proves that not even one micro-batch fits. When nothing is
    decided in time the best baseline (raced now if it was not yet) stands in as state.best."""
    p, b = state.problem, state.budget
    try:
        state.start = starting_repetend(p, clock.share(b.start_share))
        return
    except NoFitError:
        pass
    res = solve_exact(p, 1, clock.share(b.fit_share), state.workers)
    state.statuses["fit"] = res.status
    if res.status == "infeasible":
        raise no_fit(p) from None
    if not res.found:
        race(state, clock)  # mode tessel races the baselines later, when its own schedule needs them
        if state.rivals:
            state.best = min(state.rivals, key=state.value)
            return
        raise MemoryLimitError(f"no schedule of {p.placement.name!r} found within the time limit: "
                               f"one micro-batch at a time does not fit the memory limit "
                               f"{fmt_list(p.real_limit())} in the order tried; give a longer time limit "
                               f"or raise the limits") from None
    starts = res.starts()
    state.start = Modulo.from_starts(makespan(p, starts), {(blk, 0): v for (blk, _), v in starts.items()})


def listed(state: State, clock: Clock) -> None:
    """state.start replaced by the repetend read off its justified unroll (justify.listed_repetend)
    when that one has a smaller period per micro-batch, or the same with a shorter span: where no construction
    fits memory at the load bound, the period search then starts there, with a hint that fits
    (a solve at the bound without one needs seconds of a loaded machine to find any)."""
    p, start = state.problem, state.start
    if start is None or start.per_micro_batch <= p.period_floor:
        return
    mod = listed_repetend(p, start)
    if mod is not None and (mod.per_micro_batch, mod.span(p)) < (start.per_micro_batch, start.span(p)):
        state.start = mod
        state.statuses["listed"] = [p.real(mod.period), mod.copies, p.real(mod.span(p))]


def no_fit(p: Problem) -> MemoryLimitError:
    """The solver proved that no order of one micro-batch fits: name, per device over its limit,
    what one micro-batch at a time reaches (limits that work) and the proven least."""
    scale = p.memory_scale
    one = steady_memory(p, sequential(p))
    least = least_memory(p.units)
    limit = p.limit or ()
    where = ", ".join(f"device {d} reaches {_real_memory(one[d], scale)} one micro-batch at a time (limit "
                      f"{_real_memory(limit[d], scale)}, proven least {_real_memory(least[d], scale)})"
                      for d in range(len(one)) if one[d] > limit[d])
    return MemoryLimitError(f"no order of one micro-batch of {p.placement.name!r} fits the memory limit "
                            f"{fmt_list(p.real_limit())} (proven by the solver): {where}; limits that work: "
                            f"{limits_hint([_real_memory(x, scale) for x in one])}")


def _real_memory(x: int, scale: int) -> Number:
    return x if scale == 1 else rounded(x / scale, 6)


def fmt_list(xs: Sequence[Number] | None) -> str:
    return fmt(list(xs or ()), digits=6)

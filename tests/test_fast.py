"""Mode fast at 32 devices: its starting repetend does not depend on how loaded the machine is."""
from __future__ import annotations

from tessel import library
from tessel.search.budget import Clock
from tessel.search.fast import sequential, starting_repetend
from tessel.search.modulo import fits
from tessel.search.problem import make_problem


def test_a_clock_already_out_still_tries_the_periods_next_to_the_bound() -> None:
    # interleaved at 32 devices under 2 x devices of memory: nothing fits at the load bound (8),
    # the construction fits one step up; one micro-batch at a time would be a period of 256
    p = make_problem(library.build("interleaved", devices=32), 64)
    expired = Clock(0.0)
    assert expired.expired()
    mod = starting_repetend(p, expired)
    assert fits(p, mod) and mod.period == p.period_bound + 1 == 9
    assert sequential(p).period == 256

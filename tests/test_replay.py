"""The polish's fast replay (tessel.search.replay): the same start times as timing.earliest_starts,
float for float, and None where the orders deadlock."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.baselines import BASELINES, orders
from tessel.search.replay import Replayer
from tessel.timing import DeadlockError, earliest_starts, orders_of


@pytest.mark.parametrize("name", ["1f1b", "zb-v-hand", "greedy"])
def test_the_same_floats_as_earliest_starts(name: str) -> None:
    # fractional costs and latency: any other order of the sums would show in the last bits
    p, n = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032), 8
    found = orders(name, p, n) or orders_of(BASELINES[name](p, n, None))
    want = earliest_starts(p, n, found)
    got = Replayer(p, n).starts(found)
    assert got == want and list(want.values()) != [0] * len(want)
    timed = Replayer(p, n).timed(found, 0.01)
    assert timed is not None and timed[0] == want
    ends = [t + p.by_id[b].duration for (b, _), t in want.items()]
    assert timed[1] == pytest.approx(max(ends))


def test_orders_that_wait_on_each_other_give_none() -> None:
    # device 0 runs its backward passes first: each waits for a forward queued behind it
    p, n = library.vshape(2), 3
    found = orders_of(BASELINES["gpipe"](p, n, None))
    found[0] = list(reversed(found[0]))
    with pytest.raises(DeadlockError):
        earliest_starts(p, n, found)
    assert Replayer(p, n).starts(found) is None and Replayer(p, n).timed(found, 0.01) is None

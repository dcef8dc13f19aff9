"""Float dust in a replay: orders timed by summing costs can put a start a hair below an integer,
which Schedule.build snaps up, so the release it ends comes a hair after the allocation timed at
its end (rule 4: one activation over). The replay settles it (tessel.dust) instead of failing."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.schedule import Schedule
from tessel.search.passes.final import _compacted
from tessel.timing import schedule_from_orders

# one device, F = B = 1.1, W = 0.2, 20 micro-batches one at a time: a W's start sums to a hair
# below an integer (found by trying costs; a limit of one activation leaves no room for the hair)
P, N = library.zb(1, forward=1.1, backward=1.1, weight=0.2), 20
ORDER = [(b.id, m) for m in range(N) for b in P.blocks]


def test_a_replay_with_float_dust_is_valid_under_a_tight_limit() -> None:
    s = schedule_from_orders(P, N, [ORDER], [1])
    assert s.errors() == [] and s.peak_memory == (1,)
    assert s.makespan == pytest.approx(N * 2.4)


def test_the_final_compaction_keeps_a_replay_with_float_dust() -> None:
    # the same orders with a slot of 3 per task (integer starts: no dust), compacted on the real
    # durations: without the settle the replay failed rule 4 and the loose schedule was kept
    loose = Schedule.build(P, N, {k: 3 * i for i, k in enumerate(ORDER)}, [1])
    tight = _compacted(loose)
    assert tight.errors() == [] and tight.peak_memory == (1,)
    assert tight.makespan == pytest.approx(N * 2.4) and loose.makespan > N * 2.4 + 1

"""Warm starts (tessel/search/warm.py, `tessel search --start FILE`): a schedule a user brings is
timed again on the placement from its device orders, raced and polished: the answer is never
longer than it; one that does not match or fit is refused naming why, and the CLI writes nothing."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel.baselines import BASELINES, vmem
from tessel.errors import SearchError
from tessel.library import zbv
from tessel.placement import Placement
from tessel.schedule import Schedule
from tessel.search import Budget, search
from tessel.search.budget import Clock
from tessel.search.passes.whole import cuts
from tessel.search.problem import make_problem
from tessel.search.state import State
from tessel.search.warm import warm_start
from tessel.timing import orders_of

V_MIN = (6,) * 6  # V-Min's chunk activations a device on zbv, 6 devices


def _profiled(devices: int = 6, latency: float = 0.032) -> Placement:
    return zbv(devices, forward=0.5, backward=0.488, weight=0.252, latency=latency)


def test_a_search_never_answers_longer_than_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # v-mem without its squeezed blocks: with them a second's search finds the cuts' 42.432 too
    # (tests/test_squeeze.py), and a start is only seen to win where the search alone is longer
    monkeypatch.setattr(vmem, "SQUEEZED", ())
    v = _profiled()
    # a good start: v-mem's schedule improved by the cuts' whole-problem solve (test_cuts.py)
    state = State(make_problem(v, V_MIN, 12), 12, Clock(120.0), 1, None, Budget(race=False, cuts_least=4.0),
                  "makespan")
    state.best = BASELINES["v-mem"](v, 12, V_MIN)
    cuts(state, Clock(120.0))
    good = state.best
    assert good is not None
    plain = Budget(race=False, cuts_least=0.0, cuts_share=0.0)  # a second's search without the cuts' solve of its own
    short = search(v, 12, memory=V_MIN, time_limit=1, budget=plain)
    got = search(v, 12, memory=V_MIN, time_limit=1, budget=plain, starts={"cuts.json": good})
    assert got.errors() == [] and got.makespan <= good.makespan + 1e-9
    assert short.makespan > good.makespan + 1e-9  # that search alone is longer: the start wins ...
    assert str(got.meta["base"]).startswith("start:cuts.json")
    path = tmp_path / "s.json"
    got.save(path)
    checker_verdict(path)


def test_a_start_timed_by_other_costs_is_timed_again_on_the_placement() -> None:
    unit = BASELINES["zb-v-hand"](zbv(4), 8, None)
    v = _profiled(4)
    s = warm_start(unit, v, 8, None, "unit.json")
    assert s.errors() == [] and orders_of(s) == orders_of(unit)
    assert s.makespan != unit.makespan and s.meta["method"] == "start:unit.json"


@pytest.mark.parametrize("other,n,limit,message", [
    (zbv(6), 8, None, "start x.json: block 'f4' runs on device(s) 3 there, on 4 here"),
    (zbv(4), 12, None, "start x.json: it has 8 micro-batches, the search 12"),
    (zbv(4), 8, (3, 3, 3, 3), "start x.json: timed on this placement it is not valid: rule 4: device 0: memory reaches"),
])
def test_a_start_that_does_not_match_or_fit_is_refused_naming_why(other: Placement, n: int,
                                                                  limit: tuple[int, ...] | None, message: str) -> None:
    start = BASELINES["1f1b"](zbv(4), 8, None)
    with pytest.raises(SearchError) as e:
        warm_start(start, other, n, limit, "x.json")
    assert str(e.value).startswith(message), str(e.value)


def test_the_cli_starts_from_a_file_and_refuses_one_that_does_not_fit(tessel, tmp_path: Path) -> None:
    base = tmp_path / "1f1b.json"
    rc, _, err = tessel("baseline", "1f1b", "zbv", "--devices", "4", "-n", "8", "-o", base)
    assert rc == 0, err
    out = tmp_path / "s.json"
    rc, stdout, err = tessel("search", "zbv", "--devices", "4", "-n", "8", "--time-limit", "3", "--start", base, "-o", out)
    assert rc == 0, err
    assert Schedule.load(out, check=True).makespan <= Schedule.load(base).makespan + 1e-9
    bad = tmp_path / "bad.json"
    rc, _, err = tessel("search", "zbv", "--devices", "4", "-n", "8", "--memory", "3", "--time-limit", "3",
                        "--start", base, "-o", bad)
    assert rc != 0 and f"start {base}: timed on this placement it is not valid: rule 4" in err and not bad.exists()
    rc, _, err = tessel("search", "zbv", "--devices", "4", "-n", "8", "--start", tmp_path / "none.json", "-o", bad)
    assert rc != 0 and "none.json" in err and not bad.exists()

"""The best raced baseline on the grid (search/passes/rivals.grid_baseline): the one of least real
makespan, run again on the grid's durations; a warm start (no generator) is passed over."""
from __future__ import annotations

from tessel import library
from tessel.baselines import run_baseline
from tessel.search.budget import Clock
from tessel.search.passes.rivals import grid_baseline
from tessel.search.problem import make_problem


def test_the_best_real_baseline_is_the_one_run_again_on_the_grid() -> None:
    # zbv, 4 devices, profiled costs with latency: durations off the binary grid, so the grid rounds up
    z = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    n, limit = 8, 6
    rivals = [run_baseline(name, z, n, limit) for name in ("zb-v-min", "v-mem", "zb-v-half")]
    assert all(s.errors() == [] for s in rivals) and len({s.makespan for s in rivals}) > 1
    best = min(rivals, key=lambda s: s.makespan)
    problem = make_problem(z, limit)
    assert not problem.exact_time
    got = grid_baseline(problem, n, rivals, Clock(60))
    assert got is not None
    name, grid = got
    assert name == best.meta["method"]
    assert grid.errors() == [] and max(grid.peak_memory) <= problem.cap(0)
    # the grid's durations are the real ones rounded up: the grid schedule is no shorter
    assert problem.real(grid.makespan) >= best.makespan - 1e-9
    # a warm start ahead of it has no generator to run again: the next one is taken
    warm = best.with_meta(method="warm start")
    again = grid_baseline(problem, n, [warm, *rivals], Clock(60))
    assert again is not None and again[0] == name
    # every baseline run again (Budget.grid_rivals 0): the shortest on the grid, here the same one
    every = grid_baseline(problem, n, rivals, Clock(60), 0)
    assert every is not None and every[0] == name and every[1].makespan == grid.makespan

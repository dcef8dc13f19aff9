"""The exact relaxations (tessel.search.relax), of one device and of several at once: proven below
the exact optimum on small random placements with latency and memory and on the library's
placements; the one-device one tighter than the preemptive device bound where a micro-batch's
round trip and the memory limit meet (the V), the group one tighter than the one-device one where
the devices' interaction under memory decides (V-Min's memory)."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict
from test_bounds import _tiny, _tiny_v

from tessel import bounds, library
from tessel.library import zbv
from tessel.placement import Number, Placement
from tessel.search import Budget, relax, search
from tessel.search.budget import Clock
from tessel.search.exact import solve_exact
from tessel.search.fast import sequential
from tessel.search.modulo import steady_memory
from tessel.search.problem import Problem, least_memory, make_problem
from tessel.search.relax import group_bound, relaxed_bound


def _optimum(p: Placement, n: int, memory: Number | tuple[Number, ...] | None) -> tuple[Problem, Number] | None:
    """The problem and its exact optimum (a schedule the rules accept), or None when the solve
    does not prove optimality."""
    problem = make_problem(p, memory)
    res = solve_exact(problem, n, Clock(30.0), 1)
    if res.status != "optimal" or res.objective is None:
        return None
    s = problem.schedule(n, res.starts(), None, None, {})
    assert s.errors() == []
    return problem, s.makespan


def _check(p: Placement, n: int, memory: Number | tuple[Number, ...] | None) -> tuple[Number, Number, Number] | None:
    """(optimum, preemptive device bound, relaxation) with the relaxation's horizon far above
    the optimum (any valid schedule's makespan may be given: the proof must not lean on it)."""
    got = _optimum(p, n, memory)
    if got is None:
        return None
    problem, opt = got
    # the preemptive one-machine bound, without the memory ramp: the bound the relaxation refines
    device = bounds.device_lower_bound(p, n, problem.real_holds() if memory is not None else None, ramp=False)
    relaxed = relaxed_bound(problem, n, upper=2 * opt + 10, work=2.0)
    assert relaxed <= opt + 1e-9, (p.name, n, memory, opt, relaxed)
    return opt, device, relaxed


@pytest.mark.slow
def test_the_relaxation_is_below_the_exact_optimum_on_random_placements() -> None:
    proven, higher, reached = 0, 0, 0
    for seed in range(40):
        got = _check(*_tiny(seed))
        if got is None:
            continue
        opt, device, relaxed = got
        proven += 1
        higher += relaxed > device + 1e-9
        reached += abs(relaxed - opt) < 1e-9
    assert proven >= 30 and higher >= 3 and reached >= proven * 3 // 4, (proven, higher, reached)


LIBRARY = [(library.zbv, 2, 4), (library.zbv, 3, 4), (library.zb, 3, 4), (library.xshape, 2, 3),
           (library.mshape, 3, 3), (library.interleaved, 2, 3), (library.vshape, 3, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("build,devices,n", LIBRARY)
def test_the_relaxations_are_below_the_exact_optimum_on_library_placements(build: object, devices: int,
                                                                           n: int) -> None:
    p = build(devices, latency=1)  # type: ignore[operator]
    problem = make_problem(p)
    tight = tuple(max(a, b) for a, b in zip(steady_memory(problem, sequential(problem)), least_memory(problem.units)))
    for memory in (None, tight):  # one device at a time, then several at once (relax.group_bound)
        assert _check(p, n, memory) is not None and _group_check(p, n, memory) is not None


def test_the_tip_of_a_v_idles_while_its_first_round_trip_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    # zbv, 2 devices, unit chunks, latency 2, 1 M_B (two micro-batches in flight): the device at
    # the tip runs two micro-batches' forwards, then waits for the first one's backward to come
    # back through the other device, and the last ones' round trips leave it idle at the end;
    # the preemptive bound runs the waiting work in pieces around the waits (30; 29 with the
    # device term of the staggered releases from the first releases only). The work the tip spends
    # giving memory back before each later forward (holds.release_floors) proves 35 too, and what it
    # runs before that memory comes back (holds.memory_cycles) 33: both left out here
    v = library.zbv(2, forward=1, backward=1, weight=1, latency=2)
    assert bounds.device_lower_bound(v, 4, make_problem(v, 4).real_holds()) == 35
    monkeypatch.setattr(bounds, "release_floors", lambda *_: {})
    monkeypatch.setattr(bounds, "memory_cycles", lambda *_: {})
    got = _check(v, 4, 4)
    assert got is not None
    opt, device, relaxed = got
    assert device == 30 < relaxed == opt == 35


@pytest.mark.slow
def test_a_16_device_v_under_1f1b_memory_is_proven_at_the_best_known_schedule(tmp_path: Path) -> None:
    # bench/results/peers-mem1.md's zbv row p = 16, m = 24, unit costs, latency 0.5, 1 M_B:
    # the arguments prove 116.5 (109 without the device's work to give memory back, 103 with the
    # memory ramp at one end at a time, 101.5 before the device term saw memory-delayed releases),
    # the zero-bubble repository's schedule is 116.5; the relaxation of the tip device proves 116.5.
    # Checked against the search's own schedule here
    v = library.zbv(16, forward=0.5, backward=0.5, weight=0.5, latency=0.5)
    problem = make_problem(v, 32)
    s = search(v, 24, 32, mode="fast", time_limit=20)
    assert s.errors() == []
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    device = bounds.device_lower_bound(v, 24, problem.real_holds(), bounds.RELAX_TERM_WORK)
    relaxed = relaxed_bound(problem, 24, upper=s.makespan, floor=device, devices=1)
    assert device == 116.5 and relaxed == 116.5 <= s.makespan


def test_a_search_asked_to_prove_reports_the_relaxation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the V of the test above: the arguments prove 30 without holds.release_floors; with --prove
    # the relaxation proves the schedule the search finds optimal, and says so
    monkeypatch.setattr(bounds, "release_floors", lambda *_: {})
    v = library.zbv(2, forward=1, backward=1, weight=1, latency=2)
    s = search(v, 4, 4, time_limit=20, budget=Budget(prove=True))
    assert s.errors() == []
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.meta["bound_source"] == "relaxation" and s.meta["lower_bound"] == 35 == s.makespan
    assert s.meta["status"] == "optimal" and "relaxation" in s.meta["seconds"]
    plain = search(v, 4, 4, time_limit=20)  # by default the relaxations' work is not spent (the cuts' probes may prove)
    assert plain.errors() == [] and plain.meta["bound_source"] != "relaxation" and plain.meta["lower_bound"] <= 35


def _group_check(p: Placement, n: int, memory: Number | tuple[Number, ...] | None) -> tuple[Number, Number, Number] | None:
    """(optimum, one-device relaxation, group relaxation), the group's proof on its own (no floor)
    and its horizon far above the optimum; with the one-device bound as its floor it never ends lower."""
    got = _optimum(p, n, memory)
    if got is None:
        return None
    problem, opt = got
    one = relaxed_bound(problem, n, upper=2 * opt + 10, work=2.0)
    group = group_bound(problem, n, upper=2 * opt + 10, work=2.0)
    assert group <= opt + 1e-9, (p.name, n, memory, opt, group)
    assert group_bound(problem, n, upper=2 * opt + 10, floor=one, work=2.0) >= one
    # every group (the tip's memory alone, the tip alone too) asked for the optimum and for more
    # first: a target only orders the solves, never proves past the optimum
    for target in (opt, opt + 1):
        aimed = group_bound(problem, n, upper=2 * opt + 10, work=1.0, groups=8, target=target)
        assert aimed <= opt + 1e-9, (p.name, n, memory, opt, target, aimed)
    return opt, one, group


@pytest.mark.slow
def test_the_group_relaxation_is_below_the_exact_optimum_on_random_placements() -> None:
    # random placements with latency and blocks on two devices (_tiny), and zbv / interleaved-zb
    # with latency 0-3 under limits from the least that fits (_tiny_v)
    proven, reached, higher = 0, 0, 0
    for seed in range(24):
        for got in (_group_check(*_tiny(seed)), _group_check(*_tiny_v(seed))):
            if got is None:
                continue
            opt, one, group = got
            proven += 1
            reached += abs(group - opt) < 1e-9
            higher += group > one + 1e-9
    # all 48 solved exactly here; the groups reach the optimum on every one, above one device on 9
    assert proven >= 44 and reached >= proven - 2 and higher >= 5, (proven, reached, higher)


@pytest.mark.parametrize("latency,one,group,recorded", [(0, 26.968, 27.936, 28.056), (0.032, 27.928, 28.68, 29.16)])
def test_the_devices_at_once_see_what_one_at_a_time_cannot_under_v_min_memory(latency: float, one: float,
                                                                             group: float, recorded: float) -> None:
    # bench/results/bound_gap-v.md's zbv rows, 4 devices, 8 micro-batches, profiled costs (a chunk:
    # F/B/W 0.5/0.488/0.252) under V-Min's memory (4 chunk activations a device): one device at a
    # time proves 26.968 (latency 0) where every device at once proves 27.936 (the exact optimum is
    # 27.976: exact mode proved it); tessel's recorded schedule is 28.056 (29.16 with latency 0.032)
    v = zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=latency)
    problem = make_problem(v, (4, 4, 4, 4))
    device = bounds.device_lower_bound(v, 8, problem.real_holds(), bounds.RELAX_TERM_WORK)
    alone = relaxed_bound(problem, 8, upper=recorded, floor=device)
    assert alone == one
    assert group_bound(problem, 8, upper=recorded, floor=alone) == group <= recorded


def test_a_target_is_proven_first_and_never_past_the_optimum() -> None:
    # zbv, 4 devices, 8 micro-batches, profiled costs, V-Min's memory, latency 0 (as above): the
    # bisection from halfway proves 27.936; the exact optimum is 27.976 (exact mode proved it).
    # Asked to prove the optimum first, the groups do; asked for more, they find a schedule there
    # (never a bound above the optimum) and prove the optimum from below
    v = zbv(4, forward=0.5, backward=0.488, weight=0.252)
    problem = make_problem(v, (4, 4, 4, 4))
    alone = relaxed_bound(problem, 8, upper=28.056, floor=bounds.device_lower_bound(
        v, 8, problem.real_holds(), bounds.RELAX_TERM_WORK))
    assert group_bound(problem, 8, upper=28.056, floor=alone) == 27.936
    assert group_bound(problem, 8, upper=28.056, floor=alone, target=27.976) == 27.976
    assert group_bound(problem, 8, upper=28.056, floor=alone, target=28.056) == 27.976


def test_the_whole_v_with_the_tips_memory_alone_proves_in_a_second() -> None:
    # zbv, 4 devices, 8 micro-batches, profiled, V-Min's memory, latency 0 (as above): every device
    # with the memory limit of the tip alone is a relaxation (a dropped limit only lets more
    # through) without three of the four reservoirs; it proves in 2 deterministic s from 26.9 what
    # every device with every limit proves in 5 (27.936; 27.604 in 2), below the optimum 27.976
    v = zbv(4, forward=0.5, backward=0.488, weight=0.252)
    problem = make_problem(v, (4, 4, 4, 4))
    memory, rows, fifo, res = relax._inputs(problem, 8, 28.056)
    tip = relax.Group((0, 1, 2, 3), (3,))
    assert relax._groups(v, 8, rows, memory)[:3] == [relax.Group((0, 1, 2, 3), (0, 1, 2, 3)), tip, relax.Group((3,), (3,))]
    units = relax._bisect(problem, res, 8, tip, rows, fifo, relax._down(26.9, res), relax._down(28.056, res), 2.0)
    assert units * res == pytest.approx(27.936)

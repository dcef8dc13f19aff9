"""Lower bounds that know latency and memory (bounds.device_lower_bound): proven below the exact
optimum on small placements with latency, never below the old bound, and reached by the search."""
from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from shared_files import checker_verdict

from tessel import bounds, holds, library
from tessel.placement import Block, Number, Placement, make_placement
from tessel.search import search
from tessel.search.budget import Clock
from tessel.search.exact import solve_exact
from tessel.search.fast import sequential
from tessel.search.modulo import steady_memory
from tessel.search.problem import least_memory, make_problem


def test_one_machine_bound_is_the_preemptive_optimum() -> None:
    # (release, duration, tail): the best set is the third job alone, 6 + 1 + 1
    assert bounds.one_machine_bound([(0, 2, 5), (1, 3, 0), (6, 1, 1)]) == 8
    # the long-tailed job interrupts the long one at its release: 1 + 1 + 10
    assert bounds.one_machine_bound([(0, 4, 0), (1, 1, 10)]) == 12
    assert bounds.one_machine_bound([(3, 2, 0)]) == 5


def test_a_round_trip_with_latency_splits_the_middle_device_of_a_v() -> None:
    # zbv, p devices, every chunk's F, B, W cost c, latency L on every edge between devices: the
    # middle device's backward of chunk p waits for the forward through all 2p chunks (2p - 2
    # hops) and the backward back to it (p - 1 more), (3p - 1) c + (3p - 3) L; after it that
    # device still runs B and W of its two chunks for every micro-batch, 4 N c
    p, n, c, lat = 16, 24, 0.5, 0.5
    v = library.zbv(p, forward=c, backward=c, weight=c, latency=lat)
    by_hand = (3 * p - 1) * c + (3 * p - 3) * lat + 4 * n * c
    assert bounds.device_lower_bound(v, n) == by_hand == 94
    assert bounds.lower_bound(v, n) == 87  # head of the middle device + N * load: the wait unseen


def _tiny(seed: int) -> tuple[Placement, int, tuple[Number, ...] | None]:
    """A small training placement with latency (a chain with branches, some blocks on two
    devices), 2-4 micro-batches and, mostly, memory limits from just feasible to roomy."""
    rng = random.Random(seed)
    devices, nf = rng.randint(2, 3), rng.randint(2, 4)
    blocks: list[Block] = []
    edges: list[tuple[str, str]] = []
    for i in range(nf):
        on = (rng.randrange(devices),) if rng.random() < 0.85 else tuple(sorted(rng.sample(range(devices), 2)))
        blocks.append(Block(f"f{i}", "forward", rng.randint(1, 3), rng.choice((0, 1, 1, 2)), on))
        if i:
            edges.append((f"f{rng.randrange(i) if rng.random() < 0.3 else i - 1}", f"f{i}"))
    succs = {i: [b for a, b in edges if a == f"f{i}"] for i in range(nf)}
    for i in reversed(range(nf)):
        f = blocks[i]
        blocks.append(Block(f"b{i}", "backward", rng.randint(1, 4), -f.memory, f.devices, grad_of=f.id))
        edges += [(f"b{s[1:]}", f"b{i}") for s in succs[i]] or [(f.id, f"b{i}")]
    p = make_placement(f"tiny-{seed}", devices, blocks, edges, rng.choice((1, 2, 3)))
    n = rng.randint(2, 4)
    if rng.random() < 0.3:
        return p, n, None
    problem = make_problem(p)
    one = steady_memory(problem, sequential(problem))
    return p, n, tuple(max(a, b) + rng.choice((0, 0, 1, 2)) for a, b in zip(one, least_memory(problem.units)))


def _optimum(p: Placement, n: int, memory: tuple[Number, ...] | int | None) -> tuple[Number, Number, Number] | None:
    """(exact optimum, old bound, new bound), or None when the solve does not prove optimality."""
    problem = make_problem(p, memory)
    res = solve_exact(problem, n, Clock(30.0), 1)
    if res.status != "optimal" or res.objective is None:
        return None
    new = bounds.device_lower_bound(p, n, problem.real_holds() if memory is not None else None)
    return problem.real(res.objective), bounds.lower_bound(p, n), new


def _solved(make: Callable[[int], tuple[Placement, int, Any]],
            seeds: range) -> Iterator[tuple[int, Placement, int, Any, Number, Number, Number]]:
    """(seed, placement, N, memory, exact optimum, old bound, new bound) of each seed's case that
    solves to optimality (_optimum)."""
    for seed in seeds:
        p, n, memory = make(seed)
        got = _optimum(p, n, memory)
        if got is not None:
            yield seed, p, n, memory, *got


def test_the_device_bound_is_below_the_exact_optimum_on_random_placements_with_latency() -> None:
    proven, higher, reached = 0, 0, 0
    for seed, *_, opt, old, new in _solved(_tiny, range(40)):
        assert new <= opt + 1e-9, (seed, opt, new)
        assert new >= old - 1e-9, (seed, old, new)
        proven += 1
        higher += new > old + 1e-9
        reached += abs(new - opt) < 1e-9
    # most of them solve to optimality in a moment; the new bound is higher on many and often exact
    assert proven >= 30 and higher >= 10 and reached > proven // 2


@pytest.mark.parametrize("devices,n,latency,memory", [(2, 4, 2, 1), (3, 4, 2, 1), (3, 4, 2, 2), (3, 3, 1, 1)])
def test_the_device_bound_is_below_the_exact_optimum_on_v_placements(devices: int, n: int, latency: int,
                                                                       memory: int) -> None:
    v = library.zbv(devices, forward=1, backward=1, weight=1, latency=latency)
    got = _optimum(v, n, memory * 2 * devices)  # memory x M_B: 2p chunk activations
    assert got is not None
    opt, old, new = got
    assert old < new <= opt


@pytest.mark.parametrize("shape,devices,n,latency,memory", [("interleaved_zb", 2, 3, 1, 4), ("interleaved_zb", 2, 4, 1, 4),
                                                              ("zbv", 3, 4, 2, 4), ("interleaved_zb", 3, 3, 1, 4)])
def test_the_device_term_with_memory_delayed_releases_is_tighter_and_below_the_optimum(
        shape: str, devices: int, n: int, latency: int, memory: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The device term of the staggered releases from every task's own (memory-delayed) release,
    not only the first: a memory limit that holds back a device's later forwards holds back what
    waits for them on that device too (seen without holds.release_floors, which proves these
    optima by itself)."""
    p = getattr(library, shape)(devices, forward=1, backward=1, weight=1, latency=latency)
    got = _optimum(p, n, memory)
    assert got is not None
    opt, _, new = got
    holds = make_problem(p, memory).real_holds()
    monkeypatch.setattr(bounds, "release_floors", lambda *_: {})
    monkeypatch.setattr(bounds, "memory_cycles", lambda *_: {})
    before = bounds.device_lower_bound(p, n, holds, term_work=0, ramp=False)  # first releases only
    assert before < bounds.device_lower_bound(p, n, holds, ramp=False) <= new <= opt


def test_the_search_proves_its_zero_bubble_schedule_optimal_with_latency(tmp_path: Path) -> None:
    # zb, 4 devices, unit costs, latency 0.5, memory 1 M_B: no bound without latency and memory
    # together proves it (head + N * load is 40.5); one micro-batch's releases a round trip away do
    p = library.zb(4, forward=1, backward=1, weight=1, latency=0.5)
    s = search(p, 12, 4, time_limit=20)
    assert s.errors() == []
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.meta["bound_source"] == "device" and s.meta["status"] == "optimal"
    assert s.makespan == s.meta["lower_bound"] > bounds.lower_bound(p, 12)


@pytest.mark.parametrize("name", ["vshape", "xshape", "mshape", "kshape", "zbv", "interleaved", "alphafold"])
def test_the_chain_hold_is_a_path_so_never_above_the_longest(name: str) -> None:
    """Little's law at thousands of devices takes one path per memory pair (holds.chain_hold) instead
    of the longest: it must stay a lower bound of the longest, and equal it on a plain chain."""
    p = library.build(name, devices=4)
    p = make_placement(p.name, p.devices, p.blocks, p.edges, latency=0.5)
    hold = holds.chain_hold(p)
    ancestors: dict[str, set[str]] = {b: set() for b in p.topo_order}
    for x in p.topo_order:
        for y in p.succs[x]:
            ancestors[y] |= ancestors[x] | {x}
    pairs = [(a, r) for r in p.topo_order for a in ancestors[r]]
    assert pairs
    assert all(hold(a, r) <= holds.hold_time(p, a, r) + 1e-9 for a, r in pairs)
    if name == "vshape":  # one chain: the path is the only one
        assert all(abs(hold(a, r) - holds.hold_time(p, a, r)) < 1e-9 for a, r in pairs)
    # below HOLD_WORK every pair's hold is the longest path, its lookups done once: the same numbers
    longest = holds.holds_of(p, len(pairs))
    assert [longest(a, r) for a, r in pairs] == [holds.hold_time(p, a, r) for a, r in pairs]


def test_the_memory_ramp_is_below_the_exact_optimum_on_random_placements(monkeypatch: pytest.MonkeyPatch) -> None:
    """holds.ramp_bound (in the device bound with memory): below the exact optimum on random
    placements with latency and memory limits, and above the bound without it on the seeds
    where the memory holds back forwards that the preemptive bound lets fill a wait (both without
    holds.memory_cycles, which proves some of those by itself)."""
    monkeypatch.setattr(bounds, "memory_cycles", lambda *_: {})
    proven, higher = 0, 0
    for seed in [*range(30), 110, 262]:
        p, n, memory = _tiny(seed)
        if memory is None:
            continue
        got = _optimum(p, n, memory)
        if got is None:
            continue
        opt, _, new = got
        plain = bounds.device_lower_bound(p, n, make_problem(p, memory).real_holds(), ramp=False)
        assert plain <= new <= opt + 1e-9, (seed, opt, plain, new)
        proven += 1
        higher += new > plain + 1e-9
    assert proven >= 15 and higher >= 3, (proven, higher)


def test_the_memory_ramp_proves_the_tip_of_a_v_idles_until_its_first_backward(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # bench/results/peers-mem1.md's zbv row p = 16, m = 64, unit costs (chunks 0.5), latency 0.5,
    # 1 M_B (32 chunk activations a device): the tip starts at 15 and its first backward comes
    # back at 46; before it only forwards can run, and the memory lets 32 of them start (16 time
    # units), so it idles 15 whatever the order: 46 + 192 - 16 = 222. The preemptive bound lets
    # later forwards fill the wait (213.5). Read backwards the same device idles at the end, and
    # both idles add up (holds.two_ended_ramp): 225.5. With the work the tip spends giving memory
    # back before each later forward (holds.release_floors) the forwards, and so the backwards that
    # follow them, come later still: 236.5, the zero-bubble repository's schedule. Any valid
    # schedule is at least as long
    v = library.zbv(16, forward=0.5, backward=0.5, weight=0.5, latency=0.5)
    memory = make_problem(v, 32).real_holds()
    assert bounds.device_lower_bound(v, 64, memory) == 236.5
    monkeypatch.setattr(bounds, "release_floors", lambda *_: {})
    monkeypatch.setattr(bounds, "memory_cycles", lambda *_: {})
    assert bounds.device_lower_bound(v, 64, memory, ramp=False) == 213.5
    r = bounds.staggered_releases(v, 64, memory)
    assert max(holds.ramp_bound(v.blocks_on(d), r, limit, h) for d, (limit, h) in memory.items()) == 222
    assert bounds.device_lower_bound(v, 64, memory) == 225.5
    monkeypatch.undo()
    s = search(v, 64, 32, mode="fast", time_limit=10)
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")
    assert s.errors() == [] and s.makespan >= 236.5


def _tiny_v(seed: int) -> tuple[Placement, int, tuple[Number, ...]]:
    """A small zbv or interleaved-zb placement (the library's V family) with integer costs,
    latency 0-3, 3-5 micro-batches and memory limits from the least that fits to roomy."""
    rng = random.Random(seed)
    shape = rng.choice(("zbv", "zbv", "interleaved_zb"))
    f, b, w = rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 2)
    p = getattr(library, shape)(rng.randint(2, 3), forward=f, backward=b, weight=w, latency=rng.randint(0, 3))
    least = least_memory(make_problem(p).units)
    return p, rng.randint(3, 5), tuple(x + rng.choice((0, 0, 1, 2, 4)) for x in least)


def _one_ended(p: Placement, n: int, memory: bounds.Memory) -> Number:
    """The device bound with the memory ramp at one end at a time (before holds.two_ended_ramp)."""
    r, q = bounds.staggered_releases(p, n, memory), bounds.staggered_tails(p, n, memory)
    ramps = [holds.ramp_bound(p.blocks_on(d), rows, limit, h if rows is r else [(y, x, a) for x, y, a in h])
             for d, (limit, h) in memory.items() for rows in (r, q)]
    return max([bounds.device_lower_bound(p, n, memory, ramp=False), *ramps])


@pytest.mark.slow
def test_the_ramp_at_both_ends_and_the_release_floors_are_below_the_exact_optimum_on_random_v_placements(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """holds.two_ended_ramp (the idle at the start and at the end added up) and holds.release_floors
    (the device's own work to give memory back before a later forward): below the exact optimum
    on random small V placements; each one above the bound without it on several."""
    proven, ends, floors = 0, 0, 0
    for seed, p, n, limit, opt, _, new in _solved(_tiny_v, range(60)):
        memory = make_problem(p, limit).real_holds()
        with monkeypatch.context() as m:
            m.setattr(bounds, "release_floors", lambda *_: {})
            m.setattr(bounds, "memory_cycles", lambda *_: {})
            plain = bounds.device_lower_bound(p, n, memory)
            before = _one_ended(p, n, memory)
        assert before <= plain <= new <= opt + 1e-9, (seed, opt, before, plain, new)
        proven += 1
        ends += plain > before + 1e-9
        floors += new > plain + 1e-9
    assert proven >= 50 and ends >= 5 and floors >= 15, (proven, ends, floors)


def test_the_ramp_at_both_ends_claims_nothing_where_its_two_windows_hold_the_work_exactly(tmp_path: Path) -> None:
    # a 3-device chain, fractional costs, one micro-batch in flight per device (limit 3.375, 2.25
    # each): each device runs its micro-batches one after another, 8 x the round trip 15.101 =
    # 120.808. Its start and end windows hold exactly the work, summed in floats one ulp short, and
    # the ramp at both ends claimed 128.737 (held-out random family, seed 2)
    f = (3.848, 3.807, 1.805)
    b = (3.324, 1.137, 1.18)
    blocks = [Block(f"f{d}", "forward", f[d], 2.25, (d,)) for d in range(3)]
    blocks += [Block(f"b{d}", "backward", b[d], -2.25, (d,), grad_of=f"f{d}") for d in (2, 1, 0)]
    p = make_placement("serial", 3, blocks, [("f0", "f1"), ("f1", "f2"), ("f2", "b2"), ("b2", "b1"), ("b1", "b0")])
    limit = (3.375, 3.375, 3.375)
    memory = make_problem(p, limit).real_holds()
    serial = 8 * (sum(f) + sum(b))
    assert bounds.device_lower_bound(p, 8, memory) == pytest.approx(serial)
    s = search(p, 8, limit, time_limit=5)
    path = tmp_path / "serial.json"
    s.save(path)
    checker_verdict(path)
    assert s.errors() == [] and s.makespan == pytest.approx(serial)
    assert float(s.meta["lower_bound"]) <= s.makespan + 1e-9

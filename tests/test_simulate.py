"""Simulator: replays of per-device orders with the schedule's own, perturbed, profiled or
communicating costs."""
from __future__ import annotations

import pytest

from tessel import library
from tessel.errors import TesselError
from tessel.placement import PlacementError
from tessel.schedule import Schedule, ScheduleError
from tessel.simulate import noise_factor, perturb, recost, robustness, simulate
from tessel.timing import orders_of, schedule_from_orders


def one_f_one_b_orders(p, n):
    """Per-device 1F1B orders of a vshape placement (stage i: f{i}, b{p-1-i})."""
    d_count = p.devices
    orders = []
    for d in range(d_count):
        fwd, bwd = f"f{d}", f"b{d_count - 1 - d}"
        warm = min(d_count - 1 - d, n)
        order = [(fwd, m) for m in range(warm)]
        for m in range(n):
            if warm + m < n:
                order.append((fwd, warm + m))
            order.append((bwd, m))
        orders.append(order)
    return orders


def gpipe_orders(p, n):
    """All forward tasks of a device first, then its backward tasks, micro-batch by micro-batch."""
    out = []
    for d in range(p.devices):
        on = p.blocks_on(d)
        fwd = [(b.id, m) for m in range(n) for b in on if b.kind == "forward"]
        bwd = [(b.id, m) for m in range(n) for b in on if b.kind != "forward"]
        out.append(fwd + bwd)
    return out


@pytest.fixture(scope="module")
def v1f1b() -> Schedule:
    p = library.vshape(4)
    return schedule_from_orders(p, 12, one_f_one_b_orders(p, 12), memory_limit=4)


def test_replay_with_own_costs_reproduces_the_schedule(v1f1b):
    out = simulate(v1f1b)
    assert out.tasks == v1f1b.tasks
    assert out.makespan == v1f1b.makespan == (12 + 4 - 1) * (1 + 3)  # the 1F1B closed form
    assert out.errors() == []


def test_replay_of_a_delayed_schedule_is_never_later(v1f1b):
    # push one task late (still valid): the replay runs it as early as its order allows again
    late = max(v1f1b.tasks, key=lambda t: t.start)
    starts = dict(v1f1b.start)
    starts[(late.block, late.micro_batch)] += 5
    delayed = Schedule.build(v1f1b.placement, 12, starts, v1f1b.memory_limit)
    out = simulate(delayed)
    assert out.makespan == v1f1b.makespan < delayed.makespan
    assert all(out.start[k] <= delayed.start[k] for k in delayed.start)


def test_block_noise_changes_makespan_keeps_orders_memory_and_validity(v1f1b):
    noisy = simulate(v1f1b, noise=0.2, seed=7)
    assert noisy.errors() == []
    assert noisy.makespan != v1f1b.makespan
    assert [[(t.block, t.micro_batch) for t in ts] for ts in noisy.device_orders()] == orders_of(v1f1b)
    assert noisy.peak_memory == v1f1b.peak_memory
    assert noisy.meta["nominal_makespan"] == v1f1b.makespan
    # the durations are the placement's times the factors of the seed, the same for every micro-batch
    f0 = noisy.placement.by_id["f0"].duration
    assert f0 == pytest.approx(noise_factor(0.2, 7, 0, "f0"))
    assert simulate(v1f1b, noise=0.2, seed=7).tasks == noisy.tasks
    assert simulate(v1f1b, noise=0.2, seed=8).makespan != noisy.makespan


def test_task_noise_gives_a_valid_unfolded_schedule(v1f1b):
    jitter = simulate(v1f1b, noise=0.3, scope="task", seed=1)
    assert jitter.errors() == []
    assert jitter.micro_batches == 1 and len(jitter.tasks) == len(v1f1b.tasks)
    assert jitter.makespan != v1f1b.makespan
    assert jitter.peak_memory == v1f1b.peak_memory
    durations = {jitter.placement.by_id[f"f0#{m}"].duration for m in range(12)}
    assert len(durations) == 12  # every micro-batch drew its own


def test_a_wide_spread_keeps_every_duration_in_the_range_a_placement_accepts(v1f1b):
    """noise 5 draws factors of 1e-5 and below: a block of 1 would fall under MIN_DURATION (the replay
    was refused as an invalid placement); draws are kept in range, the replay is valid."""
    from tessel.placement import MAX_VALUE, MIN_DURATION
    for scope in ("task", "block"):
        wide = simulate(v1f1b, noise=5.0, scope=scope, seed=3)
        durations = [b.duration for b in wide.placement.blocks]
        assert wide.errors() == [] and min(durations) >= MIN_DURATION and max(durations) <= MAX_VALUE
        assert min(durations) == MIN_DURATION  # some draw was that small and was kept in range
    with pytest.raises(TesselError, match="noise must be a number in 0..10"):
        simulate(v1f1b, noise=1e300)


def test_noise_factors_have_mean_one_and_stay_positive():
    xs = [noise_factor(0.5, 3, "b", k) for k in range(4000)]
    assert min(xs) > 0
    assert sum(xs) / len(xs) == pytest.approx(1.0, abs=0.04)


def test_latency_on_a_forward_chain_adds_one_latency_per_hop():
    p = library.vshape(5).inference()
    n = 9
    orders = gpipe_orders(p, n)
    base = schedule_from_orders(p, n, orders)
    assert base.makespan == n + 5 - 1
    out = simulate(base, latency=0.25)
    assert out.errors() == []
    assert out.makespan == pytest.approx(base.makespan + (5 - 1) * 0.25)


def test_latency_on_one_training_micro_batch_adds_both_directions():
    p = library.vshape(4)
    base = schedule_from_orders(p, 1, gpipe_orders(p, 1))
    assert simulate(base, latency=2).makespan == base.makespan + 2 * (4 - 1) * 2


def test_profiled_durations_replace_the_placements(v1f1b):
    measured = v1f1b.placement.with_costs(forward=2, backward=5)
    out = simulate(v1f1b, durations=measured)
    assert out.makespan == (12 + 4 - 1) * (2 + 5)
    out2 = simulate(v1f1b, durations={"b0": 6})
    assert out2.placement.by_id["b0"].duration == 6 and out2.makespan > v1f1b.makespan
    with pytest.raises(PlacementError, match="'zz'"):
        recost(v1f1b.placement, {"zz": 1})


def test_sharded_blocks_wait_for_all_their_devices():
    p = library.mshape(4)
    s = schedule_from_orders(p, 4, gpipe_orders(p, 4))
    slow = simulate(s, durations={"fA0": 3})
    assert slow.errors() == []
    assert slow.makespan == s.makespan + 4 * 2  # the all-device block is on every critical path


def test_bad_arguments_are_named(v1f1b):
    with pytest.raises(ValueError, match="noise"):
        simulate(v1f1b, noise=-1)
    with pytest.raises(ValueError, match="scope"):
        simulate(v1f1b, noise=0.1, scope="device")
    with pytest.raises(ValueError, match="reference"):
        robustness({"a": v1f1b}, 0.1, trials=2, reference="b")


def test_robustness_pairs_the_draws(v1f1b):
    p = v1f1b.placement
    gpipe = schedule_from_orders(p, 12, gpipe_orders(p, 12))
    r = robustness({"1f1b": v1f1b, "gpipe": gpipe}, noise=0.2, trials=30, seed=2, scope="task")
    own, other = r.methods
    assert own.reference_wins == 1.0 and own.versus_reference.mean == 1.0
    assert other.nominal == gpipe.makespan == v1f1b.makespan  # same closed form at F=1, B=3
    assert other.slowdown.p5 <= other.slowdown.p50 <= other.slowdown.p95 <= other.slowdown.worst
    assert own.makespan.mean != own.nominal
    heads, rows = r.table()
    assert len(rows) == 2 and len(rows[0]) == len(heads)


def test_perturb_is_a_pure_function_of_seed_and_trial():
    p = library.vshape(4)
    assert perturb(p, 0.1, 1, 0) == perturb(p, 0.1, 1, 0)
    assert perturb(p, 0.1, 1, 0) != perturb(p, 0.1, 1, 1)
    assert perturb(p, 0, 5) == p


def test_replay_names_orders_that_deadlock(v1f1b):
    starts = dict(v1f1b.start)
    starts[("b0", 0)], starts[("f3", 0)] = 0, 1000  # device 3 would run a backward before its forward
    bad = Schedule.build(v1f1b.placement, 12, starts, check=False)
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(bad)


def test_shared_cores_slow_a_pipeline_down_to_its_total_work(v1f1b):
    work = v1f1b.micro_batches * sum(v1f1b.placement.loads)
    spans = [simulate(v1f1b, cores=c).makespan for c in (4, 3, 2, 1)]
    assert spans[0] == pytest.approx(v1f1b.makespan)  # one core per device: no contention
    assert spans == sorted(spans)
    assert spans[-1] == pytest.approx(work, rel=0.02)  # one core runs everything in turn
    assert work / 2 <= spans[-2] <= work / 2 * 1.1
    assert simulate(v1f1b, cores=2).errors() == []
    with pytest.raises(ValueError, match="cores"):
        simulate(v1f1b, cores=0)


def test_replay_of_a_searched_schedule_keeps_its_orders_and_is_never_later():
    from tessel.methods import run_method
    s = run_method("tessel", library.mshape(4), 8, 20)
    out = simulate(s)
    assert out.makespan <= s.makespan
    assert all(out.start[k] <= s.start[k] + 1e-9 for k in s.start)
    assert orders_of(out) == orders_of(s)
    slow = simulate(s, noise=0.2, seed=3)
    assert slow.errors() == [] and slow.peak_memory == s.peak_memory


def test_cli_simulate_writes_the_replay_and_compares_under_noise(tmp_path, capsys, v1f1b):
    from tessel.cli import main
    p = v1f1b.placement
    gpipe = schedule_from_orders(p, 12, gpipe_orders(p, 12)).with_meta(method="gpipe")
    v1f1b.with_meta(method="1f1b").save(tmp_path / "a.json")
    gpipe.save(tmp_path / "b.json")
    out = tmp_path / "sim.json"
    assert main(["simulate", str(tmp_path / "a.json"), "--latency", "1", "-o", str(out)]) == 0
    replay = Schedule.load(out, check=True)
    assert replay.makespan == simulate(v1f1b, latency=1).makespan > v1f1b.makespan
    assert main(["simulate", str(tmp_path / "a.json"), "--noise", "0.1", "--trials", "5",
                 "--against", str(tmp_path / "b.json")]) == 0
    text = capsys.readouterr().out
    assert "gpipe" in text and "5 trials" in text
    assert main(["simulate", str(tmp_path / "a.json"), "--cores", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("makespan:"))
    assert float(line.split(":")[1]) == pytest.approx(12 * sum(p.loads), rel=0.02)  # one core: all work in turn
    for bad in (["--noise", "-0.5"], ["--noise", "1e300"], ["--seed", "-5"], ["--trials", "1000000000"]):
        with pytest.raises(SystemExit) as e:  # argparse's refusal: one line, exit 2
            main(["simulate", str(tmp_path / "a.json"), *bad])
        err = capsys.readouterr().err
        assert e.value.code == 2 and bad[0] in err and err.count("\n") == 1, err
    # trials x tasks over MAX_REPLAYS: refused after reading the schedules, before any replay
    assert main(["simulate", str(tmp_path / "a.json"), "--noise", "0.1", "--trials", "1000000"]) == 2
    assert "task replays, more than the 1,000,000 accepted" in capsys.readouterr().err

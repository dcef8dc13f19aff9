"""Baselines: valid on every placement they fit (named and random), closed forms, memory, errors."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessel import library, methods
from tessel.baselines import BASELINES, BaselineError, applicable, run_baseline, why_not
from tessel.baselines.engine import memory_need, one_group
from tessel.baselines.torch_orders import torch_available
from tessel.placement import Block, Placement, make_placement
from tessel.schedule import Schedule

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

APPLIES = {
    "vshape": {"gpipe", "1f1b", "greedy"},
    "interleaved": {"gpipe", "1f1b", "interleaved", "greedy"},
    "xshape": {"gpipe", "1f1b", "chimera", "greedy"},
    "mshape": {"gpipe", "1f1b", "greedy"},
    "nnshape": {"gpipe", "1f1b", "greedy"},
    "kshape": {"gpipe", "1f1b", "greedy"},
    "alphafold": {"gpipe", "1f1b", "greedy"},
    "mllm": {"gpipe", "1f1b", "greedy"},
    "finetune": {"gpipe", "1f1b", "greedy"},
    "zb": {"gpipe", "1f1b", "zb-h1", "zb-h2", "greedy"},
    "zbv": {"gpipe", "1f1b", "zb-v", "zb-v-half", "zb-v-min", "zb-v-hand", "dualpipev", "v-mem", "greedy"},
    "interleaved-zb": {"gpipe", "1f1b", "interleaved", "interleaved-zb-h1", "greedy"},
}
if torch_available():  # torch's own generators, where their shape fits
    APPLIES["zbv"] |= {"torch-zbv", "torch-dualpipev"}
    APPLIES["interleaved"] |= {"torch-interleaved-1f1b"}
    APPLIES["interleaved-zb"] |= {"torch-interleaved-1f1b", "torch-interleaved-zb"}


def check(s: Schedule, method: str) -> Schedule:
    """Independent of run_baseline's own validation: the rules hold and the meta says who made it."""
    assert s.errors() == [] and s.meta["method"] == method and s.meta["search_seconds"] >= 0
    return s


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(library.PLACEMENTS))
def test_every_applicable_baseline_is_valid_on_named_placements(name: str) -> None:
    for devices in (4, 6):
        p = library.build(name, devices=devices)
        assert set(applicable(p)) == APPLIES[name]
        for method in applicable(p):
            n = 2 * devices
            check(BASELINES[method](p, n, None), method)
    infer = library.build(name, infer=True)
    assert set(applicable(infer)) == {"gpipe", "greedy"}
    for method in applicable(infer):
        check(BASELINES[method](infer, 5, None), method)


# ---- closed forms ----------------------------------------------------------------------------
@FEW
@given(p=st.integers(1, 6), n=st.integers(1, 20), f=st.integers(1, 3), b=st.integers(1, 4))
def test_1f1b_and_gpipe_makespan_on_uniform_vshape(p: int, n: int, f: int, b: int) -> None:
    v = library.vshape(p, forward=f, backward=b)
    one, gp = check(BASELINES["1f1b"](v, n, None), "1f1b"), check(BASELINES["gpipe"](v, n, None), "gpipe")
    assert one.makespan == gp.makespan == (n + p - 1) * (f + b)
    assert gp.peak_memory[0] == n and one.peak_memory[0] == min(n, p)
    assert one.peak_memory == tuple(min(n, p - d) for d in range(p))


@FEW
@given(p=st.integers(1, 5), v=st.integers(2, 4), groups=st.integers(1, 4), f=st.integers(1, 3), b=st.integers(1, 4))
def test_interleaved_makespan_is_megatrons(p: int, v: int, groups: int, f: int, b: int) -> None:
    n = groups * p
    s = check(BASELINES["interleaved"](library.interleaved(p, v, forward=f, backward=b), n, None), "interleaved")
    assert s.makespan == n * v * (f + b) + (p - 1) * (f + b)
    # the backward split into B and W run back to back: the same orders, but the gradient moves on
    # after B, so never longer than with B + W as one block; the same activations in flight
    split = library.interleaved_zb(p, v, forward=f, backward=b, weight=1)
    z = check(BASELINES["interleaved"](split, n, None), "interleaved")
    assert n * v * (f + b + 1) <= z.makespan <= n * v * (f + b + 1) + (p - 1) * (f + b + 1)
    assert z.peak_memory == s.peak_memory


@pytest.mark.slow
@FEW
@given(p=st.integers(1, 6), extra=st.integers(0, 12), f=st.integers(1, 3), b=st.integers(1, 4), w=st.integers(1, 3))
def test_zb_h1_makespan_and_memory(p: int, extra: int, f: int, b: int, w: int) -> None:
    w = min(w, f, b)  # the published bubble (p-1)(F+B-W) assumes W <= F, B
    n = p + extra
    s = check(BASELINES["zb-h1"](library.zb(p, forward=f, backward=b, weight=w), n, None), "zb-h1")
    assert s.makespan == n * (f + b + w) + (p - 1) * (f + b - w)
    assert s.peak_memory == (p,) * p  # 1F1B's peak, on every stage
    assert s.makespan <= BASELINES["1f1b"](library.zb(p, forward=f, backward=b, weight=w), n, None).makespan


@FEW
@given(p=st.integers(1, 6), extra=st.integers(0, 6), f=st.integers(1, 3), b=st.integers(1, 3), w=st.integers(1, 3))
def test_dualpipev_memory_and_steady_state(p: int, extra: int, f: int, b: int, w: int) -> None:
    # by hand (tessel/baselines/dualpipe.py): the warm-up leaves 2p chunk activations on every device
    # and each overlapped pair starts its F before its B frees one: 2p + 1; in the main phase every
    # device is busy, so one more micro-batch adds exactly a device's work for it, 2 (F + B + W)
    z = library.zbv(p, forward=f, backward=b, weight=w)
    n = 2 * p + extra
    s, more = (check(BASELINES["dualpipev"](z, k, None), "dualpipev") for k in (n, n + 1))
    assert s.peak_memory == more.peak_memory == (2 * p + 1,) * p
    assert more.makespan - s.makespan == 2 * (f + b + w)
    assert s.makespan >= n * 2 * (f + b + w)
    with pytest.raises(BaselineError, match=f"dualpipev needs at least as many micro-batches as the V's {2 * p}"):
        BASELINES["dualpipev"](z, 2 * p - 1, None)


@FEW
@given(p=st.integers(1, 6), extra=st.integers(0, 6), f=st.integers(1, 3), b=st.integers(1, 3), w=st.integers(1, 3))
def test_zb_v_hand_keeps_1f1bs_memory(p: int, extra: int, f: int, b: int, w: int) -> None:
    # by hand (tessel/baselines/zbv_hand.py): 2p - 1 chunk activations after the warm-up, one more
    # at a time in phase 3: 2p on every device (1F1B's M_B); never longer than 1F1B on the V
    z = library.zbv(p, forward=f, backward=b, weight=w)
    n = 2 * p - 1 + extra
    s = check(BASELINES["zb-v-hand"](z, n, None), "zb-v-hand")
    assert s.peak_memory == (2 * p,) * p
    assert n * 2 * (f + b + w) <= s.makespan <= BASELINES["1f1b"](z, n, None).makespan


@pytest.mark.parametrize("p, n", [(6, 12), (8, 16)])
def test_zb_v_hand_fills_its_cool_down_with_real_costs_and_latency(p: int, n: int) -> None:
    # profiled chunk costs (F/B/W = 0.5/0.488/0.252, latency 0.032, as bench/vpeers.py): a cool-down
    # B waits for its input, and a W run there ends the device sooner than the hand order's W
    # passes at the end (ZB-V's own generator was 0.004 / 0.036 shorter before the filling)
    from tessel.baselines.schedules import _v_chain
    from tessel.baselines.zbv_hand import zbv_hand_orders
    from tessel.timing import earliest_starts
    z = library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    plain = Schedule.build(z, n, earliest_starts(z, n, zbv_hand_orders(z, _v_chain(z, "x"), n)))
    s = check(BASELINES["zb-v-hand"](z, n, list(plain.peak_memory)), "zb-v-hand")
    assert s.peak_memory == plain.peak_memory == (2 * p,) * p
    assert s.makespan < plain.makespan - 0.003


def test_a_baseline_keeps_its_orders_memory_when_a_start_snaps_to_an_integer() -> None:
    # zb-v-hand on the profiled V at p = 4, m = 16, latency 0.032: a W timed at 26.99999999999999
    # was stored as 27 and ended after the forward timed right behind it, 9 activations by rule 4
    # where its order holds 8 (2p), and it was refused under 8 (tessel/dust.py)
    from tessel.timing import order_peak
    z = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    s = check(BASELINES["zb-v-hand"](z, 16, 8), "zb-v-hand")
    assert s.peak_memory == (8,) * 4 == tuple(order_peak(z, [(t.block, t.micro_batch) for t in o])
                                             for o in s.device_orders())
    assert s.makespan < 41.708  # ZB's automatic V scheduler under the same memory (bench/results/peers-v.md)


@FEW
@given(p=st.integers(1, 5), v=st.integers(2, 3), groups=st.integers(1, 3), f=st.integers(1, 3),
       b=st.integers(1, 3), w=st.integers(1, 3))
def test_interleaved_zb_h1_holds_v_p_activations_and_beats_interleaved(p: int, v: int, groups: int, f: int,
                                                                       b: int, w: int) -> None:
    # by hand: device r's warm-up of (v - 1)p + p - r - 1 forwards plus the r weight passes it keeps
    # back give v p chunk activations on every device once n >= p; its W passes fill the cool-down,
    # so it is never longer than Megatron's order with each W right after its B (which holds more)
    z = library.interleaved_zb(p, v, forward=f, backward=b, weight=w)
    n = groups * p
    s = check(BASELINES["interleaved-zb-h1"](z, n, None), "interleaved-zb-h1")
    assert s.peak_memory == (v * p,) * p
    mega = BASELINES["interleaved"](z, n, None)
    assert n * v * (f + b + w) <= s.makespan <= mega.makespan
    assert max(mega.peak_memory) >= v * p
    with pytest.raises(BaselineError, match="split into B and W"):
        BASELINES["interleaved-zb-h1"](library.interleaved(max(p, 2), v), 2 * max(p, 2), None)


def test_dualpipev_with_profiled_costs_and_latency_is_valid() -> None:
    z = library.zbv(4, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    s = check(BASELINES["dualpipev"](z, 12, None), "dualpipev")
    assert s.peak_memory == (9,) * 4 and s.lower_bound <= s.makespan


@pytest.mark.parametrize("devices", [2, 4, 6, 8])
def test_chimera_keeps_chimeras_memory(devices: int) -> None:
    s = check(BASELINES["chimera"](library.xshape(devices), 3 * devices, None), "chimera")
    half = math.ceil(devices / 2)
    assert all(half + 1 <= m <= devices for m in s.peak_memory)
    assert s.makespan < BASELINES["gpipe"](library.xshape(devices), 3 * devices, None).makespan * 2


@pytest.mark.parametrize("devices", [2, 4, 6, 8])
def test_one_chimera_unit_holds_chimeras_activations(devices: int) -> None:
    # one unit: device i (and its mirror p-1-i) holds p/2 of one pipeline plus i+1 of the other
    s = check(BASELINES["chimera"](library.xshape(devices), devices // 2, None), "chimera")
    half = devices // 2
    assert s.peak_memory == tuple(half + 1 + min(d, devices - 1 - d) for d in range(devices))


@pytest.mark.parametrize("n,before", [(16, 177), (64, 705)])
def test_chimera_units_concatenate_tighter_than_the_continuous_approximation(n: int, before: int) -> None:
    s = check(BASELINES["chimera"](library.build("xshape", devices=4), n, None), "chimera")
    assert s.lower_bound <= s.makespan < before
    assert max(s.peak_memory) <= 4
    # a unit's start-up forwards fill the previous unit's cool-down: below the units run apart
    unit = BASELINES["chimera"](library.build("xshape", devices=4), 2, None).makespan
    assert s.makespan < n // 2 * unit


def test_1f1b_plus_runs_sharded_blocks_on_all_devices_at_once() -> None:
    s = check(BASELINES["1f1b"](library.mshape(4), 16, None), "1f1b")
    assert s.peak_memory == (4, 3, 2, 1)
    assert s.lower_bound <= s.makespan < BASELINES["1f1b"](library.mshape(4), 16, None).lower_bound * 1.5


# ---- repetends ---------------------------------------------------------------------------------
@pytest.mark.parametrize("method,placement,n,later", [
    ("1f1b", library.vshape(4), 16, 23), ("zb-h1", library.zb(4), 12, 30),
    ("interleaved", library.interleaved(4, 2), 16, 40), ("chimera", library.xshape(4), 40, 46),
    ("1f1b", library.kshape(4), 30, 45),
])
def test_repetend_unrolls_to_the_directly_built_schedule(method: str, placement: Placement, n: int,
                                                         later: int) -> None:
    s = BASELINES[method](placement, n, None)
    assert s.repetend is not None
    direct = BASELINES[method](placement, later, None)
    assert s.unroll(later).start == direct.start


# ---- random DAG placements -----------------------------------------------------------------
@st.composite
def dags(draw: st.DrawFn) -> Placement:
    devices = draw(st.integers(1, 4))
    n = draw(st.integers(1, 7))
    blocks = []
    for i in range(n):
        devs = draw(st.sets(st.integers(0, devices - 1), min_size=1, max_size=devices))
        duration = draw(st.one_of(st.integers(1, 4), st.floats(0.25, 3.0, allow_nan=False)))
        kind = draw(st.sampled_from(["forward", "forward", "backward", "weight", "other"]))
        blocks.append(Block(f"x{i}", kind, duration, draw(st.integers(-2, 3)), tuple(sorted(devs))))
    edges = [(f"x{i}", f"x{j}") for i in range(n) for j in range(i + 1, n) if draw(st.integers(0, 3)) == 0]
    latency = draw(st.sampled_from([0, 0, 1, 0.5]))
    return make_placement("random", devices, blocks, edges, latency)


@pytest.mark.slow
@MANY
@given(p=dags(), n=st.integers(1, 6))
def test_every_fitting_baseline_is_valid_on_random_dags(p: Placement, n: int) -> None:
    assert "greedy" in applicable(p)
    for method in applicable(p):
        if (method == "interleaved" and n % p.devices) or (method.endswith("dualpipev") and n < 2 * p.devices):
            continue
        check(BASELINES[method](p, n, None), method)


@pytest.mark.slow
@MANY
@given(p=dags(), n=st.integers(1, 6), slack=st.integers(0, 3))
def test_greedy_meets_every_feasible_memory_limit(p: Placement, n: int, slack: int) -> None:
    need = memory_need(p, n, one_group(p))
    limit = [max([0] + [v for (d, _), v in need.items() if d == dev]) + slack for dev in range(p.devices)]
    s = check(BASELINES["greedy"](p, n, limit), "greedy")
    assert all(peak <= lim for peak, lim in zip(s.peak_memory, limit))
    tight = [k for k, v in need.items() if v > 0]
    if tight:
        d = tight[0][0]
        lower = list(limit)
        lower[d] = need[tight[0]] - 1
        with pytest.raises(BaselineError, match=f"greedy: device {d} needs memory"):
            BASELINES["greedy"](p, n, lower)


def test_greedy_under_a_tight_limit_runs_one_micro_batch_at_a_time() -> None:
    s = check(BASELINES["greedy"](library.vshape(4), 6, 1), "greedy")
    assert s.peak_memory == (1, 1, 1, 1) and s.makespan == 6 * 16


# ---- refusals ----------------------------------------------------------------------------------
def test_baselines_that_do_not_fit_say_why() -> None:
    v = library.vshape(4)
    assert "chunks per device" in why_not("interleaved", v)
    assert "two opposite pipelines" in why_not("chimera", v)
    assert "split into B and W" in why_not("zb-h1", v)
    assert "no backward blocks" in why_not("1f1b", library.vshape(4).inference())
    with pytest.raises(BaselineError, match="block fA0 runs on several devices"):
        BASELINES["interleaved"](library.mshape(4), 8, None)
    with pytest.raises(BaselineError, match="multiple of the 4 devices, got 6"):
        BASELINES["interleaved"](library.interleaved(4, 2), 6, None)
    with pytest.raises(BaselineError, match="unknown baseline 'pipedream'"):
        run_baseline("pipedream", v, 4)


def test_backward_feeding_a_forward_fits_greedy_only() -> None:
    p = make_placement("loop", 2, [Block("f", "forward", 1, 1, (0,)), Block("b", "backward", 1, -1, (0,)),
                                   Block("g", "forward", 1, 0, (1,))], [("f", "b"), ("b", "g")])
    assert applicable(p) == ["greedy"]
    assert "edge b -> g feeds a backward block into a forward one" in why_not("gpipe", p)


def test_a_limit_a_baseline_cannot_meet_names_device_and_need() -> None:
    with pytest.raises(BaselineError, match="1f1b needs memory 4 on device 0, over its limit 3"):
        BASELINES["1f1b"](library.vshape(4), 16, 3)
    with pytest.raises(BaselineError, match="gpipe needs memory 16 on device 0, over its limit 3"):
        BASELINES["gpipe"](library.vshape(4), 16, [3, 20, 20, 20])
    s = BASELINES["1f1b"](library.vshape(4), 16, [4, 3, 2, 1])
    assert s.memory_limit == (4, 3, 2, 1) and s.errors() == []


# ---- the method registry -----------------------------------------------------------------------
def test_methods_registry_runs_baselines_and_lists_the_search_modes() -> None:
    names = methods.available_methods()
    assert names[:len(methods.SEARCH_MODES)] == list(methods.SEARCH_MODES)
    assert {"zb-h2", "zb-v", "zb-v-half", "zb-v-min"} <= set(BASELINES) <= set(names)
    s = methods.run_method("1f1b", library.vshape(4), 8, None, time_limit=5)
    assert s.makespan == 44 and s.meta["method"] == "1f1b"
    assert methods.why_not_method("chimera", library.vshape(4)) is not None
    assert methods.why_not_method("greedy", library.vshape(4)) is None
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        methods.run_method("nope", library.vshape(4), 8)

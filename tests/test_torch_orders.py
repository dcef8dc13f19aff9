"""torch.distributed.pipelining's own generators as baselines: their orders mapped onto tessel's
zbv / interleaved / interleaved-zb placements, checked, timed, and compared with figures derived by
hand and with tessel's own DualPipeV."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES, BaselineError, applicable, raced, why_not
from tessel.baselines.dualpipe import dualpipev_orders
from tessel.baselines.schedules import _v_chain
from tessel.baselines.torch_orders import _check_complete, torch_orders
from tessel.baselines.zbv_hand import zbv_hand_orders
from tessel.schedule import Schedule
from tessel.timing import orders_of

pytest.importorskip("torch")
PROFILED = dict(forward=0.5, backward=0.488, weight=0.252, latency=0.032)  # the ZB repository's, per chunk


def valid(s: Schedule, method: str) -> Schedule:
    assert s.errors() == [] and s.meta["method"] == method
    return s


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_torch_dualpipev_is_tessels_dualpipev_task_for_task(p: int) -> None:
    # two independent writings of DeepSeek's eight phases give the same per-device orders
    z = library.zbv(p)
    for n in (2 * p, 2 * p + 1, 3 * p + 2):
        assert torch_orders(z, "torch-dualpipev", n) == dualpipev_orders(z, _v_chain(z, "dualpipev"), n)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_torch_zbv_is_tessels_zb_v_hand_task_for_task(p: int) -> None:
    z = library.zbv(p)
    for n in (1, 2 * p - 1, 2 * p, 3 * p + 1):
        assert torch_orders(z, "torch-zbv", n) == zbv_hand_orders(z, _v_chain(z, "zb-v-hand"), n)


@pytest.mark.parametrize("p,v", [(2, 2), (3, 3), (4, 2), (6, 2)])
def test_torch_interleaved_zb_is_tessels_interleaved_zb_h1_task_for_task(p: int, v: int) -> None:
    # torch's generator and tessel's construction from ZB-H1's two ideas give the same orders
    z = library.interleaved_zb(p, v, **PROFILED)
    for n in (p, 2 * p, 3 * p):
        ours = valid(BASELINES["interleaved-zb-h1"](z, n, None), "interleaved-zb-h1")
        assert torch_orders(z, "torch-interleaved-zb", n) == [list(o) for o in orders_of(ours)]


@pytest.mark.parametrize("p,v", [(2, 2), (4, 2), (4, 3)])
def test_torch_interleaved_1f1b_keeps_megatrons_makespan_and_warm_up(p: int, v: int) -> None:
    # unit-free closed forms: Megatron's interleaved 1F1B takes n v (F + B) + (p - 1)(F + B), and
    # rank r runs 2 (p - r - 1) + (v - 1) p warm-up forwards before its first backward frees one
    f, b = 1, 3
    pl = library.interleaved(p, v, forward=f, backward=b)
    for n in (p, 2 * p, 4 * p):
        s = valid(BASELINES["torch-interleaved-1f1b"](pl, n, None), "torch-interleaved-1f1b")
        assert s.makespan == n * v * (f + b) + (p - 1) * (f + b)
        assert s.peak_memory == tuple(min(2 * (p - r - 1) + (v - 1) * p + 1, n * v) for r in range(p))


def test_torch_zbv_holds_1f1bs_memory_with_split_backwards(tmp_path: Path) -> None:
    # ZB-V's claim: the peak is 1F1B's, 2p chunk activations (M_B), once every device is full
    p, n = 4, 16
    s = valid(BASELINES["torch-zbv"](library.zbv(p), n, None), "torch-zbv")
    assert s.peak_memory == (2 * p,) * p
    assert s.makespan <= BASELINES["1f1b"](library.zbv(p), n, None).makespan
    s.save(tmp_path / "zbv.json")
    checker_verdict(tmp_path / "zbv.json")


@pytest.mark.parametrize("method,placement", [
    ("torch-zbv", library.zbv(4, **PROFILED)), ("torch-dualpipev", library.zbv(4, **PROFILED)),
    ("torch-interleaved-1f1b", library.interleaved(4, 2, forward=1.0, backward=1.48, latency=0.032)),
    ("torch-interleaved-1f1b", library.interleaved_zb(4, 2, **PROFILED)),
    ("torch-interleaved-zb", library.interleaved_zb(4, 2, **PROFILED)),
    ("torch-interleaved-zb", library.interleaved_zb(4, 3, **PROFILED)),
])
def test_every_torch_order_is_valid_with_profiled_costs_and_latency(method: str, placement: object) -> None:
    from tessel.placement import Placement
    assert isinstance(placement, Placement)
    for n in (8, 12):
        s = valid(BASELINES[method](placement, n, None), method)
        assert s.lower_bound <= s.makespan
        assert sum(len(o) for o in s.device_orders()) == n * len(placement.blocks)


def test_torch_interleaved_zb_splits_what_interleaved_1f1b_runs_whole() -> None:
    # the same placement, its W either right after B (1F1B) or moved into bubbles (zero bubble)
    pl = library.interleaved_zb(4, 2)
    whole = valid(BASELINES["torch-interleaved-1f1b"](pl, 16, None), "torch-interleaved-1f1b")
    zb = valid(BASELINES["torch-interleaved-zb"](pl, 16, None), "torch-interleaved-zb")
    assert zb.makespan < whole.makespan
    assert zb.makespan >= 16 * 2 * 3  # a device's work: n micro-batches x 2 chunks x (F + B + W)


def test_where_torch_orders_apply_and_are_raced() -> None:
    assert {"torch-zbv", "torch-dualpipev"} <= set(applicable(library.zbv(4)))
    assert "torch-interleaved-1f1b" in applicable(library.interleaved(4, 2))
    assert "torch-interleaved-zb" not in applicable(library.interleaved(4, 2))
    assert not any(m.startswith("torch") for m in raced(library.zbv(4)))  # only on request
    assert "needs a V" in (why_not("torch-zbv", library.vshape(4)) or "")
    assert "split into B and W" in (why_not("torch-interleaved-zb", library.interleaved(4, 2)) or "")
    assert ">= 2 chunks per device" in (why_not("torch-interleaved-1f1b", library.interleaved(4, 1)) or "")
    with pytest.raises(BaselineError, match="torch's ScheduleDualPipeV refuses 4 ranks x 2 stages, 6 micro-batches"):
        BASELINES["torch-dualpipev"](library.zbv(4), 6, None)


def test_an_order_missing_a_task_is_refused_by_name() -> None:
    # torch 2.13's Schedule1F1B leaves micro-batch 0's forward out on its last rank: the same check
    z = library.zbv(2)
    orders = torch_orders(z, "torch-zbv", 4)
    broken = [list(o) for o in orders]
    broken[1].remove(("f1", 0))
    with pytest.raises(BaselineError, match="device 1 never runs f1 of micro-batch 0"):
        _check_complete(z, "torch-zbv", 4, broken)
    broken[1] += [("f1", 0), ("f1", 0)]
    with pytest.raises(BaselineError, match="device 1 runs f1 of micro-batch 0 twice"):
        _check_complete(z, "torch-zbv", 4, broken)

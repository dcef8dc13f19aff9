"""Schedule files: the four rules through `tessel check`, malformed files, JSON round trip, unroll."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest
from shared_files import checker_verdict, run_checker

from tessel import library
from tessel.baselines import BASELINES, vmem
from tessel.baselines.repetend import detect
from tessel.baselines.schedules import _v_chain
from tessel.baselines.vmem import vmem_starts
from tessel.placement import Block, make_placement
from tessel.schedule import Schedule


@pytest.fixture(scope="module")
def one_f_one_b() -> dict[str, Any]:
    """1F1B on vshape-4 (F=1, B=3), 4 micro-batches, memory limit 4 (its peak)."""
    return BASELINES["1f1b"](library.vshape(4), 4, 4).to_dict()


def task(d: dict[str, Any], block: str, mb: int) -> dict[str, Any]:
    return next(t for t in d["tasks"] if t["block"] == block and t["micro_batch"] == mb)


def drop_task(d: dict[str, Any]) -> None:
    d["tasks"].remove(task(d, "b3", 2))


def negative_start(d: dict[str, Any]) -> None:
    task(d, "f0", 0)["start"] = -1


def early_input(d: dict[str, Any]) -> None:
    task(d, "b0", 0)["start"] = 0  # runs 0..3 on device 3, which is idle then; f3#0 ends at 4


def over_limit(d: dict[str, Any]) -> None:
    d["memory_limit"] = 3


CORRUPTIONS: dict[str, tuple[Callable[[dict[str, Any]], None], int, str]] = {
    "missing": (drop_task, 1, "rule 1: 1 tasks missing, e.g. b3#2"),
    "negative": (negative_start, 1, "rule 1: task f0#0 has bad start -1"),
    "dependency": (early_input, 2, "rule 2: b0#0 starts at 0 before its input f3#0 is ready at 4"),
    "memory": (over_limit, 4, "rule 4: device 0: memory reaches 4 at time 3, over its limit 3"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_check_names_the_broken_rule(case: str, one_f_one_b: dict[str, Any], tessel, tmp_path: Path) -> None:
    corrupt, rule, message = CORRUPTIONS[case]
    d = json.loads(json.dumps(one_f_one_b))
    corrupt(d)
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(d))
    rc, _, err = tessel("check", path)
    assert rc == 1 and message in err
    assert all(line.strip().startswith(f"rule {rule}:") for line in err.splitlines()[1:])


def test_check_names_an_overlap_on_a_device(tessel, tmp_path: Path) -> None:
    p = make_placement("two", 1, [Block("a", "forward", 2, 0, (0,)), Block("b", "forward", 1, 0, (0,))], [])
    good = Schedule.build(p, 1, {("a", 0): 0, ("b", 0): 2})
    d = good.to_dict()
    task(d, "b", 0)["start"] = 1
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps(d))
    rc, _, err = tessel("check", path)
    assert rc == 1 and "rule 3: device 0: b#0 at 1 overlaps a#0 running 0..2" in err


def test_check_a_valid_file(one_f_one_b: dict[str, Any], tessel, tmp_path: Path) -> None:
    path = tmp_path / "ok.json"
    path.write_text(json.dumps(one_f_one_b))
    rc, out, err = tessel("check", path)
    assert rc == 0 and err == "" and f"valid: {path}" in out and "makespan: 28" in out


@pytest.mark.parametrize("text,message", [
    ("{not json", "malformed JSON"),
    ('{"format": "tessel-schedule", "version": 2}', "not a tessel-schedule version 1 document"),
    ('{"format": "tessel-schedule", "version": 1, "placement": {"devices": 1, "blocks": '
     '[{"id": "a", "duration": 1, "devices": [0]}]}, "micro_batches": 1}', "missing field 'tasks'"),
    ('{"format": "tessel-schedule", "version": 1, "placement": {"devices": 1, "blocks": '
     '[{"id": "a", "duration": 0, "devices": [0]}]}, "micro_batches": 1, "tasks": []}',
     "block a: duration must be a positive number"),
])
def test_check_malformed_file_exit_2(text: str, message: str, tessel, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    rc, out, err = tessel("check", path)
    assert rc == 2 and message in err and err.count("\n") == 1


def test_json_round_trip_keeps_everything(tmp_path: Path) -> None:
    s = BASELINES["zb-h1"](library.zb(4, latency=0.5), 12, [6, 6, 6, 5])
    s.save(tmp_path / "s.json")
    t = Schedule.load(tmp_path / "s.json", check=True)
    assert t.placement == s.placement and t.tasks == s.tasks and t.micro_batches == 12
    assert t.memory_limit == (6, 6, 6, 5) and t.repetend == s.repetend and t.meta == s.meta
    assert t.figures() == s.figures()


def test_save_writes_the_bytes_of_json_dumps_of_to_dict(tmp_path: Path) -> None:
    """save writes the tasks straight from the Task values: the same bytes as the dicts would
    give, with float starts, ids that JSON escapes, a limit per device and meta json cannot write."""
    blocks = [Block("f\u00e9\"0", "forward", 0.3, 1, (0,)), Block("b\u202e1", "backward", 0.7, -1, (0,))]
    p = make_placement("esc\u00e9", 1, blocks, [("f\u00e9\"0", "b\u202e1")])
    plain = BASELINES["1f1b"](library.zb(4, forward=0.3, backward=0.7, weight=0.1), 6, None)
    for s in (BASELINES["gpipe"](p, 3, 5).with_meta(odd=object(), nan=float("nan"), big=10**30), plain,
              BASELINES["zb-h1"](library.zb(4, latency=0.5), 12, [6, 6, 6, 5])):
        s.save(tmp_path / "s.json")
        text = (tmp_path / "s.json").read_text()
        assert text == json.dumps(s.to_dict(), indent=None, separators=(",", ":"), default=str)
        assert Schedule.load(tmp_path / "s.json", check=True).tasks == s.tasks


def test_with_meta_keeps_the_figures_computed_so_far() -> None:
    s = BASELINES["1f1b"](library.vshape(4), 8, 4)
    peaks = s.peak_memory
    t = s.with_meta(note="x")
    assert t.meta["note"] == "x" and "note" not in s.meta
    assert t.__dict__["peak_memory"] is peaks and t.figures() == s.figures() and t.tasks is s.tasks


def test_independent_checker_agrees(one_f_one_b: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(one_f_one_b))
    r = run_checker(path)
    assert r.returncode == 0 and json.loads(r.stdout)["makespan"] == 28
    corrupted = json.loads(json.dumps(one_f_one_b))
    early_input(corrupted)
    path.write_text(json.dumps(corrupted))
    r = run_checker(path)
    assert r.returncode == 1


@pytest.mark.slow
def test_unroll_1f1b_to_ten_thousand_equals_building_it() -> None:
    v = library.vshape(4)
    small = BASELINES["1f1b"](v, 16, None)
    assert small.repetend is not None and small.repetend.period == 4
    unrolled = small.unroll(10_000)
    direct = BASELINES["1f1b"](v, 10_000, None)
    assert unrolled.start == direct.start
    assert unrolled.makespan == (10_000 + 3) * 4 and unrolled.peak_memory == (4, 3, 2, 1)


# p = 6 at 10 activations: at V-Half's 8 v-mem's urgent and overtaking walks (vmem.FILLS) leave
# no repetend for the detection to find
@pytest.mark.parametrize("p, n, limit", [(4, 16, 8), pytest.param(6, 18, 10, marks=pytest.mark.slow)])
def test_unroll_with_fractional_costs_keeps_releases_before_allocations(tmp_path: Path, p: int, n: int,
                                                                        limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the blocks' own warm-ups only: at p = 6 the squeezed block v-mem picks has no repetend either
    monkeypatch.setattr(vmem, "SQUEEZED", ())
    # v-mem on the profiled V (F/B/W 0.5/0.488/0.252, latency 0.032), its repetend found by the
    # baselines' own detection: shifting a W and the forward right after it by j periods left the
    # W ending a hair after the forward starts (0.252 + 31.748000000000005 = 32.00000000000001 > 32),
    # an activation over the limit by rule 4; unroll now keeps the unshifted order (tessel/dust.py)
    z = library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=0.032)
    caps = (limit,) * p
    make = lru_cache(lambda k: Schedule.build(z, k, vmem_starts(z, _v_chain(z, "v-mem"), k, caps), caps))
    rep = detect(make, n, 1)
    assert rep is not None and rep.period != int(rep.period)
    s = replace(make(n), repetend=rep)
    for m in (n + 1, n + 2, n + 9, n + 60, n + 600):
        u = s.unroll(m)  # validated by tessel's rules
        assert u.errors() == [] and max(u.peak_memory) <= limit
        assert u.makespan == pytest.approx(s.makespan + (m - n) * rep.period, abs=1e-6)
    u.save(tmp_path / "u.json")
    checker_verdict(tmp_path / "u.json")  # the independent checker agrees (where ../shared is)


def test_unroll_without_a_repetend_says_what_to_do() -> None:
    """`-n` other than the schedule's on a schedule without a repetend (a plan's baseline pick):
    the error says to make it for that count, not only that there is no repetend."""
    from dataclasses import replace

    from tessel.schedule import ScheduleError
    s = BASELINES["gpipe"](library.build("vshape", 4), 4, None).with_meta(method="gpipe")
    s = replace(s, repetend=None)
    with pytest.raises(ScheduleError, match=r"made by gpipe\) is for 4 micro-batches .* make it for 16 instead "
                                            r"\(the same search, baseline or plan with -n 16\)"):
        s.unroll(16)

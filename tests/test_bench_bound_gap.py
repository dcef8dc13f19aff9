"""bench/bound_gap.py on a bench/vpeers.py --cache file: each row with the limits it was searched
under, its best makespan among the peers that fit them, and bounds no higher than a valid schedule."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bound_gap  # noqa: E402

from tessel.baselines import run_baseline  # noqa: E402


def test_a_vpeers_cache_row_is_bounded_below_its_recorded_schedules(tmp_path: Path) -> None:
    # zbv, 3 devices, 6 micro-batches, unit costs, latency 0.5, under 1F1B's own per-device peaks;
    # one peer fits them (its peak is 1F1B's), one does not (a device above)
    key = {"shape": "zbv", "p": 3, "m": 6, "costs": "unit", "latency": True}
    placement = bound_gap.Config(3, 6, "unit", True).placement("zbv")
    s = run_baseline("1f1b", placement, 6, None)
    assert s.errors() == []
    limit = list(s.peak_memory)
    over = [limit[0] + 1, *limit[1:]]
    rows = [{"key": {**key, "kind": "peers", "zb_repo": None},
             "value": [{"name": "fits", "makespan": s.makespan, "peak": limit},
                       {"name": "over", "makespan": s.makespan - 5, "peak": over},
                       {"name": "refused", "error": "no repository"}]},
            {"key": {**key, "kind": "row", "limit": limit, "memory": "1F1B", "time_limit": 1.0},
             "value": {"tessel": s.makespan + 1, "alone": s.makespan + 2, "bound": 0}}]
    path = tmp_path / "cache.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    [(case, tessel, best)] = bound_gap.cases(path, None)
    assert case.limit == tuple(limit) and case.memory == "1F1B's" and case.latency and case.m == 6
    assert tessel == s.makespan + 1 and best == s.makespan  # the peer over the limits does not count
    line, gap, best_gap, own = bound_gap.measure(path.name, case, tessel, best, bound_gap.Effort(devices=0, above=1.01))
    searched = bound_gap.searched(case.placement, case.m, case.limit)
    assert 0 < searched <= s.makespan and best_gap >= 1 and gap is not None and own is not None
    assert line.startswith("| cache.jsonl | zbv | 3 | 6 | unit | 1F1B's |") and own >= gap


def test_a_peer_rebuilt_with_another_peak_than_recorded_gets_the_recorded_largest_on_every_device() -> None:
    # bench/results/peers-v-p16-zbv.md recorded torch ZBVZeroBubble's largest peak 33 (p = 16, m = 32,
    # profiled) where the schedule rebuilt here peaks otherwise: such a row is bounded under the
    # recorded largest on every device (at least the peer's memory: still a lower bound) instead
    # of stopping the whole table
    cells = {"placement": "zbv", "p": "4", "m": "8", "costs": "unit", "latency": "0",
             "memory": "torch ZBVZeroBubble's", "limit (max/device)": "99"}
    case = bound_gap.case_of(cells, None)
    assert case.limit == 99 and case.p == 4 and case.m == 8
    assert bound_gap.case_of({**cells, "memory": "1F1B's"}, None).limit == 99  # and 1F1B's (peers-v-p16.md)


def test_over_keeps_only_the_rows_an_earlier_table_lists_above_five_percent(tmp_path: Path) -> None:
    # bench/bound_gap.py --over: the rows of an earlier table with tessel / bound above 1.05, by
    # placement, p, m, costs, memory and tessel as the table prints them
    head = "| file | placement | p | m | costs | memory | old | search | device | relax | bound | tessel | best | " \
           "tessel / bound | best / bound | tessel / search | bound s |"
    rows = ["| peers-v.md | zbv | 4 | 12 | profiled | V-Min's | 31 | 35 | 35 | 37 | 37.856 | 40.056 | 40.056 | 1.0581 | "
            "1.0581 | 1.1 | 25 |",
            "| peers-v.md | zbv | 4 | 12 | profiled | V-Half's | 31 | 35 | 35 | 37 | 38.2 | 40.056 | 40.056 | 1.0486 | "
            "1.0486 | 1.1 | 25 |"]
    path = tmp_path / "gap.md"
    path.write_text("\n".join([head, "|" + "---|" * 17, *rows]) + "\n")
    # each with the bound that table proved: the group relaxations start there
    assert bound_gap.rows_over(path) == {("zbv", "4", "12", "profiled", "V-Min's", "40.056"): 37.856}
    case = bound_gap.case_of({"placement": "zbv", "p": "4", "m": "12", "costs": "profiled", "latency": "0",
                              "memory": "V-Min's", "limit (max/device)": "4"}, None)
    assert bound_gap._key(case, 40.056) in bound_gap.rows_over(path)

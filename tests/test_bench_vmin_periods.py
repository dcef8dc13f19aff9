"""bench/vmin_periods.py: the shortest repetends of a V under a row's memory, bisected between the
period floor and above it; what it reports found is a repetend that keeps the limits."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vmin_periods  # noqa: E402

from tessel.search.budget import Clock  # noqa: E402
from tessel.search.completion import plain_unroll  # noqa: E402
from tessel.search.problem import make_problem  # noqa: E402
from tessel.search.repetend import modulo_of, solve_period  # noqa: E402


def test_the_periods_bisected_under_a_rows_limits_are_ordered_and_the_found_ones_fit(tmp_path: Path) -> None:
    # zbv, 3 devices, unit costs, no latency, 3 activations a device: V-Min-like memory, where
    # Little's law and the round trips push the period above the busiest device's load
    limit = [3, 3, 3]
    key = {"kind": "row", "shape": "zbv", "p": 3, "m": 9, "costs": "unit", "latency": False,
           "memory": "V-Min", "limit": limit}
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"key": key, "value": {}}) + "\n"
                    + json.dumps({"key": {**key, "memory": "1F1B", "limit": [9, 9, 9]}, "value": {}}) + "\n")
    assert vmin_periods.limits(str(rows), "V-Min", "unit") == {(3, False): limit}
    # one copy: each solve well under a second unloaded (two copies, the same bisection, take seconds each)
    r = vmin_periods.run_case(((3, False), limit, "unit", 20.0, 6, 1.6, (1,)))
    assert r["floor"] >= r["load"] > 0
    problem = make_problem(vmin_periods.Config(3, 12, "unit", False).placement("zbv"), tuple(limit))
    for copies in (1,):
        c = r[f"copies{copies}"]
        assert c["found"] is not None and c["found"] >= r["floor"]
        assert c["infeasible"] is None or c["infeasible"] < c["found"]
        res = solve_period(problem, c["period"], Clock(20), 1, copies=copies)
        assert res.found
        mod = modulo_of(res.values, problem, c["period"], copies)
        s = problem.grid_schedule(12, plain_unroll(mod, 12))  # checks every rule, memory included
        assert max(s.peak_memory) <= max(limit)
    lines = vmin_periods.table([r])
    assert lines[2].startswith("| 3 | no | 3 | 3 | 3 | 3.5 | - | 4 | - | - | - |")

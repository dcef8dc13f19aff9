"""bench/vmin_holds.py: a searched V's memory holds per steady micro-batch against their least
(Little's law), and the share of each device's span its memory sits at the limit."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vmin_holds  # noqa: E402
from shared_files import checker_verdict  # noqa: E402
from vpeers import Config  # noqa: E402

from tessel.placement import Block, make_placement  # noqa: E402
from tessel.schedule import Schedule  # noqa: E402


def test_holds_are_at_least_the_v_round_trip_and_the_limit_share_follows_the_peak(tmp_path: Path) -> None:
    # zbv, 3 devices, unit costs: device d holds stage d (down the V and back: 6 - d forwards and
    # backwards) and stage 5 - d (d + 1 of each), each until its W: 7 (F + B) + 2 W on every device
    limit = [3.0, 3.0, 3.0]
    key = {"kind": "row", "shape": "zbv", "p": 3, "m": 8, "costs": "unit", "latency": False,
           "memory": "V-Min", "limit": limit}
    out = tmp_path / "holds.md"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"key": key, "value": {}}) + "\n"
                    + json.dumps({"key": {**key, "memory": "1F1B", "limit": [9, 9, 9]}, "value": {}}) + "\n")
    with pytest.raises(SystemExit, match="no V-Min row"):  # no such device count in the cache
        vmin_holds.main(["--rows", str(rows), "--costs", "unit", "--case", "4,8,0", "-o", str(out)])
    assert not out.exists()
    row = vmin_holds.run_case((3, 8, False), limit, "unit", 5.0, check=False)
    row.schedule.validate()
    row.schedule.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")  # a second opinion where ../shared is there
    assert max(row.schedule.peak_memory) <= 3
    f, b, w, _ = Config(3, 8, "unit", False).chunk()
    assert [d.device for d in row.devices] == [0, 1, 2]
    for d in row.devices:
        assert abs(d.least - (7 * (f + b) + 2 * w)) < 1e-9
        assert d.hold >= d.least - 1e-9  # no micro-batch holds less than its round trip
        assert 0.0 <= d.at_limit <= 1.0 and d.interval > 0
    assert row.makespan >= row.bound > 0 and row.load == 2 * (f + b + w)
    lines = vmin_holds.table([row])
    assert lines[2].startswith(f"| 3 | 8 | no | {row.makespan:.3f} |")


def test_the_limit_share_is_the_time_memory_sits_at_the_limit() -> None:
    # one device, a block holding 1 from its start to its grad's end: two micro-batches back to back
    # hold 1, then 2 while both are in flight, then 1, then 0
    blocks = [Block("f0", "forward", 1, 1, (0,)), Block("b0", "backward", 1, -1, (0,), grad_of="f0")]
    p = make_placement("one", 1, blocks, [("f0", "b0")])
    starts = {("f0", 0): 0, ("f0", 1): 1, ("b0", 0): 2, ("b0", 1): 3}
    s = Schedule.build(p, 2, starts)
    assert abs(vmin_holds.at_limit(s, 0, 2) - 2 / 4) < 1e-9  # [1, 3) of the span [0, 4)
    assert vmin_holds.at_limit(s, 0, 3) == 0.0

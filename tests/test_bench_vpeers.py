"""bench/vpeers.py --cache: a rerun reuses the rows a first run appended (no search runs again)
and renders the same table bytes, a torn last line (a run killed mid-write) included."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import vpeers  # noqa: E402

# the zb placement at p = 2, m = 4, unit costs: no ZB repository, so its peers are refused (`x`) and the
# one memory row is 1F1B's
ARGS = ["--p", "2", "--m", "2", "--costs", "unit", "--latency", "0", "--shapes", "zb", "--time-limit", "2"]


def test_cache_rerun_reuses_rows_and_gives_identical_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, out = tmp_path / "c.jsonl", tmp_path / "peers.md"
    args = [*ARGS, "--cache", str(cache), "-o", str(out)]
    vpeers.main(args)
    first = out.read_bytes()
    records = [json.loads(line) for line in cache.read_text().splitlines()]
    assert [r["key"]["kind"] for r in records] == ["peers", "row"]
    row = records[1]["value"]
    # 4 x (F + B + W) = 12 per device, and the fill and drain of 2 stages (1 each): the bound, met
    assert row["tessel"] == row["alone"] == row["bound"] == 14

    def no_search(*_: Any, **__: Any) -> None:
        raise AssertionError("a cached row was searched again")

    monkeypatch.setattr(vpeers, "search", no_search)
    with cache.open("a") as f:
        f.write('{"key": {"kind": "row"')  # a run killed mid-write
    out.unlink()
    vpeers.main(args)
    assert out.read_bytes() == first
    assert b"| zb | 2 | 4 | unit | 0 | 1F1B's |" in first

"""Fuzzed placement documents: reading one either gives a placement that keeps every rule or
raises a TesselError (one line, exit 2 on the command line), never anything else."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessel.cli import main
from tessel.errors import TesselError
from tessel.placement import KINDS, MAX_VALUE, MIN_DURATION, Placement, placement_from_dict

pytestmark = pytest.mark.slow  # hundreds of fuzzed documents per test

IDS = st.sampled_from(["a", "b", "c", "d", ""]) | st.text(max_size=4)
ANY_SCALAR = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=5)
NUMBER = (st.integers(-3, 10) | st.floats(allow_nan=True, allow_infinity=True) | st.just(10**400)
          | st.sampled_from([1e-300, 1e308, MIN_DURATION / 10, MAX_VALUE * 10]))
ANYTHING = st.recursive(ANY_SCALAR, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)


@st.composite
def valid_document(draw: st.DrawFn) -> dict[str, Any]:
    n, devices = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    dev = st.lists(st.integers(0, devices - 1), min_size=1, max_size=devices, unique=True)
    blocks = [{"id": f"b{i}", "kind": draw(st.sampled_from(KINDS)),
               "duration": draw(st.integers(1, 5) | st.floats(0.001, 100)),
               "memory": draw(st.integers(-2, 2)), "devices": draw(dev)} for i in range(n)]
    edges = [[f"b{i}", f"b{j}"] for i in range(n) for j in range(i + 1, n) if draw(st.booleans())]
    d: dict[str, Any] = {"name": "fuzz", "devices": devices, "blocks": blocks, "edges": edges}
    if draw(st.booleans()):
        d["latency"] = draw(st.integers(0, 3))
    return d


@st.composite
def document(draw: st.DrawFn) -> Any:
    """A valid placement with up to three changes: a field dropped, replaced by anything, a
    reversed or duplicated edge, a repeated id, a grad_of to any block."""
    d = draw(valid_document())
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(["top", "block", "edge", "cycle", "grad_of"]))
        if target == "top":
            key = draw(st.sampled_from(["name", "devices", "blocks", "edges", "latency"]))
            if draw(st.booleans()):
                d.pop(key, None)
            else:
                d[key] = draw(NUMBER | ANYTHING)
        elif target == "block" and isinstance(d.get("blocks"), list) and d["blocks"]:
            b = draw(st.sampled_from(d["blocks"]))
            if isinstance(b, dict):
                key = draw(st.sampled_from(["id", "kind", "duration", "memory", "devices", "grad_of"]))
                b[key] = draw(NUMBER | IDS | ANYTHING | st.lists(st.integers(-1, 5), max_size=3))
        elif target in ("edge", "cycle") and isinstance(d.get("edges"), list) and d["edges"]:
            e = draw(st.sampled_from(d["edges"]))
            d["edges"].append(list(reversed(e)) if target == "cycle" and isinstance(e, list) else draw(ANYTHING))
        elif target == "grad_of" and isinstance(d.get("blocks"), list) and len(d["blocks"]) > 1:
            b, f = draw(st.permutations(d["blocks"]))[:2]
            if isinstance(b, dict) and isinstance(f, dict):
                b["grad_of"] = f.get("id")
    return d


def _keeps_the_rules(p: Placement) -> None:
    ids = [b.id for b in p.blocks]
    assert len(set(ids)) == len(ids) and 1 <= p.devices
    assert all(MIN_DURATION <= b.duration <= MAX_VALUE and b.devices for b in p.blocks)
    assert set(p.topo_order) == set(ids)
    rank = {b: i for i, b in enumerate(p.topo_order)}
    assert all(rank[a] < rank[b] for a, b in p.edges)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document())
def test_reading_a_fuzzed_document_gives_a_placement_or_a_tessel_error(d: Any) -> None:
    try:
        p = placement_from_dict(d)
    except TesselError as e:
        assert str(e) and "\n" not in str(e) and len(str(e)) < 1000
        return
    _keeps_the_rules(p)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(d=document())
def test_show_of_a_fuzzed_file_is_a_picture_or_one_line(d: Any, tmp_path: Path,
                                                        capsys: Any) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d, allow_nan=True))
    capsys.readouterr()
    rc = main(["show", str(path)])
    out, err = capsys.readouterr()
    if rc == 0:
        assert out.startswith("placement ") and err == ""
    else:
        assert rc == 2 and err.count("\n") == 1 and err.startswith("tessel: error: ")


# ---- schedule documents: a valid one with a few fields changed ------------------------------------
def _valid_schedule() -> dict[str, Any]:
    from tessel import library
    from tessel.baselines import BASELINES
    return BASELINES["1f1b"](library.vshape(2), 3, 2).to_dict()


@st.composite
def schedule_document(draw: st.DrawFn) -> Any:
    d = _valid_schedule()
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(["top", "task", "repetend", "placement"]))
        value = draw(NUMBER | IDS | ANYTHING)
        if where == "top":
            key = draw(st.sampled_from(["format", "version", "micro_batches", "tasks", "memory_limit",
                                        "repetend", "meta", "placement"]))
            if draw(st.booleans()):
                d.pop(key, None)
            else:
                d[key] = value
        elif where == "task" and isinstance(d.get("tasks"), list) and d["tasks"]:
            t = draw(st.sampled_from(d["tasks"]))
            if isinstance(t, dict):
                t[draw(st.sampled_from(["block", "micro_batch", "start"]))] = value
        elif where == "repetend":
            d["repetend"] = {"period": draw(NUMBER), "start": draw(NUMBER), "end": draw(NUMBER)}
        elif isinstance(d.get("placement"), dict):
            d["placement"][draw(st.sampled_from(["devices", "blocks", "edges", "latency"]))] = value
    return d


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(d=schedule_document())
def test_check_and_show_of_a_fuzzed_schedule_answer_0_1_or_2(d: Any, tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(d, allow_nan=True))
    for command in ("check", "show"):
        capsys.readouterr()
        rc = main([command, str(path)])
        _, err = capsys.readouterr()
        assert rc in (0, 1, 2)
        if rc == 2:
            assert err.count("\n") == 1 and err.startswith("tessel: error: ")
        if rc == 1:
            assert "is invalid" in err and "Traceback" not in err

"""A new user's first hour: typos in documents are refused naming the closest field, a placement
whose memory never balances is not searched unless asked, errors raised in Python speak Python."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessel import library, search
from tessel.cli import main
from tessel.errors import PlacementError, ScheduleError
from tessel.placement import placement_from_dict
from tessel.schedule import schedule_from_dict
from tessel.search.problem import MemoryLimitError

CHAIN = {"name": "typo", "devices": 2, "blocks": [
    {"id": "f0", "kind": "forward", "duration": 1, "memory": 1, "devices": [0]},
    {"id": "f1", "kind": "forward", "duration": 1, "memory": 1, "devices": [1]},
    {"id": "b1", "kind": "backward", "duration": 2, "memory": -1, "devices": [1], "grad_of": "f1"},
    {"id": "b0", "kind": "backward", "duration": 2, "memory": -1, "devices": [0], "grad_of": "f0"}],
    "edges": [["f0", "f1"], ["f1", "b1"], ["b1", "b0"]]}


def _with(doc: dict, path: tuple, key: str, new: str) -> dict:
    out = json.loads(json.dumps(doc))
    where = out
    for k in path:
        where = where[k]
    where[new] = where.pop(key)
    return out


@pytest.mark.parametrize("path,key,typo,said", [
    (("blocks", 0), "memory", "memroy", "blocks[0] ('f0'): unknown field 'memroy' (did you mean 'memory'?"),
    (("blocks", 2), "grad_of", "gradof", "blocks[2] ('b1'): unknown field 'gradof' (did you mean 'grad_of'?"),
    ((), "edges", "edge", "unknown field 'edge' (did you mean 'edges'?")])
def test_misspelled_placement_fields_are_refused_with_the_closest_name(path: tuple, key: str, typo: str,
                                                                        said: str) -> None:
    placement_from_dict(CHAIN)  # as written, fine
    with pytest.raises(PlacementError, match=r"known: ") as e:
        placement_from_dict(_with(CHAIN, path, key, typo))
    assert said in str(e.value)


def test_unknown_schedule_fields_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = library.build("vshape", 2)
    doc = search(s, 2).to_dict()
    schedule_from_dict(doc)
    with pytest.raises(ScheduleError, match=r"unknown field 'taskz' \(did you mean 'tasks'\?"):
        schedule_from_dict(_with(doc, (), "tasks", "taskz") | {"tasks": doc["tasks"]})
    with pytest.raises(ScheduleError, match=r"tasks\[0\]: unknown field 'strat' \(did you mean 'start'\?"):
        schedule_from_dict(_with(doc, ("tasks", 0), "start", "strat") | {})
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({**doc, "memory_limt": 3}))
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'memory_limit'?" in err


def test_search_refuses_memory_that_grows_without_bound_unless_asked(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(json.dumps(CHAIN))
    del doc["blocks"][0]["memory"]  # what a typo used to do: memory 0, the backward still frees 1
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    assert main(["search", str(f), "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "device 0 sums to -1" in err and "--allow-unbounded-memory" in err
    assert main(["search", str(f), "-n", "2", "--allow-unbounded-memory", "-o", str(tmp_path / "s.json")]) == 0
    assert schedule_from_dict(json.loads((tmp_path / "s.json").read_text())).errors() == []


def test_memory_limit_error_in_python_names_the_argument_and_unit() -> None:
    with pytest.raises(MemoryLimitError) as e:
        search(library.build("vshape", 4), 8, memory=[1, 1, 1, 0.5])
    msg = str(e.value)
    assert "memory=[" in msg and "in the placement's memory unit" in msg, msg

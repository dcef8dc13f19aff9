"""Hostile and careless input: every attempt ends with one line and the documented exit code
(0 ok, 1 invalid schedule, 2 bad input, 130/143 interrupted), and no file the user had is lost
or replaced by a failed or interrupted command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tessel import io as tessel_io
from tessel import library
from tessel.baselines import BASELINES
from tessel.errors import LimitError, PlacementError, ScheduleError, TesselError
from tessel.placement import Block, make_placement, placement_from_dict
from tessel.schedule import Schedule, schedule_from_dict
from tessel.search import search

ROOT = Path(__file__).resolve().parents[1]
Run = Callable[..., tuple[int, str, str]]


def blk(i: str, devices: Any = (0,), **kw: Any) -> dict[str, Any]:
    return {"id": i, "kind": kw.pop("kind", "forward"), "duration": kw.pop("duration", 1),
            "memory": kw.pop("memory", 0), "devices": list(devices), **kw}


def doc(blocks: Any = None, edges: Any = (), devices: Any = 1, **kw: Any) -> dict[str, Any]:
    return {"name": "t", "devices": devices, "blocks": [blk("a")] if blocks is None else blocks,
            "edges": [list(e) for e in edges] if isinstance(edges, tuple) else edges, **kw}


def one_error_line(rc: int, out: str, err: str, message: str, code: int = 2) -> None:
    assert rc == code, (rc, out, err)
    assert err.count("\n") == 1 and err.startswith("tessel: error: "), err
    assert message in err, err
    assert len(err) < 1000  # never the whole input echoed back


# ---- placement documents -----------------------------------------------------------------------
BIG = "1" + "0" * 400  # an integer JSON keeps exact and float() cannot hold
BAD_TEXT: dict[str, tuple[str, str, str]] = {
    "deep-json": (".json", "[" * 100_000 + "]" * 100_000, "nested deeper than"),
    "deep-json-object": (".json", '{"a":' * 5_000 + "1" + "}" * 5_000, "nested deeper than"),
    "deep-yaml": (".yaml", "[" * 5_000 + "]" * 5_000, "nested deeper than"),
    "yaml-alias-bomb": (".yaml", "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(12)), "aliases are not accepted"),
    "yaml-python-tag": (".yaml", "!!python/object/apply:os.system ['true']", "malformed YAML"),
    "huge-int-duration": (".json", '{"devices":1,"blocks":[{"id":"a","duration":' + BIG + ',"devices":[0]}]}',
                          "duration must be a positive number"),
    "int-over-4300-digits": (".json", '{"devices":' + "9" * 5000 + '}', "malformed JSON value"),
    "nan-duration": (".json", '{"devices":1,"blocks":[{"id":"a","duration":NaN,"devices":[0]}]}',
                     "duration must be a positive number"),
    "inf-memory": (".json", '{"devices":1,"blocks":[{"id":"a","duration":1,"memory":Infinity,"devices":[0]}]}',
                   "memory must be a number"),
    "inf-latency": (".json", '{"devices":1,"latency":-Infinity,"blocks":[{"id":"a","duration":1,"devices":[0]}]}',
                    "latency must be a number >= 0"),
    "not-utf8": (".json", "\udcff", "not UTF-8"),
}

BAD_DOCS: dict[str, tuple[Any, str]] = {
    "a-billion-devices": (doc(devices=1_000_000_000), "devices must be 1..4096"),
    "devices-true": (doc(devices=True), "devices must be an integer"),
    "edges-null": (doc(edges=None), "edges must be a list"),
    "edges-5": (doc(edges=5), "edges must be a list"),
    "edge-of-lists": (doc([blk("a"), blk("b")], [[["a"], "b"]]), "edges[0] must be a pair of block ids"),
    "grad-of-list": (doc([blk("a"), blk("b", kind="backward", grad_of=["a"])]), "grad_of must be a block id"),
    "duration-1e308": (doc([blk("a", duration=1e308)]), "duration must be a positive number"),
    "duration-1e-300": (doc([blk("a", duration=1e-300)]), "duration must be a positive number"),
    "duration-below-tolerance": (doc([blk("a", duration=1e-12)]), "duration must be a positive number"),
    "duration-bool": (doc([blk("a", duration=True)]), "duration must be a positive number"),
    "memory-1e300": (doc([blk("a", memory=-1e300)]), "memory must be a number"),
    "long-id": (doc([blk("x" * 100_000)]), "block id must be a string of 1..200 characters"),
    "long-name": (doc(name="n" * 100_000), "name must be a string"),
    "kind-huge": (doc([blk("a", kind="k" * 100_000)]), "is not one of"),
    "device-list-huge": (doc([blk("a", devices=range(5000))]), "devices listed, more than"),
    "device-float": (doc([blk("a", devices=[0.0])]), "device 0.0 out of range"),
    "too-many-blocks": (doc([blk(f"b{i}") for i in range(100_001)]), "blocks, more than the 100,000"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_TEXT))
def test_bad_placement_text_one_line_exit_2(case: str, tessel: Run, tmp_path: Path) -> None:
    suffix, text, message = BAD_TEXT[case]
    path = tmp_path / f"p{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    for command in (("show", path), ("search", path, "-n", "4"), ("baseline", "greedy", path, "-n", "4")):
        one_error_line(*tessel(*command), message)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_bad_placement_document_one_line_exit_2(case: str, tessel: Run, tmp_path: Path) -> None:
    d, message = BAD_DOCS[case]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(d))
    one_error_line(*tessel("show", path), message)
    with pytest.raises(TesselError, match="."):
        placement_from_dict(d)


def test_document_size_is_checked_before_reading(tessel: Run, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tessel_io, "MAX_DOCUMENT_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text(json.dumps(doc([blk(f"b{i}") for i in range(50)])))
    one_error_line(*tessel("show", path), "more than the 1,000 bytes accepted")
    if Path("/dev/zero").exists():  # endless: refused before any read, as every non-regular file
        one_error_line(*tessel("show", "/dev/zero"), "is a device, not a regular file")


def test_library_errors_share_one_base() -> None:
    from tessel.baselines import BaselineError
    from tessel.cli.common import UsageError
    from tessel.search.problem import MemoryLimitError
    from tessel.timing import DeadlockError
    for cls in (PlacementError, ScheduleError, LimitError, BaselineError, UsageError, MemoryLimitError, DeadlockError):
        assert issubclass(cls, TesselError)
    assert issubclass(TesselError, ValueError)


# ---- command-line options ----------------------------------------------------------------------
BAD_OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "memory-inf": (("search", "vshape", "-n", "4", "--memory", "inf"), "--memory: memory limit must be finite"),
    "memory-nan": (("baseline", "1f1b", "vshape", "-n", "4", "--memory", "nan"), "memory limit must be finite"),
    "memory-negative": (("search", "vshape", "-n", "4", "--memory", "1,-1,1,1"), "memory limit must be finite"),
    "backward-negative": (("show", "vshape", "--backward", "-2"), "--backward must be a finite number > 0"),
    "backward-zero": (("baseline", "1f1b", "vshape", "-n", "4", "--backward", "0"), "--backward must be"),
    "forward-nan": (("search", "vshape", "-n", "4", "--forward", "nan"), "--forward must be"),
    "latency-inf": (("show", "vshape", "--latency", "inf"), "--latency must be a finite number >= 0"),
    "devices-billion": (("show", "vshape", "--devices", "1000000000"), "--devices must be 1..4096"),
    "n-billion": (("search", "vshape", "-n", "1000000000"), "use at most 250,000 micro-batches"),
    "n-billion-baseline": (("baseline", "gpipe", "vshape", "-n", "1000000000"), "unroll"),
    "n-huge-text": (("search", "vshape", "-n", "9" * 5000), "expected a positive integer"),
    "compare-time-0": (("compare", "vshape", "-n", "4", "--time-limit", "0"), "time limit must be"),
    "compare-time-nan": (("compare", "vshape", "-n", "4", "--time-limit", "nan"), "time limit must be"),
    "compare-time-negative": (("compare", "vshape", "-n", "4", "--time-limit", "-5"), "time limit must be"),
    "unknown-option": (("search", "vshape", "-n", "4", "--frobnicate"), "unrecognized arguments: --frobnicate"),
    "missing-n": (("search", "vshape"), "the following arguments are required: --micro-batches/-n"),
    "bad-choice": (("search", "vshape", "-n", "4", "--mode", "magic"), "argument --mode: invalid choice"),
    "no-command": ((), "the following arguments are required: COMMAND"),
    "long-name": (("show", "w" * 5000), "unknown placement 'www"),
    "long-file-name": (("show", "w" * 5000 + ".json"), "File name too long"),
    "plot-suffix": (("baseline", "1f1b", "vshape", "-n", "4", "--plot", "x.gif"), "must end in .png or .svg"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_bad_option_one_line_exit_2(case: str, tessel: Run) -> None:
    argv, message = BAD_OPTIONS[case]
    one_error_line(*tessel(*argv), message)


def test_built_in_options_with_a_file_are_refused(tessel: Run, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    library.vshape(2).save(path)
    sched = tmp_path / "s.json"
    BASELINES["1f1b"](library.vshape(2), 4, None).save(sched)
    for argv in (("show", path, "--devices", "8"), ("search", path, "-n", "4", "--devices", "4"),
                 ("baseline", "1f1b", path, "-n", "4", "--backward", "2"), ("show", sched, "--devices", "2")):
        one_error_line(*tessel(*argv), "shape(s) a built-in placement")


# ---- schedule files --------------------------------------------------------------------------------
@pytest.fixture
def schedule_doc() -> dict[str, Any]:
    return BASELINES["1f1b"](library.vshape(2), 4, 2).to_dict()


def _write(tmp_path: Path, d: dict[str, Any], raw: str | None = None) -> Path:
    path = tmp_path / "s.json"
    path.write_text(raw if raw is not None else json.dumps(d))
    return path


@pytest.mark.parametrize("field,value,message", [
    ("version", True, "not a tessel-schedule version 1"),
    ("version", 1.0, "not a tessel-schedule version 1"),
    ("version", "1", "not a tessel-schedule version 1"),
    ("memory_limit", float("nan"), "memory limit must be a number"),
    ("memory_limit", float("inf"), "memory limit must be a number"),
    ("memory_limit", [1, -1], "memory limit must be a number"),
    ("micro_batches", 10**9, "tasks, more than the 2,000,000 accepted"),
    ("repetend", {"period": 0, "start": 0, "end": 1}, "repetend: period, start and end"),
    ("repetend", {"period": float("nan"), "start": 0, "end": 1}, "repetend: period, start and end"),
])
def test_malformed_schedule_one_line_exit_2(field: str, value: Any, message: str, schedule_doc: dict[str, Any],
                                            tessel: Run, tmp_path: Path) -> None:
    schedule_doc[field] = value
    path = _write(tmp_path, schedule_doc)
    for command in ("check", "show", "simulate"):
        one_error_line(*tessel(command, path), message)


@pytest.mark.parametrize("start", ["Infinity", "NaN", BIG, "-1e-3"])
def test_show_and_check_of_a_bad_start_exit_1(start: str, schedule_doc: dict[str, Any], tessel: Run,
                                              tmp_path: Path) -> None:
    schedule_doc["tasks"][0]["start"] = "START"
    path = _write(tmp_path, schedule_doc, json.dumps(schedule_doc).replace('"START"', start))
    for command in ("check", "show"):
        rc, out, err = tessel(command, path)
        assert rc == 1 and "is invalid" in err and "rule 1:" in err and "has bad start" in err
        assert "Traceback" not in err and len(err) < 1000


def test_show_of_an_invalid_schedule_exits_1(schedule_doc: dict[str, Any], tessel: Run, tmp_path: Path) -> None:
    schedule_doc["tasks"][0]["block"] = "nowhere"
    rc, _, err = tessel("show", _write(tmp_path, schedule_doc))
    assert rc == 1 and "rule 1: task of unknown block 'nowhere'" in err
    schedule_doc["tasks"][0]["block"] = "f0"
    schedule_doc["memory_limit"] = 1
    rc, out, err = tessel("show", _write(tmp_path, schedule_doc))
    assert rc == 1 and out.startswith("d0") and "rule 4: device 0: memory reaches 2" in err


def test_tampered_figures_are_recomputed_not_printed(tessel: Run, tmp_path: Path) -> None:
    s = search(library.vshape(2), 12, time_limit=20)
    assert s.repetend is not None
    d = s.to_dict()
    d["repetend"]["period"] = 1  # a claim the tasks do not keep
    d["meta"].update(method="magic", makespan=1, status="optimal")
    path = _write(tmp_path, d)
    rc, out, _ = tessel("show", path)
    assert rc == 0
    lines = dict(line.strip().split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["makespan"] == str(s.makespan) and lines["period"] == "-"
    assert lines["method"] == "magic (recorded in the file)" and lines["repetend"].startswith("ignored")
    honest = _write(tmp_path, s.to_dict())
    rc, out, _ = tessel("check", honest)
    assert rc == 0 and f"period: {s.repetend.period}" in out


def test_rule_numbers_are_fields(schedule_doc: dict[str, Any]) -> None:
    schedule_doc["memory_limit"] = 1
    with pytest.raises(ScheduleError) as e:
        schedule_from_dict(schedule_doc, check=True)
    assert e.value.rule == 4
    assert [v.rule for v in schedule_from_dict(schedule_doc).violations()] == [4]


# ---- output files ------------------------------------------------------------------------------
def test_read_only_output_is_not_replaced(tessel: Run, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    out.write_text("mine")
    out.chmod(0o444)
    for argv in (("baseline", "1f1b", "vshape", "-n", "4", "-o", out), ("search", "vshape", "-n", "4", "-o", out),
                 ("baseline", "1f1b", "vshape", "-n", "4", "--trace", out)):
        one_error_line(*tessel(*argv), "read-only; not replacing it")
        assert out.read_text() == "mine"
    with pytest.raises(TesselError, match="read-only"):
        library.vshape(2).save(out)
    assert out.read_text() == "mine"


def test_missing_directory_is_not_created(tessel: Run, tmp_path: Path) -> None:
    for option, name in (("-o", "s.json"), ("--plot", "g.png"), ("--trace", "t.json")):
        target = tmp_path / "no" / "such" / name
        one_error_line(*tessel("baseline", "1f1b", "vshape", "-n", "4", option, target), "does not exist")
        assert not (tmp_path / "no").exists()


def test_output_onto_a_directory_is_refused(tessel: Run, tmp_path: Path) -> None:
    one_error_line(*tessel("baseline", "1f1b", "vshape", "-n", "4", "-o", tmp_path), "not a regular file")


def _cli(*argv: str, **kw: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tessel", *argv], cwd=kw.pop("cwd"), env=env, text=True,
                            stdout=kw.pop("stdout", subprocess.PIPE), stderr=subprocess.PIPE, **kw)


@pytest.mark.slow
def test_a_closed_pipe_never_loses_the_output_file(tmp_path: Path) -> None:
    """`tessel baseline ... --ascii -o f.json | head -1`: head leaves after one line."""
    out = tmp_path / "f.json"
    p = _cli("baseline", "1f1b", "vshape", "-n", "2000", "--ascii", "-o", str(out), cwd=tmp_path)
    assert p.stdout is not None
    p.stdout.readline()
    p.stdout.close()
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0 and err == ""
    assert Schedule.load(out, check=True).micro_batches == 2000


# ---- signals -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_mid_search_stops_with_one_line_and_keeps_the_file(signum: int, code: int, tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    out.write_text("the user's earlier schedule")
    # an exact solve of a large problem: far longer than the few seconds before the signal
    p = _cli("search", "mshape", "--devices", "16", "-n", "64", "--mode", "exact", "--time-limit", "300",
             "-o", str(out), cwd=tmp_path)
    time.sleep(4)
    assert p.poll() is None, "the search ended before the signal"
    p.send_signal(signum)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    assert p.returncode == code and err == "tessel: interrupted\n"
    assert out.read_text() == "the user's earlier schedule"
    assert [f.name for f in tmp_path.iterdir()] == ["f.json"]  # no temporary file left behind


# ---- determinism and graph size ------------------------------------------------------------------
def _without_timing(s: Schedule) -> str:
    d = s.to_dict()
    for k in ("seconds", "search_seconds"):
        d["meta"].pop(k, None)
    return json.dumps(d, sort_keys=True)


@pytest.mark.slow
@pytest.mark.parametrize("name,devices,n,mode", [("xshape", 4, 32, "tessel"), ("nnshape", 4, 16, "tessel"),
                                                 ("vshape", 4, 8, "exact")])
def test_same_search_twice_gives_the_same_schedule(name: str, devices: int, n: int, mode: str) -> None:
    p = library.build(name, devices=devices)
    first, second = (search(p, n, mode=mode, time_limit=60) for _ in range(2))
    first.validate()
    assert _without_timing(first) == _without_timing(second)


@pytest.mark.slow
def test_topological_order_of_many_unconnected_blocks_is_declaration_order() -> None:
    blocks = [Block(f"b{i}", "forward", 1, 0, (i % 3,)) for i in range(100_000)]
    p = make_placement("wide", 3, blocks, [])
    assert p.topo_order == tuple(b.id for b in blocks)
    chain = make_placement("chain", 1, [Block(f"c{i}", "forward", 1, 0, (0,)) for i in range(3)],
                           [("c2", "c1"), ("c1", "c0")])
    assert chain.topo_order == ("c2", "c1", "c0")
    assert chain.topo_sorted(lambda b: 0) == ["c2", "c1", "c0"]

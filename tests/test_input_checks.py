"""Round 3 of hostile input (issue 21): what is checked before any work, and numbers in range
that compute in range. Each refusal is one line and exit 2 naming the option, variable or file."""
from __future__ import annotations

import itertools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tessel import library
from tessel.baselines import schedules
from tessel.baselines.engine import backward_first, list_schedule
from tessel.errors import LimitError, PlacementError
from tessel.io import read_document
from tessel.placement import make_placement
from tessel.search import search
from tessel.search.problem import MAX_SPAN_UNITS, make_problem

Run = Any


def one_error_line(rc: int, err: str, message: str) -> None:
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("tessel: error: "), err
    assert message in err, err


# ---- files: regular ones only; strict YAML; Unicode text -------------------------------------------
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_at_once_not_waited_on(tessel: Run, tmp_path: Path) -> None:
    fifo = tmp_path / "p.json"
    os.mkfifo(fifo)  # no writer: opening it for reading in blocking mode would wait forever
    for command in ("show", "check"):
        rc, _, err = tessel(command, fifo)
        one_error_line(rc, err, "is a FIFO, not a regular file")


def test_a_directory_is_refused(tessel: Run, tmp_path: Path) -> None:
    (tmp_path / "d.json").mkdir()
    rc, _, err = tessel("show", tmp_path / "d.json")
    one_error_line(rc, err, "is a directory, not a regular file")


YAML_REFUSED = {
    "duplicate key": ("devices: 1\ndevices: 2\nblocks: []\n", "appears twice"),
    "merge key": ("base: {devices: 1}\nother:\n  <<: {devices: 1}\nblocks: []\n", "merge keys are not accepted"),
    "sexagesimal": ("devices: 1\nblocks:\n  - {id: a, kind: forward, duration: 1:30, devices: [0]}\n",
                    "'1:30' at line 3"),
    "yes as a boolean": ("name: yes\ndevices: 1\nblocks: []\n", "'yes' at line 1"),
    "hex integer": ("devices: 0x1\nblocks: []\n", "'0x1' at line 1"),
    "octal integer": ("devices: 017\nblocks: []\n", "'017' at line 1"),
    "underscores": ("devices: 1_0\nblocks: []\n", "'1_0' at line 1"),
    "date": ("name: 2001-12-14\ndevices: 1\nblocks: []\n", "as a date"),
}


@pytest.mark.parametrize("case", sorted(YAML_REFUSED))
def test_yaml_oddities_are_refused_not_converted(case: str, tessel: Run, tmp_path: Path) -> None:
    text, message = YAML_REFUSED[case]
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(PlacementError, match=message.replace("(", r"\(")):
        read_document(path)
    rc, _, err = tessel("show", path)
    one_error_line(rc, err, message)


def test_plain_yaml_still_reads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("a: [1, -2, 2.5, 1e3, .5, true, False, null, '1:30', 'yes', x, -1.5E-7, .inf]\n"
                    "b: {c: 1, d: 2}\n")
    doc = read_document(path)
    assert doc["a"][:7] == [1, -2, 2.5, 1000.0, 0.5, True, False]
    assert doc["a"][7:12] == [None, "1:30", "yes", "x", -1.5e-7] and doc["a"][12] == float("inf")
    assert doc["b"] == {"c": 1, "d": 2}


@pytest.mark.parametrize("text", ['{"name": "\\ud800", "devices": 1, "blocks": []}',
                                  '{"devices": 1, "\\udc80": 1, "blocks": []}',
                                  '{"devices": 1, "blocks": [{"id": "a\\udfff", "kind": "forward", '
                                  '"duration": 1, "devices": [0]}]}'])
def test_lone_surrogates_are_refused(text: str, tessel: Run, tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(PlacementError, match="lone surrogate"):
        read_document(path)
    for argv in (("show", path), ("search", path, "-n", "2", "--plot", tmp_path / "x.png")):
        rc, _, err = tessel(*argv)
        one_error_line(rc, err, "lone surrogate")
    assert not (tmp_path / "x.png").exists()


# ---- options: ranges checked before work ---------------------------------------------------------
BAD_OPTIONS = {
    "timeout 1e300": (("run", "--model", "mlp", "--programs", "--timeout", "1e300"), "--timeout must be"),
    "timeout 2200000": (("run", "--model", "mlp", "--programs", "--timeout", "2200000"), "at most 1e+06"),
    "micro-batch size 1e12": (("run", "--model", "mlp", "--programs", "--micro-batch-size", "1000000000000"),
                              "--micro-batch-size must be an integer in 1..65,536"),
    "seed -1": (("run", "--model", "mlp", "--programs", "--seed", "-1"), "--seed must be an integer"),
    "lr nan": (("run", "--model", "mlp", "--programs", "--lr", "nan"), "--lr must be a finite number"),
    "run -n 10**30": (("run", "--model", "mlp", "--programs", "-n", str(10**30)), "tasks accepted"),
    "search time limit 1e300": (("search", "vshape", "-n", "2", "--time-limit", "1e300"), "time limit must be"),
    "plan memory 1e300": (("plan", "gpt", "--devices", "4", "--memory", "1e300"), "--memory must be"),
    "plan hidden nan": (("plan", "gpt", "--devices", "4", "--set", "hidden=nan"),
                        "--set hidden (model gpt): expected an integer"),
    "plan layers 1e9": (("plan", "gpt", "--devices", "4", "--set", "layers=1000000000"), "1..10,000"),
    "plan lm_head 3": (("plan", "gpt", "--devices", "4", "--set", "lm_head=3"), "expected true or false"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_options_out_of_range_are_refused_up_front(case: str, tessel: Run) -> None:
    argv, message = BAD_OPTIONS[case]
    rc, _, err = tessel(*argv)
    one_error_line(rc, err, message)


def test_a_schedule_file_is_not_unrolled_past_the_task_limit(tessel: Run, tmp_path: Path) -> None:
    s = tmp_path / "s.json"
    assert tessel("search", "vshape", "-n", "8", "-o", s)[0] == 0
    rc, _, err = tessel("run", "--model", "mlp", "--schedule", s, "-n", str(10**30), "--programs")
    one_error_line(rc, err, "tasks, more than the 2,000,000 accepted")


@pytest.mark.parametrize("env,message", [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "abc"}, "MASTER_PORT must be"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}, "MASTER_PORT must be"),
    ({"RANK": "abc", "WORLD_SIZE": "2"}, "RANK must be an integer"),
    ({"RANK": "5", "WORLD_SIZE": "1"}, "RANK must be an integer in 0..WORLD_SIZE-1 = 0..0, got '5'"),
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}, "nothing listens"),
])
def test_torchrun_environment_refused_in_one_line(env: dict[str, str], message: str, tessel: Run,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tessel.cli import environ
    monkeypatch.setattr(environ, "PROBE_SECONDS", 0.2)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, _, err = tessel("run", "--model", "mlp", "--schedule", "1f1b", "-n", "2")
    one_error_line(rc, err, message)


# ---- numbers in range compute in range -------------------------------------------------------------
@pytest.mark.parametrize("mode", ["tessel", "fast", "exact"])
def test_a_huge_latency_over_tiny_durations_gives_a_valid_schedule(mode: str) -> None:
    p = library.build("vshape", devices=4, forward=1e-6, backward=3e-6, latency=1e10)
    problem = make_problem(p)
    assert problem.units.latency <= MAX_SPAN_UNITS  # 10**20 units before: an int64 overflow in CP-SAT
    assert all(0 < b.duration <= MAX_SPAN_UNITS for b in problem.units.blocks)
    s = search(p, 8, mode=mode, time_limit=3)
    assert s.errors() == []
    assert s.makespan >= 3 * 1e10  # three cross-device hops at least, each the latency


def test_a_horizon_past_the_largest_time_is_refused_up_front() -> None:
    p = library.build("vshape", devices=4, latency=1e12)
    with pytest.raises(LimitError, match="past the 1e"):
        search(p, 8, time_limit=3)


# ---- baselines in linear time: the closed form is the walk's schedule ------------------------------
def _tp(p: Any, k: int) -> Any:
    blocks = [replace(b, devices=tuple(range(b.devices[0] * k, b.devices[0] * k + k))) for b in p.blocks]
    return make_placement(f"{p.name}-tp{k}", p.devices * k, blocks, p.edges, p.latency)


@pytest.mark.parametrize("devices,n,latency,tp", list(itertools.product((1, 3, 5), (1, 4, 7), (0, 0.7), (1, 2))))
def test_1f1b_closed_form_equals_the_walk(devices: int, n: int, latency: float, tp: int) -> None:
    p = _tp(library.build("vshape", devices=devices, forward=1.5, backward=2, latency=latency), tp)
    chain = schedules._plain_pipeline(p)
    assert chain is not None
    fast = schedules._pipeline_starts(p, chain, n)
    walk = list_schedule(p, n, backward_first(p), schedules._depth_pools(p, n, [[b.id for b in p.blocks]]))
    assert fast.keys() == walk.keys()
    assert all(abs(fast[k] - walk[k]) <= 1e-9 for k in fast)


def test_the_closed_form_is_not_taken_off_plain_pipelines() -> None:
    for name in ("interleaved", "mshape", "zb", "xshape"):
        assert schedules._plain_pipeline(library.build(name, devices=4)) is None

"""Issue 22, items 5-9: results that fit, bounded processes, outputs decided before work, text
that cannot steer a terminal, and the smaller ones (workers, duplicated tasks, the fork server).
(Item 4, a check that can fail on NaN: tests/test_runtime_cli.py; the store: test_run_store_attacks.py.)"""
from __future__ import annotations

import json
import os
import signal
import stat
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tessel import library
from tessel.cli import main
from tessel.cli.runtime import _report
from tessel.errors import LimitError
from tessel.io import all_or_nothing, atomic_write
from tessel.methods import run_method
from tessel.runtime.launch import LaunchError, Options, launch
from tessel.runtime.train import RankReport, StepReport

pytestmark = pytest.mark.torch

FAST = Options(timeout=120, pg_timeout=60)


def _sized(ctx: Any, size: int) -> str:
    return str(ctx.rank) * size


def _fails_on_rank_1(ctx: Any) -> str:
    if ctx.rank == 1:
        raise RuntimeError("the real cause")
    time.sleep(60)
    return "unreachable"


def _kills_the_fork_server(ctx: Any) -> str:
    if ctx.rank == 0:
        os.kill(os.getppid(), signal.SIGKILL)  # a local worker's parent is the fork server
    time.sleep(60)
    return "unreachable"


# ---- item 5: results that fit, the rank's reason first -----------------------------------------
def test_a_result_larger_than_the_stores_value_limit_comes_back() -> None:
    size = 12 * 2**20  # over TCPStore's 8 MiB value limit (the 50,000-step report)
    out = launch(_sized, 2, (size,), FAST)
    assert [len(x) for x in out] == [size, size] and out[1][:3] == "111"


def test_a_failing_rank_s_reason_leads_the_launchers_message() -> None:
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as e:
        launch(_fails_on_rank_1, 2, (), FAST)
    assert str(e.value).splitlines()[0] == "rank 1: RuntimeError: the real cause", str(e.value)
    assert time.monotonic() - t0 < 50  # stopped, not slept out


def test_a_long_run_prints_its_first_and_last_steps(capsys: pytest.CaptureFixture[str]) -> None:
    steps = tuple(StepReport({"f1": float(i)}, 0.01, 1) for i in range(500))
    assert _report([RankReport(0, ("f1",), steps)], check=False) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[1:lines.index(next(x for x in lines if x.startswith("median step")))]
    assert len(table) == 21 and table[10].startswith("(480 more)"), table
    assert table[0].split()[:2] == ["1", "0.000000"] and table[-1].split()[:2] == ["500", "499.000000"]


# ---- item 6: bounded processes ---------------------------------------------------------------------
@pytest.mark.parametrize("argv,message", [
    (["--devices", "4096"], "4096 processes on"),
    (["--devices", "2", "--data-parallel", "1000"], "2000 processes on"),
])
def test_too_many_processes_are_refused_before_anything_starts(argv: list[str], message: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    assert main(["run", "--model", "mlp", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessel: error: ") and message in err and "--oversubscribe" in err, err
    assert time.monotonic() - t0 < 10  # before any search or process


def test_unrolling_obeys_the_task_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = run_method("1f1b", library.build("vshape", 2), 4)
    with pytest.raises(LimitError, match="2,000,000 accepted"):
        s.unroll(600_000)
    s.save(tmp_path / "s.json")
    t0 = time.monotonic()
    assert main(["run", "--model", "mlp", "--schedule", str(tmp_path / "s.json"), "-n", "600000", "--programs"]) == 2
    assert "more than the 2,000,000 accepted" in capsys.readouterr().err
    assert time.monotonic() - t0 < 10


# ---- item 7: outputs decided before work ------------------------------------------------------------
def _baseline(tmp: Path, *extra: str) -> int:
    return main(["baseline", "1f1b", "vshape", "--devices", "2", "-n", "4", *extra])


def test_outputs_are_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = str(tmp_path / "x.json")
    assert _baseline(tmp_path, "-o", x, "--trace", x) == 2
    assert "--trace and -o name the same file" in capsys.readouterr().err
    assert not Path(x).exists()
    with pytest.raises(SystemExit) as e:  # refused while parsing the arguments
        _baseline(tmp_path, "-o", str(tmp_path / ("a" * 256 + ".json")))
    assert e.value.code == 2 and "the name is too long" in capsys.readouterr().err
    assert _baseline(tmp_path, "-o", str(tmp_path / ("a" * 245 + ".json"))) == 0  # 250 bytes: fine
    capsys.readouterr()
    p = tmp_path / "p.json"
    library.build("vshape", 2).save(p)
    before = p.read_bytes()
    assert main(["baseline", "1f1b", str(p), "-n", "4", "-o", str(p)]) == 2
    assert "is the command's input PLACEMENT" in capsys.readouterr().err and p.read_bytes() == before
    t0 = time.monotonic()  # plan checks --placement-out before planning (seconds of search)
    with pytest.raises(SystemExit) as e:
        main(["plan", "gpt", "--devices", "4", "--placement-out", str(tmp_path / "no" / "p.json")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err and time.monotonic() - t0 < 10


def test_a_failed_chart_leaves_no_schedule_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import tessel.viz.gantt as gantt

    def disk_full(*a: Any, **k: Any) -> None:  # a fault injected where a real disk fills up
        raise OSError(28, "No space left on device", str(tmp_path / "s.png"))
    monkeypatch.setattr(gantt, "plot_schedule", disk_full)
    assert _baseline(tmp_path, "-o", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == []  # neither the schedule nor a temporary file


def test_all_or_nothing_and_kept_permissions(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old")
    a.chmod(0o600)
    with pytest.raises(RuntimeError), all_or_nothing():
        atomic_write(a, "new")
        atomic_write(b, "new")
        raise RuntimeError("the command failed")
    assert a.read_text() == "old" and not b.exists() and sorted(os.listdir(tmp_path)) == ["a.txt"]
    atomic_write(a, "new")
    assert a.read_text() == "new" and stat.S_IMODE(a.stat().st_mode) == 0o600


def test_svg_charts_are_byte_identical(tmp_path: Path) -> None:
    for name in ("a.svg", "b.svg"):
        assert _baseline(tmp_path, "--plot", str(tmp_path / name)) == 0
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


# ---- item 8: text that cannot steer a terminal ----------------------------------------------------
def test_ids_and_meta_are_shown_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = run_method("1f1b", library.build("vshape", 2), 2)
    doc = s.to_dict()
    doc["meta"]["method"] = "1f1b\n    makespan: 1\x1b[2J"
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\\x1b[2J" in out
    assert sum("makespan: 1" == line.strip() for line in out.splitlines()) == 0  # no fake line
    evil = {"name": "p\x1b]0;owned\x07", "devices": 1, "blocks": [
        {"id": "a\x1b[31m", "kind": "forward", "duration": 1, "devices": [0]}], "edges": []}
    (tmp_path / "p.json").write_text(json.dumps(evil))
    main(["show", str(tmp_path / "p.json")])
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\x07" not in out + err
    bad = dict(evil, edges=[["a\x1b[31m", "nowhere\x1b[2J"]])
    (tmp_path / "q.json").write_text(json.dumps(bad))
    assert main(["show", str(tmp_path / "q.json")]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and err.count("\n") == 1, err


# ---- item 9: the smaller ones -----------------------------------------------------------------------
def test_workers_are_bounded(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["search", "vshape", "-n", "4", "--workers", "100000"])
    assert e.value.code == 2
    assert "--workers: at most 64 worker threads" in capsys.readouterr().err


@pytest.mark.parametrize("n", [2, 64])
def test_check_of_a_duplicated_task_exits_1_at_any_length(n: int, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_method("1f1b", library.build("vshape", 2), n).to_dict()
    doc["tasks"].append(doc["tasks"][0])
    (tmp_path / "d.json").write_text(json.dumps(doc))
    assert main(["check", str(tmp_path / "d.json")]) == 1
    assert "rule 1" in capsys.readouterr().err


def test_a_dead_fork_server_is_not_reported_as_exit_code_255() -> None:
    with pytest.raises(LaunchError) as e:
        launch(_kills_the_fork_server, 2, (), FAST)
    text = str(e.value)
    assert text.startswith("the fork server ended"), text
    assert "exit code 255" not in text and "code 255" not in text, text

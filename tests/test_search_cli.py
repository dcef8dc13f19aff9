"""`tessel search`: summary, schedule file checked independently, errors as one line with exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_files import checker_verdict, suite_case


@pytest.mark.slow
def test_search_writes_a_valid_schedule_and_prints_its_figures(tessel, tmp_path: Path) -> None:
    out = tmp_path / "mshape.json"
    rc, stdout, stderr = tessel("search", "--time-limit", "60", "mshape", "--devices", "4", "-n", "16", "--memory", "20",
                                "--mode", "tessel", "-o", out)
    assert rc == 0, stderr
    lines = _lines(stdout)
    # one bound, the best proven (the fill through the all-device blocks), and one gap to it
    assert lines["bound"] == "108 (shard)" and "lower_bound" not in lines and "statuses" not in lines
    assert int(lines["makespan"]) <= 109  # the reference implementation's 109
    assert lines["gap"] == f"{(int(lines['makespan']) / 108 - 1) * 100:.1f}%"
    assert lines["method"] == "tessel"
    verdict = checker_verdict(out)
    assert verdict is None or verdict["makespan"] == int(lines["makespan"])
    doc = json.loads(out.read_text())
    assert doc["meta"]["status"] == "optimal" and doc["meta"]["lower_bound"] == 108
    # one micro-batch every 6; the file's repetend window may span several micro-batches (a
    # loaded machine can end on a compacted schedule whose repeating window is a multiple)
    assert doc["meta"]["period"] == 6 and doc["meta"]["period_optimal"] is True
    assert doc["repetend"]["period"] % 6 == 0


def test_search_details_and_proving_are_asked_for(tessel) -> None:
    """-v shows how the search got there (the analytic bound, statuses, seconds by phase);
    --prove solves the whole problem to the clock, which proves a bound above the arguments'."""
    rc, stdout, stderr = tessel("-v", "search", "nnshape", "--devices", "4", "-n", "16", "--memory", "20")
    assert rc == 0, stderr
    lines = _lines(stdout)
    assert lines["lower_bound"] == "128" and lines["bound"] == "140 (shard)" and "repetend=" in lines["statuses"]
    # one micro-batch every 8 (the file's repeating window may span several micro-batches)
    assert int(lines["period"]) % 8 == 0 and lines["period_optimal"] == "True"
    # the analytic bound is 20 on xshape at N = 2; the whole-problem solve (or the one-device
    # argument, which sees each task's release and tail, or its exact relaxation) proves 22, the makespan
    rc, stdout, stderr = tessel("search", "xshape", "--devices", "4", "-n", "2", "--prove", "--time-limit", "30")
    assert rc == 0, stderr
    lines = _lines(stdout)
    assert lines["bound"] in tuple(f"{lines['makespan']} ({x})" for x in ("solver", "device", "relaxation")), lines
    assert lines["makespan"] == "22" and lines["gap"] == "0.0%"


def _lines(stdout: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in stdout.splitlines() if ":" in line)}


def test_search_a_placement_file_in_fast_mode_with_per_device_memory(tessel, tmp_path: Path) -> None:
    case = suite_case("kshape-4")
    f = tmp_path / "kshape.json"
    f.write_text(json.dumps(case["placement"]))
    rc, stdout, stderr = tessel("search", "--time-limit", "60", f, "-n", "8", "--memory", "4,4,4,4", "--mode", "fast", "--ascii")
    assert rc == 0, stderr
    assert "d0" in stdout and "makespan: 52" in stdout and "method: fast" in stdout


def test_too_little_memory_is_one_line_and_exit_2(tessel) -> None:
    rc, stdout, stderr = tessel("search", "vshape", "-n", "8", "--memory", "0.5")
    assert rc == 2 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1
    assert "device 0 needs at least 1 (limit 0.5)" in stderr and "--memory 1,1,1,1" in stderr


def test_bad_options_are_rejected(tessel) -> None:
    rc, _, stderr = tessel("search", "vshape", "-n", "8", "--time-limit", "0")
    assert rc == 2 and "time limit must be a finite number > 0" in stderr
    rc, _, stderr = tessel("search", "vshape", "-n", "8", "--mode", "best")
    assert rc == 2 and "invalid choice" in stderr


def test_the_time_limit_counts_from_each_command_not_from_the_first_import(tessel, monkeypatch) -> None:
    import time

    import tessel.cli.search as cli_search
    from tessel.errors import TesselError
    seen: list[float] = []

    def spy(*args: object, started: float | None = None, **kw: object) -> object:
        seen.append(started if started is not None else -1.0)
        raise TesselError("stop here")

    before = time.perf_counter()
    monkeypatch.setattr(cli_search, "search", spy)
    rc, _, stderr = tessel("search", "vshape", "-n", "4", "--time-limit", "5")
    assert rc == 2 and "stop here" in stderr
    assert len(seen) == 1 and seen[0] >= before  # an in-process call gets its own wall clock


def test_plan_and_search_stop_at_the_same_wall_clock(tessel, tmp_path: Path) -> None:
    """Both commands build their clock the same way (search.command_clock) from the command's
    start: neither runs past its --time-limit, whatever it has left to try. Elapsed time is
    measured against the limit with room for a loaded machine; not a speed figure."""
    import time

    from tessel.schedule import Schedule
    limit = 6.0
    small_flava = ("--set", "hidden=1024", "--set", "layers=4", "--set", "fusion_layers=2", "--set", "image_seq=128",
                   "--set", "text_seq=64", "--set", "heads=16")
    runs = {"search": ("search", "nnshape", "--devices", "8", "-n", "64", "--memory", "20"),
            "plan": ("plan", "flava", "--devices", "4", "-n", "16", *small_flava)}
    elapsed = {}
    for name, argv in runs.items():
        out = tmp_path / f"{name}.json"
        t0 = time.perf_counter()
        rc, stdout, stderr = tessel(*argv, "--time-limit", limit, "-o", out)
        elapsed[name] = time.perf_counter() - t0
        assert rc == 0, stderr
        assert Schedule.load(out, check=True).errors() == []
    assert all(t <= limit * 1.5 + 2.0 for t in elapsed.values()), elapsed

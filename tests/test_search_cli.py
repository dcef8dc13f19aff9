"""`tessel search`: summary, schedule file checked independently, errors as one line with exit 2."""
from __future__ import annotations

import json
from pathlib import Path

from shared_files import checker_verdict, suite_case


def test_search_writes_a_valid_schedule_and_prints_its_figures(tessel, tmp_path: Path) -> None:
    out = tmp_path / "mshape.json"
    rc, stdout, stderr = tessel("search", "mshape", "--devices", "4", "-n", "16", "--memory", "20",
                                "--mode", "tessel", "-o", out)
    assert rc == 0, stderr
    lines = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in stdout.splitlines() if ":" in line)}
    assert lines["lower_bound"] == "96"
    assert int(lines["makespan"]) <= 109  # the reference implementation's 109
    assert lines["method"] == "tessel" and "repetend=optimal" in lines["statuses"]
    verdict = checker_verdict(out)
    assert verdict is None or verdict["makespan"] == int(lines["makespan"])
    doc = json.loads(out.read_text())
    # one micro-batch every 6; the file's repetend window may span several micro-batches (a
    # loaded machine can end on a compacted schedule whose repeating window is a multiple)
    assert doc["meta"]["period"] == 6 and doc["meta"]["period_optimal"] is True
    assert doc["repetend"]["period"] % 6 == 0


def test_search_a_placement_file_in_fast_mode_with_per_device_memory(tessel, tmp_path: Path) -> None:
    case = suite_case("kshape-4")
    f = tmp_path / "kshape.json"
    f.write_text(json.dumps(case["placement"]))
    rc, stdout, stderr = tessel("search", f, "-n", "8", "--memory", "4,4,4,4", "--mode", "fast", "--ascii")
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
    limit = 4.0
    runs = {"search": ("search", "nnshape", "--devices", "8", "-n", "64", "--memory", "20"),
            "plan": ("plan", "gpt", "--devices", "8", "-n", "32")}
    elapsed = {}
    for name, argv in runs.items():
        out = tmp_path / f"{name}.json"
        t0 = time.perf_counter()
        rc, stdout, stderr = tessel(*argv, "--time-limit", limit, "-o", out)
        elapsed[name] = time.perf_counter() - t0
        assert rc == 0, stderr
        assert Schedule.load(out, check=True).errors() == []
    assert all(t <= limit * 1.5 + 1.0 for t in elapsed.values()), elapsed

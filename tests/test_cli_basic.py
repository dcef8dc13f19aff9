"""`tessel placements`, `show`, `baseline`, `compare`: what they print and write."""
from __future__ import annotations

from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.schedule import Schedule


def test_placements_lists_every_name_with_its_description(tessel) -> None:
    rc, out, _ = tessel("placements")
    assert rc == 0
    for name, (_, description) in library.PLACEMENTS.items():
        assert any(line.startswith(name) and description in line for line in out.splitlines())


def test_show_placement_prints_picture_load_and_bounds(tessel) -> None:
    rc, out, _ = tessel("show", "mshape", "--devices", "4", "--micro-batches", "16")
    assert rc == 0
    assert "d0  fA0  f0" in out and "bA0" in out
    assert "critical path: 18" in out and "lower bound for 16 micro-batches: 96" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert [r[:3] for r in rows] == [[str(d), "4", "6"] for d in range(4)]


def test_show_costs_and_inference(tessel) -> None:
    rc, out, _ = tessel("show", "vshape", "--devices", "2", "--forward", "2", "--backward", "4", "--infer")
    assert rc == 0 and "vshape-2-infer: 2 devices, 2 blocks" in out and "b0" not in out
    rc, out, _ = tessel("show", "vshape", "--devices", "2", "--forward", "2", "--backward", "4", "--micro-batches", "3")
    assert "critical path: 12" in out and "lower bound for 3 micro-batches: 24" in out


def test_show_unknown_name_and_bad_devices_exit_2(tessel) -> None:
    rc, _, err = tessel("show", "wshape")
    assert rc == 2 and "unknown placement 'wshape'" in err and err.count("\n") == 1
    rc, _, err = tessel("show", "kshape", "--devices", "3")
    assert rc == 2 and "kshape needs an even device count" in err


def test_baseline_writes_a_file_the_independent_checker_accepts(tessel, tmp_path: Path) -> None:
    out_file = tmp_path / "s.json"
    rc, out, _ = tessel("baseline", "1f1b", "vshape", "--devices", "4", "--micro-batches", "16", "-o", out_file)
    assert rc == 0 and "makespan: 76" in out and f"wrote {out_file}" in out
    s = Schedule.load(out_file, check=True)
    assert s.makespan == 76 and s.meta["method"] == "1f1b"
    verdict = checker_verdict(out_file)
    assert verdict is None or verdict["makespan"] == 76


def test_baseline_ascii_memory_and_plot(tessel, tmp_path: Path) -> None:
    plot = tmp_path / "g.png"
    rc, out, _ = tessel("baseline", "zb-h1", "zb", "--micro-batches", "8", "--memory", "4", "--ascii",
                        "--plot", plot)
    assert rc == 0 and "memory_limit: 4,4,4,4" in out and "w7" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_show_schedule_file(tessel, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    tessel("baseline", "gpipe", "vshape", "--devices", "2", "--micro-batches", "2", "-o", path)
    rc, out, _ = tessel("show", path)
    assert rc == 0 and out.startswith("d0  f0 f1") and "makespan: 12" in out


@pytest.mark.parametrize("argv,message", [
    (("baseline", "pipedream", "vshape", "-n", "4"), "unknown baseline 'pipedream'"),
    (("baseline", "chimera", "vshape", "-n", "4"), "chimera needs two opposite pipelines"),
    (("baseline", "1f1b", "vshape", "-n", "16", "--memory", "2"), "1f1b needs memory 4 on device 0, over its limit 2"),
    (("baseline", "greedy", "vshape", "-n", "16", "--memory", "1,1,0,1"), "greedy: device 2 needs memory 1"),
    (("show", "vshape", "--plot", "x.png"), "--plot draws a schedule"),
])
def test_baseline_refusals_exit_2_in_one_line(argv: tuple[str, ...], message: str, tessel) -> None:
    rc, _, err = tessel(*argv)
    assert rc == 2 and message in err and err.count("\n") == 1


def test_compare_table_has_every_method_and_says_why_one_does_not_apply(tessel, tmp_path: Path) -> None:
    plot = tmp_path / "c.svg"
    rc, out, _ = tessel("compare", "zb", "--micro-batches", "8", "--memory", "20",
                        "--methods", "gpipe,1f1b,zb-h1,chimera,greedy", "--plot", plot)
    assert rc == 0 and "zb-4, 8 micro-batches, memory 20" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[2:] if line and not line.startswith("wrote")}
    assert set(rows) == {"gpipe", "1f1b", "zb-h1", "chimera", "greedy"}
    assert rows["zb-h1"][1:3] == ["38", "35"] and rows["1f1b"][1] == "41"
    assert rows["chimera"][1] == "-" and "two opposite pipelines" in " ".join(rows["chimera"])
    assert plot.read_text().lstrip().startswith("<?xml")


def test_compare_over_the_limit_is_a_row_not_a_failure(tessel) -> None:
    rc, out, _ = tessel("compare", "vshape", "-n", "8", "--memory", "3", "--methods", "gpipe,1f1b,greedy")
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert "gpipe needs memory 8 on device 0" in rows["gpipe"] and "1f1b needs memory 4" in rows["1f1b"]
    assert rows["greedy"].split()[1].isdigit()


def test_compare_unknown_method_exit_2(tessel) -> None:
    rc, _, err = tessel("compare", "vshape", "-n", "4", "--methods", "1f1b,nope")
    assert rc == 2 and "unknown method(s) nope" in err

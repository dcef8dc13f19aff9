"""`tessel export`: schedules (searched and baseline) of a chain, an interleaved ("loop") and a V
("v") placement as torch pipelining's action CSV, run by torch's `_PipelineScheduleRuntime` on 4
gloo ranks with the stages laid out as torchtitan lays them out: gradients equal one process's,
each rank executes the schedule's order. With torchtitan importable (TORCHTITAN_PYTHON names an
interpreter that has it; docs/torchtitan.md), the same CSVs go through torchtitan's own builder."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.cli import main
from tessel.errors import PlacementError
from tessel.methods import run_method
from tessel.placement import placement_from_dict
from tessel.runtime.pipelining import Export, export

N = 4
CASES = [("vshape", "1f1b", "loop"), ("vshape", "tessel", "loop"), ("interleaved", "interleaved", "loop"),
         ("interleaved", "tessel", "loop"), ("zbv", "zb-v", "v"), ("zbv", "tessel", "v")]
RUNNER = Path(__file__).with_name("pipelining_run.py")
TOL = 1e-5


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Export, Path]]:
    tmp = tmp_path_factory.mktemp("export")
    out = []
    for name, method, _ in CASES:
        s = run_method(method, library.build(name, 4), N)
        assert s.errors() == [], (name, method)
        path, csv = tmp / f"{name}-{method}.json", tmp / f"{name}-{method}.csv"
        s.save(path)
        checker_verdict(path)
        assert main(["export", str(path), "-o", str(csv)]) == 0
        e = export(s)
        assert csv.read_text() == e.csv  # the command writes what the library exports
        out.append((e, csv))
    return out


def _run(exported: list[tuple[Export, Path]], python: str, *flags: str) -> list[dict[str, Any]]:
    cases = [{"csv": str(csv), "style": e.layout, "stages": len(e.stages), "micro_batches": e.micro_batches,
              "schedule": e.torchtitan_schedule} for e, csv in exported]
    spec = exported[0][1].parent / ("titan.json" if flags else "torch.json")
    spec.write_text(json.dumps(cases))
    done = subprocess.run([python, str(RUNNER), str(spec), *flags], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[dict[str, Any]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_layouts_and_actions(exported: list[tuple[Export, Path]]) -> None:
    for (name, method, layout), (e, _) in zip(CASES, exported):
        assert e.layout == layout, (name, method)
        assert e.split_backward == (name == "zbv")
        kinds = {a.rstrip("0123456789")[-1] for row in e.rows for a in row}
        assert kinds == ({"F", "I", "W"} if name == "zbv" else {"F", "B"}), (name, method)
        per_stage = 3 if name == "zbv" else 2
        assert sum(map(len, e.rows)) == len(e.stages) * N * per_stage
    assert exported[-1][0].stages_on(0) == (0, 7)  # rank r holds stages r and 2p-1-r


def test_torch_runs_every_export_like_one_process_in_our_order(exported: list[tuple[Export, Path]]) -> None:
    for (name, method, _), (e, _), got in zip(CASES, exported, _run(exported, sys.executable)):
        assert got["diff"] <= TOL, (name, method, got["diff"])
        assert [tuple(r) for r in got["executed"]] == list(e.rows), (name, method)


def _torchtitan_python() -> str:
    python = os.environ.get("TORCHTITAN_PYTHON", "")
    if not python:
        try:
            import torchtitan  # noqa: F401
        except ImportError:
            pytest.skip("torchtitan not installed here; set TORCHTITAN_PYTHON (docs/torchtitan.md)")
        python = sys.executable
    return python


def test_torchtitan_builder_runs_every_export(exported: list[tuple[Export, Path]]) -> None:
    for (name, method, _), (e, _), got in zip(CASES, exported, _run(exported, _torchtitan_python(), "--torchtitan")):
        assert got["diff"] <= TOL, (name, method, got["diff"])
        assert [tuple(r) for r in got["executed"]] == list(e.rows), (name, method)


@pytest.mark.parametrize("name,why", [("mshape", "block fA0 of mshape-4 spans devices [0, 1, 2, 3]"),
                                      ("kshape", "placement kshape-4 is not a chain (it has branches or joins)"),
                                      ("vshape-infer", "trains every stage; block f0 of vshape-4-infer has no backward")])
def test_placements_the_format_cannot_express_are_refused(name: str, why: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    s = run_method("greedy", library.build(name.removesuffix("-infer"), 4, infer=name.endswith("infer")), 2)
    with pytest.raises(PlacementError, match=re.escape(why)):
        export(s)
    s.save(tmp_path / "s.json")
    assert main(["export", str(tmp_path / "s.json"), "-o", str(tmp_path / "s.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and why in err and not (tmp_path / "s.csv").exists()


def test_a_layout_torchtitan_does_not_build_is_written_with_a_note(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    doc = library.build("vshape", 2).to_dict()
    for b in doc["blocks"]:  # stage 0 on device 1, stage 1 on device 0: neither loop nor v
        b["devices"] = [1 - b["devices"][0]]
    s = run_method("1f1b", placement_from_dict(doc), 2)
    e = export(s)
    assert e.layout == "custom" and e.rank_of_stage == (1, 0) and e.torchtitan_keys("x.csv") == {}
    s.save(tmp_path / "s.json")
    assert main(["export", str(tmp_path / "s.json"), "-o", str(tmp_path / "s.csv")]) == 0
    assert "torchtitan lays stages out only as 'loop'" in capsys.readouterr().out
    assert (tmp_path / "s.csv").read_text().splitlines()[1].startswith("0F0")  # rank 1 holds stage 0

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
    doc = search(s, 2, time_limit=60).to_dict()
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
        search(library.build("vshape", 4), 8, memory=[1, 1, 1, 0.5], time_limit=60)
    msg = str(e.value)
    assert "memory=[" in msg and "in the placement's memory unit" in msg, msg


def test_show_summarises_a_placement_too_wide_to_draw(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A profiled placement (ms to the microsecond) drew one cell per 0.01 ms: tens of KB."""
    blocks, edges = [], []
    for i in range(16):
        blocks.append({"id": f"layer{i}.f", "kind": "forward", "duration": 1.013 + i / 997, "memory": 1,
                       "devices": [i % 4]})
        blocks.append({"id": f"layer{i}.b", "kind": "backward", "duration": 2.029 + i / 991, "memory": -1,
                       "devices": [i % 4], "grad_of": f"layer{i}.f"})
        edges.append([f"layer{i}.f", f"layer{i}.b"])
        if i:
            edges += [[f"layer{i - 1}.f", f"layer{i}.f"], [f"layer{i}.b", f"layer{i - 1}.b"]]
    f = tmp_path / "wide.json"
    f.write_text(json.dumps({"name": "wide", "devices": 4, "blocks": blocks, "edges": edges}))
    assert main(["show", str(f)]) == 0
    out = capsys.readouterr().out
    assert "scaled to 120 columns" in out and len(out) < 3000, len(out)
    assert max(len(line) for line in out.splitlines()) <= 200
    assert "d3  " in out and "8 blocks: layer3.f .. layer15.b" in out


def test_every_ascii_view_has_a_legend(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "mshape", "--devices", "4"]) == 0
    out = capsys.readouterr().out
    assert "legend: one micro-batch; each cell shows the block" in out and "sharded or tensor-parallel" in out
    assert main(["baseline", "1f1b", "zb", "--devices", "4", "-n", "4", "--ascii"]) == 0
    out = capsys.readouterr().out
    assert "legend: fN = forward of micro-batch N, bN = backward of micro-batch N, wN = weight of" in out


def test_gantt_boxes_name_their_block_where_it_fits() -> None:
    from tessel.baselines import BASELINES
    from tessel.viz.gantt import gantt_figure
    s = BASELINES["1f1b"](library.build("mshape", 4), 6, None)
    fig = gantt_figure(s)
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "b3:0" in texts and "0" in texts  # wide backward boxes named, narrow forwards numbered
    legend = {t.get_text() for lg in fig.legends for t in lg.get_texts()}
    assert any("sharded" in t for t in legend) and any("block:micro-batch" in t for t in legend)


def _wrong_step(ctx: object) -> float:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from tessel.runtime.pipeline import Pipeline
    from tessel.runtime.split import split_sequential
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(8, 8) for _ in range(4)))
    pipe = Pipeline(split_sequential(model, 4), "1f1b", loss_fn=F.mse_loss, micro_batches=4, ctx=ctx)  # type: ignore[arg-type]
    return pipe.step(torch.randn(8, 8))  # no target=


def test_a_wrong_step_call_fails_the_same_way_on_every_rank() -> None:
    """It failed on the last rank only, while the others reported a misleading shape-pass stop."""
    from tessel.runtime.launch import LaunchError, Options, launch
    with pytest.raises(LaunchError) as e:
        launch(_wrong_step, 4, options=Options(timeout=60, pg_timeout=20))
    lines = str(e.value).splitlines()
    assert "block 's3' reads batch field 'target', which step() did not get (pass target=...)" in lines[0]
    assert "shape pass" not in str(e.value) and "instruction" not in str(e.value)  # no rank got that far


def test_saving_into_a_taken_checkpoint_directory_fails_before_training(tmp_path: Path) -> None:
    from tessel.runtime.checkpoint import CheckpointError, check_new
    taken = tmp_path / "ckpt"
    taken.mkdir()
    (taken / ".metadata").write_text("")
    with pytest.raises(CheckpointError, match="already exists: give a new directory"):
        check_new(taken)
    with pytest.raises(CheckpointError, match="parent directory"):
        check_new(tmp_path / "missing" / "ckpt")
    assert check_new(tmp_path / "fresh") == tmp_path / "fresh"
    example = (Path(__file__).resolve().parents[1] / "examples" / "gpt2_pipeline.py").read_text()
    assert example.index("checkpoint.check_new(a.save)") < example.index("for step in range(")


def test_run_with_another_n_than_a_schedule_without_repetend_says_what_to_do(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tessel.baselines import BASELINES
    doc = BASELINES["gpipe"](library.build("vshape", 4), 4, None).with_meta(method="gpipe").to_dict()
    doc.pop("repetend", None)
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(doc))
    assert main(["run", "--model", "mlp", "--schedule", str(f), "-n", "8", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make it for 8 instead (the same search, baseline or plan with -n 8)" in err

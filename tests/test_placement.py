"""Placement validation (each rule names its culprit, the CLI says it in one line, exit 2), I/O,
and the stage builder."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tessel.builder import Stage, build_stages
from tessel.placement import Placement, PlacementError, load_placement, placement_from_dict


def doc(blocks: list[dict[str, Any]], edges: list[list[str]], devices: int = 2, **extra: Any) -> dict[str, Any]:
    return {"name": "t", "devices": devices, "blocks": blocks, "edges": edges, **extra}


def blk(id: str, dev: Any = 0, kind: str = "forward", duration: Any = 1, memory: Any = 0, **extra: Any) -> dict:
    return {"id": id, "kind": kind, "duration": duration, "memory": memory,
            "devices": dev if isinstance(dev, list) else [dev], **extra}


TRAIN = doc([blk("f0", 0, memory=1), blk("f1", 1, memory=1),
             blk("b1", 1, "backward", 2, -1, grad_of="f1"), blk("b0", 0, "backward", 2, -1, grad_of="f0")],
            [["f0", "f1"], ["f1", "b1"], ["b1", "b0"]])

BAD = {
    "cycle": (doc([blk("a"), blk("b", 1), blk("c")], [["a", "b"], ["b", "c"], ["c", "a"]]),
              "dependency cycle: "),
    "unknown-edge": (doc([blk("a"), blk("b")], [["a", "zz"]]), "edge a -> zz names unknown block 'zz'"),
    "device-range": (doc([blk("a", 2)], []), "block a: device 2 out of range 0..1"),
    "zero-duration": (doc([blk("a", duration=0)], []), "block a: duration must be a positive number, got 0"),
    "negative-duration": (doc([blk("a", duration=-2.5)], []), "got -2.5"),
    "text-duration": (doc([blk("a", duration="3")], []), "block a: duration must be a positive number"),
    "empty-devices": (doc([blk("a", [])], []), "block a: empty device set"),
    "duplicate-id": (doc([blk("a"), blk("a", 1)], []), "duplicate block id 'a'"),
    "grad-of-missing": (doc([blk("f"), blk("b", kind="backward", grad_of="nope")], [["f", "b"]]),
                        "block b: grad_of names unknown block 'nope'"),
    "grad-of-devices": (doc([blk("f", 0), blk("b", 1, "backward", grad_of="f")], [["f", "b"]]),
                        "block b: runs on devices [1] but its forward f runs on [0]"),
    "self-loop": (doc([blk("a")], [["a", "a"]]), "self-loop"),
    "kind": (doc([blk("a", kind="sideways")], []), "kind 'sideways'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_placement_names_the_culprit(case: str) -> None:
    d, message = BAD[case]
    with pytest.raises(PlacementError) as e:
        placement_from_dict(d)
    assert message in str(e.value)


def test_cycle_message_lists_the_cycle_closed() -> None:
    with pytest.raises(PlacementError) as e:
        placement_from_dict(BAD["cycle"][0])
    cycle = str(e.value).split(": ", 1)[1].split(" -> ")
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]


@pytest.mark.parametrize("case", sorted(BAD))
def test_cli_bad_placement_one_line_exit_2(case: str, tessel, tmp_path: Path) -> None:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(BAD[case][0]))
    rc, out, err = tessel("show", path)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("tessel: error: ") and BAD[case][1] in err


@pytest.mark.parametrize("name,text,message", [
    ("broken.json", '{"devices": 2, "blocks": [', "malformed JSON at line 1"),
    ("broken.yaml", "devices: 2\nblocks: [a, b\n", "malformed YAML"),
    ("list.json", "[1, 2]", "a placement must be an object"),
    ("noblocks.yaml", "devices: 2\n", "missing field 'blocks'"),
    ("devs.json", '{"devices": "four", "blocks": []}', "devices must be an integer"),
])
def test_cli_malformed_file_one_line_exit_2(name: str, text: str, message: str, tessel, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text)
    rc, out, err = tessel("show", path)
    assert rc == 2 and err.count("\n") == 1 and message in err


def test_cli_missing_file_exit_2(tessel, tmp_path: Path) -> None:
    rc, _, err = tessel("show", tmp_path / "nothing.json")
    assert rc == 2 and "cannot read" in err and err.count("\n") == 1


@pytest.mark.slow
def test_real_console_script_prints_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps(BAD["cycle"][0]))
    r = subprocess.run([sys.executable, "-m", "tessel", "show", str(path)], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1


def test_memory_that_does_not_return_to_zero_warns_for_training_only() -> None:
    leaky = json.loads(json.dumps(TRAIN))
    leaky["blocks"][0]["memory"] = 2
    p = placement_from_dict(leaky)
    assert len(p.warnings) == 1 and "device 0 sums to 1" in p.warnings[0]
    assert placement_from_dict(TRAIN).warnings == ()
    infer = doc([blk("f0", 0, memory=3), blk("f1", 1, memory=1)], [["f0", "f1"]])
    assert placement_from_dict(infer).warnings == ()


def test_cli_show_prints_the_memory_warning(tessel, tmp_path: Path) -> None:
    leaky = json.loads(json.dumps(TRAIN))
    leaky["blocks"][0]["memory"] = 2
    path = tmp_path / "leaky.json"
    path.write_text(json.dumps(leaky))
    rc, out, _ = tessel("show", path)
    assert rc == 0 and "warning: placement t: memory on device 0 sums to 1" in out


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_round_trip(suffix: str, tmp_path: Path) -> None:
    p = placement_from_dict(doc(TRAIN["blocks"], TRAIN["edges"], latency=0.5))
    p.save(tmp_path / f"p{suffix}")
    q = load_placement(tmp_path / f"p{suffix}")
    assert q == p and q.latency == 0.5 and q.by_id["b0"].grad_of == "f0"


# ---- builder ---------------------------------------------------------------------------------
def _two_branches(split: bool = False) -> Placement:
    stages = [Stage("emb", (0, 1), 1),  # frozen: no backward, no activation kept
              Stage("a", (0,), 1, 2, 1, memory=2), Stage("b", (1,), 1, 2, 0, memory=1),
              Stage("head", (0, 1), 1, 1, 1, memory=1)]
    edges = [("emb", "a"), ("emb", "b"), ("a", "head"), ("b", "head")]
    return build_stages("branches", 2, stages, edges, split_weight=split)


def test_builder_derives_backward_on_same_devices_with_reversed_edges() -> None:
    p = _two_branches()
    assert {b.id for b in p.blocks} == {"emb.f", "a.f", "b.f", "head.f", "a.b", "b.b", "head.b"}
    assert set(p.edges) == {("emb.f", "a.f"), ("emb.f", "b.f"), ("a.f", "head.f"), ("b.f", "head.f"),
                            ("head.f", "head.b"), ("head.b", "a.b"), ("head.b", "b.b")}
    for b in p.blocks:
        if b.kind == "backward":
            fwd = p.by_id[b.grad_of]
            assert b.devices == fwd.devices and b.memory == -fwd.memory
    assert p.by_id["a.b"].duration == 3  # backward + weight in one block when not split
    assert p.by_id["emb.f"].memory == 0 and p.warnings == ()


def test_builder_splits_weight_blocks_that_release_the_memory() -> None:
    p = _two_branches(split=True)
    w = p.by_id["a.w"]
    assert (w.kind, w.duration, w.memory, w.grad_of, w.devices) == ("weight", 1, -2, "a.f", (0,))
    assert (p.by_id["a.b"].duration, p.by_id["a.b"].memory) == (2, 0)
    assert ("a.b", "a.w") in p.edges and not p.succs["a.w"]
    assert "b.w" not in p.by_id  # no weight time: nothing to split
    assert p.warnings == ()


def test_builder_errors_name_the_stage() -> None:
    with pytest.raises(PlacementError, match="unknown stage 'x'"):
        build_stages("t", 1, [Stage("a", (0,), 1)], [("a", "x")])
    with pytest.raises(PlacementError, match="share a name"):
        build_stages("t", 1, [Stage("a", (0,), 1), Stage("a", (0,), 1)], [])
    with pytest.raises(PlacementError, match="device 3 out of range"):
        build_stages("t", 2, [Stage("a", (3,), 1)], [])

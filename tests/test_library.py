"""The named placements: the public suite's placements exactly, their pictures, costs and limits."""
from __future__ import annotations

import inspect
from typing import Any

import pytest
from shared_files import suite_cases

from tessel import library
from tessel.placement import Placement, PlacementError
from tessel.render import render_placement


def structure(doc: dict[str, Any]) -> tuple:
    """What a placement is, apart from its name, block order and grad_of annotations."""
    blocks = sorted((b["id"], b["kind"], b["duration"], b["memory"], tuple(sorted(b["devices"])))
                    for b in doc["blocks"])
    return doc["devices"], doc.get("latency", 0) or 0, blocks, sorted(map(tuple, doc["edges"]))


def test_defaults_reproduce_every_suite_placement() -> None:
    cases = suite_cases()
    seen = set()
    for case in cases:
        shape, devices = case["name"].split("-")[:2]
        built = library.build(shape, devices=int(devices))
        assert structure(built.to_dict()) == structure(case["placement"]), case["name"]
        seen.add(shape)
    assert seen == {"vshape", "xshape", "mshape", "nnshape", "kshape", "alphafold", "mllm", "finetune"}


@pytest.mark.parametrize("name", sorted(library.PLACEMENTS))
def test_docstring_picture_is_the_default_placement(name: str) -> None:
    fn, description = library.PLACEMENTS[name]
    picture = render_placement(library.build(name))
    doc = inspect.getdoc(fn) or ""
    assert picture.strip() in doc and description


@pytest.mark.parametrize("name", sorted(library.PLACEMENTS))
def test_every_placement_trains_and_infers(name: str) -> None:
    p = library.build(name, devices=6)
    assert p.warnings == () and p.is_training
    for b in p.blocks:
        if b.kind in ("backward", "weight"):
            assert set(b.devices) == set(p.by_id[b.grad_of].devices)
    assert all(p.blocks_on(d) for d in range(6))
    q = library.build(name, devices=6, infer=True)
    assert not q.is_training and all(b.memory == 0 for b in q.blocks)
    assert {b.id for b in q.blocks} == {b.id for b in p.blocks if b.kind == "forward"}


def test_costs_reach_the_blocks() -> None:
    p = library.build("mshape", devices=3, forward=2, backward=5, shard=0.5, latency=1)
    kinds = {(b.kind, len(b.devices)): b.duration for b in p.blocks}
    assert kinds == {("forward", 3): 0.5, ("forward", 1): 2, ("backward", 1): 5, ("backward", 3): 0.5}
    assert p.latency == 1
    z = library.build("zb", forward=1, backward=2, weight=1)
    assert sorted({b.kind for b in z.blocks}) == ["backward", "forward", "weight"]
    assert library.build("interleaved", devices=4, chunks=3).devices == 4
    assert len(library.build("interleaved", devices=4, chunks=3).blocks) == 24
    assert len(library.build("alphafold", devices=4, passes=2).blocks) == 12


@pytest.mark.parametrize("name,devices,message", [
    ("kshape", 5, "kshape needs an even device count >= 2, got 5"),
    ("xshape", 3, "xshape needs an even device count >= 2, got 3"),
    ("vshape", 0, "vshape needs a device count >= 1, got 0"),
    ("nnshape", 1, "nnshape needs a device count >= 2, got 1"),
])
def test_device_counts_a_shape_cannot_use(name: str, devices: int, message: str) -> None:
    with pytest.raises(PlacementError, match=message):
        library.build(name, devices=devices)


def test_unknown_name_and_cost_are_refused_with_the_known_ones() -> None:
    with pytest.raises(PlacementError) as e:
        library.build("wshape")
    assert "unknown placement 'wshape'" in str(e.value)
    assert all(name in str(e.value) for name in library.PLACEMENTS)
    with pytest.raises(PlacementError, match="placement vshape takes forward, backward, memory, latency; not shard"):
        library.build("vshape", shard=2)
    with pytest.raises(PlacementError, match="duration must be a positive number"):
        library.build("vshape", forward=0)


def test_large_placements_build() -> None:
    for name in library.PLACEMENTS:
        p = library.build(name, devices=32)
        assert isinstance(p, Placement) and p.devices == 32 and p.warnings == ()
    big = library.build("interleaved", devices=32, chunks=16)
    assert len(big.blocks) == 1024 and len(big.topo_order) == 1024


def test_the_suite_copy_in_the_repository_equals_the_public_one() -> None:
    """tests/data/suite.json is what the tests read; ../shared's is the contract it copies."""
    import shared_files
    if not shared_files.SHARED_SUITE.exists():
        pytest.skip(f"public suite not found at {shared_files.SHARED_SUITE}")
    assert shared_files.SUITE.read_bytes() == shared_files.SHARED_SUITE.read_bytes()

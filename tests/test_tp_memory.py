"""Tensor-parallel blocks declare what one of their ranks keeps for the backward, within 10%.

`declare_kept` measures a block on k devices as rank 0 of k runs it (tp.ShapeGroup); a real run on
4 gloo ranks measures what each rank's graphs keep. One launch per placement (seconds each).
"""
from __future__ import annotations

import pytest

pytest.importorskip("torch")

from tessel import library
from tessel.methods import run_method
from tessel.runtime.memory import unit_bytes
from tessel.runtime.networks import declare_kept, example
from tessel.runtime.train import TrainJob, train

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("model, name", [("gpt", "nnshape"), ("gpt", "mllm"), ("kshape", "kshape")])
def test_sharded_blocks_declare_what_a_rank_keeps(model: str, name: str) -> None:
    p = declare_kept(example(model, library.build(name, 4)))
    s = run_method("1f1b", p, 2)
    assert s.errors() == []
    reports = train(TrainJob.of(model, s, steps=1))
    measured: dict[str, float] = {}
    for r in reports:
        for b, n in r.block_bytes.items():
            measured[b] = max(measured.get(b, 0), n)
    declared = {b.id: float(b.memory) for b in p.blocks if b.kind == "forward"}
    unit = unit_bytes(measured, declared)
    assert unit is not None
    wide = [b.id for b in p.blocks if b.kind == "forward" and len(b.devices) > 1 and b.id in measured]
    assert wide, "the placement has sharded blocks"
    for b in wide:
        kept = measured[b] / unit
        assert abs(kept - declared[b]) <= 0.10 * declared[b], (b, declared[b], kept)

"""Tensor-parallel blocks declare what one of their ranks keeps for the backward, within 10%.

`declare_kept` measures a block on k devices as rank 0 of k runs it (tp.ShapeGroup); a real run on
4 gloo ranks measures what each rank's graphs keep. One launch per placement (seconds each).
The cost model's transformer layer (costmodel.formulas, Korthikanti et al.) against a torch layer
sharded the same way, measured as the profiler does (the storages autograd saves).
"""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest

pytest.importorskip("torch")

import torch
from torch import Tensor

from tessel import library
from tessel.costmodel.formulas import Shape, layer_activation_bytes
from tessel.methods import run_method
from tessel.runtime.memory import unit_bytes
from tessel.runtime.networks import Config, Layer, declare_kept, example, layer_plan
from tessel.runtime.profiler import saved_bytes
from tessel.runtime.tp import ShapeGroup, parallelize
from tessel.runtime.train import TrainJob, train

pytestmark = pytest.mark.torch


class _DropoutLayer(Layer):
    """Megatron's layer: dropout on the attention and MLP outputs before each residual add, kept as
    a fused GPU dropout keeps it (a 1-byte mask: torch.native_dropout; on CPU nn.Dropout multiplies
    by a noise tensor of the activation's type and keeps that)."""

    def forward(self, x: Tensor) -> Tensor:
        x = x + torch.native_dropout(self.attn(self.ln1(x)), 0.1, True)[0]
        return x + torch.native_dropout(self.mlp(self.ln2(x)), 0.1, True)[0]


SHAPE = Shape(hidden=256, heads=8, seq=128, micro_batch=2, ffn=1024)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dropout", [False, True])
def test_the_cost_models_tp_layer_declares_what_autograd_saves(dtype: torch.dtype, dropout: bool) -> None:
    x = replace(SHAPE, dtype_bytes=dtype.itemsize, dropout=dropout)
    cfg = Config(dim=x.hidden, heads=x.heads, ffn=x.f, seq=x.seq)
    torch.manual_seed(0)
    whole = (_DropoutLayer(cfg, causal=True) if dropout else Layer(cfg, causal=True)).to(dtype)
    for t in (1, 2, 4):
        layer = parallelize(copy.deepcopy(whole), layer_plan(""), ShapeGroup(0, t)) if t > 1 else whole
        inputs = torch.randn(x.micro_batch, x.seq, x.hidden, dtype=dtype, requires_grad=True)
        _, measured = saved_bytes(layer, [inputs])
        declared = layer_activation_bytes(x, t)
        assert abs(declared - measured) <= 0.10 * measured, (t, declared, measured)
    # the sharded part shrinks with t: what one rank of 4 keeps is well under what one device keeps
    assert layer_activation_bytes(x, 4) < 0.6 * layer_activation_bytes(x, 1)


@pytest.mark.slow
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

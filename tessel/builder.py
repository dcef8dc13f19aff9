"""Stage-style builder: forward/backward block pairs from a list of stages and their edges.

A stage is a piece of the model on a device set. From stages and the forward edges between them
the builder derives:

- one forward block per stage (memory `+memory`: the activation it keeps for its backward);
- one backward block per stage that has a backward, on the same devices, with `grad_of` set and
  the stage edges reversed (the gradient flows back); a stage whose successors have no backward
  (the end of the model, where the loss is) gets the edge forward -> backward instead;
- with `split_weight=True`, a weight-gradient block (kind "weight") after each backward block.

Memory choice for a split backward: by default the input-gradient block B releases nothing and
the weight-gradient block W releases the whole activation. W multiplies the output gradient with
the stage's stored inputs, which are most of a layer's activation, so the memory stays alive until
W ends; this is the conservative accounting zero-bubble schedules are judged by (deferring W holds
memory longer). `weight_release` is the fraction W frees (B frees the rest): the zero-bubble papers
let B free the activations only it needs, which a profile measures.

Stages with backward and weight 0 (frozen parts, e.g. a fine-tuned model's fixed embedding) get no
backward and keep no activation: their forward's memory is 0. Put frozen stages first: nothing
before a frozen stage gets a gradient through it.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .placement import Block, Number, Placement, PlacementError, make_placement


@dataclass(frozen=True)
class Stage:
    """One piece of the model. `backward` is the input-gradient time, `weight` the weight-gradient
    time (one backward block of `backward + weight` unless the builder splits them).
    `ids` overrides the block ids (forward, backward, weight); default `name.f`, `name.b`, `name.w`."""
    name: str
    devices: tuple[int, ...]
    forward: Number
    backward: Number = 0
    weight: Number = 0
    memory: Number = 0
    ids: tuple[str, str, str] | None = None

    @property
    def trainable(self) -> bool:
        return self.backward + self.weight > 0

    def block_ids(self) -> tuple[str, str, str]:
        return self.ids or (f"{self.name}.f", f"{self.name}.b", f"{self.name}.w")


def build_stages(name: str, devices: int, stages: Sequence[Stage], edges: Iterable[tuple[str, str]],
                 split_weight: bool = False, latency: Number = 0, weight_release: Number = 1) -> Placement:
    """The validated placement of the stages; `edges` are forward edges between stage names.
    `weight_release` (0..1): the fraction of a split stage's activation its W frees, B frees the rest."""
    if isinstance(weight_release, bool) or not isinstance(weight_release, (int, float)) or not 0 <= weight_release <= 1:
        raise PlacementError(f"placement {name!r}: weight_release must be a number in 0..1, got {weight_release!r}")
    by_name = {s.name: s for s in stages}
    if len(by_name) != len(stages):
        raise PlacementError(f"placement {name!r}: two stages share a name")
    stage_edges = [(a, b) for a, b in edges]
    for a, b in stage_edges:
        for end in (a, b):
            if end not in by_name:
                raise PlacementError(f"stage edge {a} -> {b} names unknown stage {end!r}")
    succs: dict[str, list[str]] = {s.name: [] for s in stages}
    for a, b in stage_edges:
        succs[a].append(b)
    blocks = [_forward_block(s) for s in stages]
    block_edges = [(by_name[a].block_ids()[0], by_name[b].block_ids()[0]) for a, b in stage_edges]
    for s in reversed(stages):
        if s.trainable:
            new_blocks, new_edges = _backward_blocks(s, [by_name[t] for t in succs[s.name]], split_weight,
                                                     weight_release)
            blocks += new_blocks
            block_edges += new_edges
    return make_placement(name, devices, blocks, block_edges, latency)


def _forward_block(s: Stage) -> Block:
    return Block(s.block_ids()[0], "forward", s.forward, s.memory if s.trainable else 0, tuple(s.devices))


def _backward_blocks(s: Stage, succs: list[Stage], split_weight: bool,
                     weight_release: Number = 1) -> tuple[list[Block], list[tuple[str, str]]]:
    fid, bid, wid = s.block_ids()
    split = split_weight and s.weight > 0 and s.backward > 0
    b_time = s.backward if split else s.backward + s.weight
    w_frees = s.memory * weight_release if split else 0
    b_frees = s.memory - w_frees
    blocks = [Block(bid, "backward", b_time, -b_frees if b_frees else 0, tuple(s.devices), grad_of=fid)]
    grads_in = [t.block_ids()[1] for t in succs if t.trainable]
    edges = [(g, bid) for g in grads_in] or [(fid, bid)]
    if split:
        blocks.append(Block(wid, "weight", s.weight, -w_frees if w_frees else 0, tuple(s.devices), grad_of=fid))
        edges.append((bid, wid))
    return blocks, edges

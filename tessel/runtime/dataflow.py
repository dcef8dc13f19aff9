"""What moves between blocks at run time: activations on forward edges, their gradients back.

Torch-free. A placement says which blocks depend on which; a runtime needs more: which forward
block a backward (or weight) block differentiates, which edges carry a tensor, and which rank
sends that tensor to which. The rules, shared by the lowering, its check and the executor:

- a forward edge `x -> y` carries x's output (one tensor) to every device of y;
- its gradient goes from y's backward to x's backward, on every device of x, when x is trained
  (has a backward block);
- a block on several devices runs SPMD and holds its output (and its input gradients) on every
  device of its set; a device that needs a tensor and is outside the producer's set receives it
  from one producer device, chosen round-robin so a group shares the sending;
- every other edge (a forward to its own backward, a backward to its weight block, pure ordering
  edges) carries nothing across ranks.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..placement import Placement, PlacementError

FORWARD_KINDS = ("forward", "other")


@dataclass(frozen=True)
class Input:
    """One tensor a compute task reads: the activation of `edge` or (grad) its gradient."""
    edge: tuple[str, str]
    grad: bool
    producer: str  # the block that computes it: edge[0] for an activation, backward(edge[1]) for a gradient


@dataclass(frozen=True)
class Dataflow:
    placement: Placement
    forward_of: dict[str, str]   # backward/weight block -> forward block
    backward: dict[str, str]     # trained forward block -> its backward block
    weight: dict[str, str]       # forward block -> its weight-gradient block (split backward)

    # ---- structure -------------------------------------------------------------------------
    @cached_property
    def forwards(self) -> tuple[str, ...]:
        """Forward blocks in dependency order."""
        p = self.placement
        return tuple(b for b in p.topo_order if p.by_id[b].kind in FORWARD_KINDS)

    @cached_property
    def edges(self) -> tuple[tuple[str, str], ...]:
        """Forward edges, the ones that carry activations, in placement order."""
        fw = set(self.forwards)
        return tuple(e for e in self.placement.edges if e[0] in fw and e[1] in fw)

    @cached_property
    def edge_index(self) -> dict[tuple[str, str], int]:
        return {e: i for i, e in enumerate(self.edges)}

    @cached_property
    def in_edges(self) -> dict[str, tuple[tuple[str, str], ...]]:
        return {y: tuple(e for e in self.edges if e[1] == y) for y in self.forwards}

    @cached_property
    def out_edges(self) -> dict[str, tuple[tuple[str, str], ...]]:
        return {x: tuple(e for e in self.edges if e[0] == x) for x in self.forwards}

    @cached_property
    def sinks(self) -> tuple[str, ...]:
        """Forward blocks nothing reads: each returns a loss."""
        return tuple(x for x in self.forwards if not self.out_edges[x])

    @property
    def training(self) -> bool:
        return bool(self.backward)

    def devices(self, block: str) -> tuple[int, ...]:
        return self.placement.by_id[block].devices

    def trains_input(self, edge: tuple[str, str]) -> bool:
        """Does the gradient of this edge's activation flow back (its producer is trained)?"""
        return edge[0] in self.backward

    # ---- what a task reads ------------------------------------------------------------------
    def inputs(self, block: str) -> tuple[Input, ...]:
        """Tensors a compute task of `block` reads from other tasks of the same micro-batch."""
        kind = self.placement.by_id[block].kind
        if kind in FORWARD_KINDS:
            return tuple(Input(e, False, e[0]) for e in self.in_edges[block])
        if kind == "backward":
            y = self.forward_of[block]
            return tuple(Input(e, True, self.backward[e[1]]) for e in self.out_edges[y])
        return ()

    def outputs(self, block: str) -> tuple[Input, ...]:
        """Tensors a compute task of `block` produces for other blocks."""
        kind = self.placement.by_id[block].kind
        if kind in FORWARD_KINDS:
            return tuple(Input(e, False, block) for e in self.out_edges[block])
        if kind == "backward":
            y = self.forward_of[block]
            return tuple(Input(e, True, block) for e in self.in_edges[y] if self.trains_input(e))
        return ()

    def local_predecessor(self, block: str) -> str | None:
        """The task of the same micro-batch that must run earlier on the same devices."""
        kind = self.placement.by_id[block].kind
        if kind == "backward":
            return self.forward_of[block]
        if kind == "weight":
            return self.backward[self.forward_of[block]]
        return None

    def consumer_devices(self, x: Input) -> tuple[int, ...]:
        """Devices that read the tensor: the consumer's for an activation, the producer's for a gradient."""
        return self.devices(x.edge[0] if x.grad else x.edge[1])

    def source(self, x: Input, rank: int) -> int | None:
        """The rank that sends tensor `x` to `rank`, or None when `rank` computes it itself."""
        have = self.devices(x.producer)
        if rank in have:
            return None
        need = [d for d in self.consumer_devices(x) if d not in have]
        return have[need.index(rank) % len(have)]

    def destinations(self, x: Input, rank: int) -> tuple[int, ...]:
        """Ranks that `rank` (a producer device) sends tensor `x` to."""
        have = self.devices(x.producer)
        return tuple(d for d in self.consumer_devices(x) if d not in have and self.source(x, d) == rank)


def dataflow(p: Placement) -> Dataflow:
    """The runtime's view of a placement; raises PlacementError when it cannot be executed."""
    forward_of = _grad_of(p)
    backward = {f: b for b, f in forward_of.items() if p.by_id[b].kind == "backward"}
    weight = {f: w for w, f in forward_of.items() if p.by_id[w].kind == "weight"}
    for f, w in weight.items():
        if f not in backward:
            raise PlacementError(f"weight block {w} has no backward block for its forward {f}")
    if len(backward) != sum(p.by_id[b].kind == "backward" for b in forward_of):
        raise PlacementError(f"placement {p.name!r}: two backward blocks differentiate one forward")
    df = Dataflow(p, forward_of, backward, weight)
    _check_trainable(df)
    return df


def _check_trainable(df: Dataflow) -> None:
    for x, y in df.edges:
        if df.trains_input((x, y)) and y not in df.backward:
            raise PlacementError(f"block {x} is trained but {y}, which reads its output, has no backward "
                                 f"block to pass the gradient back")
    if df.training and not df.sinks:
        raise PlacementError(f"placement {df.placement.name!r} has no final forward block to compute a loss")


def _grad_of(p: Placement) -> dict[str, str]:
    """backward/weight block -> forward block: `grad_of` where given, else inferred.

    Inference pairs, on each device set, the backward (and weight) blocks in dependency order with
    the forward blocks in reverse dependency order: the last forward on a device set is
    differentiated first. That is the mirror of the forward pass every stage-built placement has.
    """
    fwd_kind = {b.id for b in p.blocks if b.kind in FORWARD_KINDS}
    out: dict[str, str] = {}
    for b in p.blocks:
        if b.grad_of is not None:
            if b.grad_of not in fwd_kind:
                raise PlacementError(f"block {b.id}: grad_of {b.grad_of!r} is not a forward block")
            out[b.id] = b.grad_of
    for kind in ("backward", "weight"):
        taken = {f for g, f in out.items() if p.by_id[g].kind == kind}
        groups: dict[frozenset[int], tuple[list[str], list[str]]] = {}
        for x in p.topo_order:
            b = p.by_id[x]
            key = frozenset(b.devices)
            if b.kind in FORWARD_KINDS and x not in taken:
                groups.setdefault(key, ([], []))[0].append(x)
            elif b.kind == kind and x not in out:
                groups.setdefault(key, ([], []))[1].append(x)
        for key, (fwds, grads) in groups.items():
            if len(grads) > len(fwds):
                raise PlacementError(f"cannot tell which forward block {grads[len(fwds)]} differentiates "
                                     f"on devices {sorted(key)}: set grad_of")
            out.update(zip(grads, reversed(fwds)))
    return out

"""Partitioner: how a model's chain of units becomes parts on device sets, and a placement.

A model is described by its units (a layer, an embedding, a head: a cost on any device set);
a layout cuts the chain into stages (even as Megatron does, or balanced by cost), puts each
stage on a device or a tensor-parallel group, and becomes a `PlacedModel`, which turns into a
placement in milliseconds and MiB with the memory budget its weights leave per device.
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import TesselError
from ..placement import Placement
from .formulas import INFER_BYTES_PER_PARAM, TRAIN_BYTES_PER_PARAM, BlockCost, combine, recomputed
from .hardware import MIB, Hardware, p2p_seconds


@dataclass(frozen=True)
class Part:
    """One block of a model on its device set, with its cost."""
    name: str
    devices: tuple[int, ...]
    cost: BlockCost
    units: tuple[str, ...] = ()  # the model's units it runs, in order (where known): a plan's block map


@dataclass(frozen=True)
class PlacedModel:
    """A model cut into parts placed on devices; becomes a placement in ms and MiB.

    `replicas` counts model copies per micro-batch unit (Chimera's two pipelines carry two
    micro-batches per unit of its placement), so iteration times compare per real micro-batch.
    """
    name: str
    devices: int
    parts: tuple[Part, ...]
    edges: tuple[tuple[str, str], ...]
    hardware: Hardware
    training: bool = True
    replicas: int = 1
    param_bytes: float | None = None   # bytes a parameter holds; None: 16 training, 2 inference

    def placement(self) -> Placement:
        """Durations in milliseconds (to the microsecond), activation memory in MiB (rounded up).

        Messages: the placement's one latency is the cheapest message an edge between different
        device sets carries; what a dearer message costs beyond it is added to the block that
        sends it (the forward of the edge's source, the backward of its target for the gradient),
        so no edge pays another edge's message."""
        from ..builder import Stage, build_stages
        base, extra_f, extra_b = self.messages()
        stages = [Stage(p.name, p.devices, seconds_to_ms(p.cost.forward + extra_f.get(p.name, 0.0)),
                        seconds_to_ms(p.cost.backward + extra_b.get(p.name, 0.0)) if self.training else 0,
                        memory=math.ceil(p.cost.activation / MIB) if self.training else 0)
                  for p in self.parts]
        return build_stages(self.name, self.devices, stages, self.edges, latency=seconds_to_ms(base))

    def messages(self) -> tuple[float, dict[str, float], dict[str, float]]:
        """(base latency s, extra forward s per part, extra backward s per part)."""
        by = {p.name: p for p in self.parts}
        sent: list[tuple[str, str, float]] = []  # (part, "f" or "b", seconds)
        for a, b in self.edges:
            pa, pb = by[a], by[b]
            if set(pa.devices) == set(pb.devices):
                continue
            sent.append((a, "f", edge_seconds(pa.cost.output, pa.devices, pb.devices, self.hardware)))
            if self.training and pb.cost.backward > 0:
                sent.append((b, "b", edge_seconds(pa.cost.output, pb.devices, pa.devices, self.hardware)))
        base = min((t for _, _, t in sent), default=0.0)
        extra: dict[str, dict[str, float]] = {"f": {}, "b": {}}
        for name, kind, t in sent:
            extra[kind][name] = max(extra[kind].get(name, 0.0), t - base)
        return base, extra["f"], extra["b"]

    def latency_ms(self) -> float:
        return seconds_to_ms(self.messages()[0])

    def static_bytes(self) -> tuple[float, ...]:
        """Per device: parameters (with gradients and optimizer states when training) of every part
        on it; parts sharing a weights key on a device hold that tensor once."""
        per_param = self.param_bytes or (TRAIN_BYTES_PER_PARAM if self.training else INFER_BYTES_PER_PARAM)
        # one pass over the parts, each device's sum in part order (a scan per device was
        # quadratic: minutes for the candidates of 4,096 devices)
        out = [0.0] * self.devices
        seen: list[set[str]] = [set() for _ in range(self.devices)]
        for p in self.parts:
            for d in dict.fromkeys(p.devices):
                if not 0 <= d < self.devices or (p.cost.weights is not None and p.cost.weights in seen[d]):
                    continue
                if p.cost.weights is not None:
                    seen[d].add(p.cost.weights)
                out[d] += p.cost.params * per_param
        return tuple(out)

    def memory_budget(self) -> tuple[int, ...]:
        """MiB per device left for activations: device memory - reserved - static. Negative: the
        weights alone do not fit (out of memory whatever the schedule)."""
        return tuple(math.floor((self.hardware.usable() - s) / MIB) for s in self.static_bytes())


def edge_seconds(nbytes: float, src: tuple[int, ...], dst: tuple[int, ...], hw: Hardware) -> float:
    """A tensor moving from `src` to `dst`: free when every device of `dst` already holds it
    (a sharded block's output is all-reduced onto all its devices), else one message."""
    if set(dst) <= set(src):
        return 0.0
    return p2p_seconds(nbytes, src, dst, hw)


def seconds_to_ms(seconds: float) -> float:
    """Milliseconds to the microsecond; a positive time never rounds to 0."""
    return max(round(seconds * 1e3, 3), 0.001) if seconds > 0 else 0.0


Cost = Callable[[tuple[int, ...]], BlockCost]


@dataclass(frozen=True)
class Unit:
    """One piece of a model's forward chain and its cost on any device set. Layers are what a
    pipeline splits evenly over stages; other units (embedding, head) ride with the next layer."""
    name: str
    cost: Cost
    layer: bool = True


def stage_ranges(chain: Sequence[Unit], stages: int, balance: str = "even") -> list[range]:
    """Contiguous groups of the chain, one per stage.

    `even`: Megatron's rule -- the same number of layers per stage (the first stages take the
    remainder); embeddings and heads go with the layer after them (the last stage when none).
    `cost`: the contiguous split minimising the slowest stage's forward + backward time.
    """
    if balance == "cost":
        return _cost_ranges(chain, stages)
    if balance != "even":
        raise TesselError(f"balance must be 'even' or 'cost', got {balance!r}")
    layers = [i for i, u in enumerate(chain) if u.layer]
    if len(layers) < stages:
        raise TesselError(f"{len(layers)} layers cannot fill {stages} pipeline stages")
    cuts = [layers[k] for k in itertools.accumulate(split_even(len(layers), stages)[:-1])]  # linear in stages
    bounds_ = [0, *cuts, len(chain)]
    return [range(bounds_[k], bounds_[k + 1]) for k in range(stages)]


def split_even(n: int, k: int) -> list[int]:
    """n items in k groups whose sizes differ by at most one, larger groups first."""
    return [n // k + (i < n % k) for i in range(k)]


def _cost_ranges(chain: Sequence[Unit], stages: int) -> list[range]:
    w = [u.cost((0,)).forward + u.cost((0,)).backward for u in chain]
    if len(w) < stages:
        raise TesselError(f"{len(w)} units cannot fill {stages} pipeline stages")

    def cuts_for(cap: float) -> list[int] | None:
        cuts, acc = [0], 0.0
        for i, x in enumerate(w):
            if acc + x > cap and acc > 0:
                cuts.append(i)
                acc = 0.0
            acc += x
        return cuts if len(cuts) <= stages and acc <= cap else None

    lo, hi = max(w), sum(w)
    for _ in range(60):  # bisection on the slowest stage's time
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cuts_for(mid) else (mid, hi)
    cuts = cuts_for(hi) or [0]
    # fewer groups than stages: split the largest group (the last of equal ones), again and
    # again; a heap of (-size, -start) keeps it n log n (a scan per split was quadratic)
    heap = [(a - b, -a) for a, b in zip(cuts, cuts[1:] + [len(w)])]
    heapq.heapify(heap)
    starts = set(cuts)
    while len(starts) < stages:
        neg, neg_a = heapq.heappop(heap)
        size, a = -neg, -neg_a
        if size < 2:
            raise TesselError(f"{len(w)} units cannot fill {stages} pipeline stages")
        mid = a + size // 2
        starts.add(mid)
        heapq.heappush(heap, (a - mid, -a))
        heapq.heappush(heap, (mid - (a + size), -mid))
    cuts = sorted(starts)
    ends = cuts[1:] + [len(w)]
    return [range(a, b) for a, b in zip(cuts, ends)]


def pipeline_parts(chain: Sequence[Unit], devices: Sequence[int], prefix: str = "s",
                   balance: str = "even", weights: str | None = None) -> list[Part]:
    """One stage per device in `devices` order, each the sum of its group of units.
    `weights`: a key prefix when stages of several passes share their weights (recycling)."""
    return stage_parts(chain, [(d,) for d in devices], prefix, balance, weights)


def stage_parts(chain: Sequence[Unit], groups: Sequence[tuple[int, ...]], prefix: str = "s",
                balance: str = "even", weights: str | None = None) -> list[Part]:
    """One stage per device group (a tensor-parallel group when it has several devices)."""
    parts = []
    for k, (g, r) in enumerate(zip(groups, stage_ranges(chain, len(groups), balance))):
        cost = combine(*(chain[i].cost(g) for i in r), weights=None if weights is None else f"{weights}{k}")
        parts.append(Part(f"{prefix}{k}", g, cost, tuple(chain[i].name for i in r)))
    return parts


def tp_parts(chain: Sequence[Unit], devices: tuple[int, ...], prefix: str = "") -> list[Part]:
    """Every unit on all `devices`, tensor-parallel; consecutive units of one name become one part."""
    parts: list[Part] = []
    runs: list[list[Unit]] = []
    for u in chain:
        if runs and runs[-1][0].name == u.name:
            runs[-1].append(u)
        else:
            runs.append([u])
    for k, run in enumerate(runs):
        costs = [u.cost(devices) for u in run]
        parts.append(Part(f"{prefix}{run[0].name}{k}", devices, combine(*costs, weights=costs[0].weights),
                          tuple(u.name for u in run)))
    return parts


def share_devices(devices: int, first: BlockCost, second: BlockCost) -> int:
    """Devices for the first of two equally deep segments, in proportion to their layer costs
    (forward + backward), at least one each: the model-aware split a K or NN shape makes."""
    a, b = first.forward + first.backward, second.forward + second.backward
    return min(devices - 1, max(1, round(devices * a / (a + b))))


def chain_edges(parts: Sequence[Part]) -> list[tuple[str, str]]:
    return [(a.name, b.name) for a, b in zip(parts, parts[1:])]


LAYOUTS = ("tessel", "pipeline", "balanced", "chimera", "tp")


def chain_model(name: str, chain: Sequence[Unit], devices: int, layout: str, hw: Hardware,
                training: bool = True) -> PlacedModel:
    """The layouts every model shares: `pipeline` (1F1B's: one stage per device, even layers),
    `balanced` (the same with a cost-balanced split), `chimera` (two pipelines in opposite
    directions, a model replica each; one placement unit carries two micro-batches) and `tp`
    (every unit tensor-parallel over all devices)."""
    all_devices = tuple(range(devices))
    if layout in ("pipeline", "balanced"):
        parts = pipeline_parts(chain, all_devices, balance="cost" if layout == "balanced" else "even")
        return PlacedModel(f"{name}-{layout}", devices, tuple(parts), tuple(chain_edges(parts)), hw, training)
    if layout == "chimera":
        up = pipeline_parts(chain, all_devices, prefix="u")
        down = pipeline_parts(chain, all_devices[::-1], prefix="d")
        return PlacedModel(f"{name}-chimera", devices, tuple(up + down),
                     tuple(chain_edges(up) + chain_edges(down)), hw, training, replicas=2)
    if layout == "tp":
        parts = tp_parts(chain, all_devices)
        return PlacedModel(f"{name}-tp", devices, tuple(parts), tuple(chain_edges(parts)), hw, training)
    raise TesselError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")



def with_recomputation(units: Sequence[Unit]) -> list[Unit]:
    """The same units, layers fully recomputed in their backward (embeddings and heads as they are)."""
    return [Unit(u.name, _recomputing(u.cost), u.layer) if u.layer else u for u in units]


def _recomputing(cost: Cost) -> Cost:
    return lambda d: recomputed(cost(d))


# ---- a model as segments: what `tessel plan` places -------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """A run of layers (an encoder, a decoder, a modality branch) with the vocabulary-sized units
    around it that a plan may shard over all devices or keep in the adjacent stage. `after`
    names the segments whose outputs it takes: none for the first, two for a fusion block."""
    name: str
    layers: tuple[Unit, ...]
    pre: Unit | None = None
    post: Unit | None = None
    after: tuple[str, ...] = ()

    def chain(self) -> list[Unit]:
        return [u for u in (self.pre, *self.layers, self.post) if u is not None]


@dataclass(frozen=True)
class ModelSpec:
    """A model the planner can place: its segments in dependency order, hardware, mode."""
    name: str
    segments: tuple[Segment, ...]
    hardware: Hardware
    training: bool = True
    recycles: int = 0   # gradient-free passes over the whole model before the trained one
    param_bytes: float | None = None   # as PlacedModel.param_bytes

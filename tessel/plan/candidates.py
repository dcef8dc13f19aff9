"""Candidate placements of a model on a cluster: shape family x tensor-parallel degree x stage
split x embedding/head placement x recomputation, each a `PlacedModel` ready to schedule.

Families:
- `pipeline`: the whole model as one chain, stages balanced by cost, each stage a tensor-parallel
  group of t devices inside a node (what Megatron's 1F1B runs, for every t);
- `sharded`: the embeddings and heads vocabulary-parallel over all devices, the layer runs
  between them pipelined over groups in proportion to their cost (the M and NN shapes);
- `branches`: independent segments side by side on disjoint groups, the segment joining them
  either on all devices or pipelined over all groups (the K shape and a K shape whose shared
  block stays inside nodes);
- `recycle`: recycling passes over the same stages (AlphaFold);
- `tp`: every block over all devices; `chimera`: two opposite pipelines, a replica each.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from ..costmodel import (
    MIB,
    BlockCost,
    Hardware,
    ModelSpec,
    Part,
    PlacedModel,
    Segment,
    Unit,
    chain_edges,
    chain_model,
    combine,
    recomputed,
    recycle_parts,
    stage_ranges,
)
from ..errors import TesselError
from ..placement import Placement

Group = tuple[int, ...]

# The plan table's legend: what each family name means; "tpT" after it: T devices per
# tensor-parallel group (a stage, or a branch, runs on T devices that split each layer's matrices)
FAMILY_HELP = {
    "pipeline": "the model as one chain of stages, one stage per group of T devices",
    "sharded": "embeddings and heads split over all devices (vocabulary-parallel), the layers between them "
               "pipelined over groups of T devices",
    "branches+join on all": "the branches side by side on disjoint groups, the block joining them on all devices",
    "branches+join pipelined": "the branches side by side on disjoint groups, the joining block pipelined over them",
    "recycle": "recycling passes without gradients over the same stages, then the trained pass",
    "tp": "no pipeline: every block tensor-parallel over all devices (T = all of them)",
    "chimera": "two pipelines in opposite directions, each a replica of the model (2 micro-batches per step)",
    "given": "the placement file as given",
}


@dataclass(frozen=True)
class Cluster:
    """Devices to plan for: `nodes` nodes of `hardware.devices_per_node` devices."""
    hardware: Hardware
    nodes: int = 1

    @property
    def devices(self) -> int:
        return self.nodes * self.hardware.devices_per_node

    @staticmethod
    def of(hw: Hardware, devices: int, per_node: int | None = None, memory: float | None = None) -> Cluster:
        """`devices` in nodes of `per_node` (default the hardware's, at most `devices`)."""
        per = min(per_node or hw.devices_per_node, devices)
        if devices < 1 or devices % per:
            raise TesselError(f"{devices} devices do not fill nodes of {per}")
        return Cluster(replace(hw, devices_per_node=per, memory=memory or hw.memory), devices // per)


@dataclass(frozen=True)
class Candidate:
    """One placement to schedule, how it was made, and the memory its weights leave per device."""
    family: str
    tp: int                 # devices per stage group (1: plain pipeline)
    recompute: str          # "as given", "auto" (per stage, where 1F1B's memory would not fit)
    placement: Placement
    budget: tuple[int, ...]  # MiB per device left for activations
    replicas: int = 1
    baseline: str | None = None   # the hand-made schedule run on it (1F1B's order on a shaped one: 1F1B+)
    units: tuple[tuple[str, tuple[str, ...]], ...] = ()  # forward block -> the model's units it runs
    working: tuple[int, ...] = ()  # MiB per device of the largest block activation: inference's peak

    @property
    def help(self) -> str:
        """What the family name means, for the plan table's legend."""
        return FAMILY_HELP.get(self.family, self.family)

    @property
    def name(self) -> str:
        rc = "" if self.recompute == "as given" else f" rc:{self.recompute}"
        return f"{self.family} tp{self.tp}{rc}"

    @staticmethod
    def of(family: str, tp: int, recompute: str, model: PlacedModel, baseline: str | None) -> Candidate:
        units = tuple((f"{p.name}.f", p.units) for p in model.parts)
        # without a backward nothing is kept: a device holds one block's activation at a time
        working = tuple(max((math.ceil(p.cost.activation / MIB) for p in model.parts if d in p.devices), default=0)
                        for d in range(model.devices))
        return Candidate(family, tp, recompute, model.placement(), model.memory_budget(), model.replicas,
                         baseline, units if all(u for _, u in units) else (), working)


def candidates(spec: ModelSpec, cluster: Cluster, tp: Sequence[int] | None = None) -> Iterator[Candidate]:
    """Every candidate placement; `tp` limits the tensor-parallel degrees tried."""
    d, hw = cluster.devices, cluster.hardware
    fwd = "1f1b" if spec.training else "gpipe"
    for t in tp or tp_degrees(cluster):
        groups = [tuple(range(k, k + t)) for k in range(0, d, t)]
        for family, build in _families(spec):
            model = build(spec, groups, hw, d)
            if model is None:
                continue
            model = replace(model, param_bytes=spec.param_bytes)
            yield Candidate.of(family, t, "as given", model, fwd)  # 1F1B+ on shaped ones
            if spec.training:
                yield Candidate.of(family, t, "auto", with_auto_recompute(model), None)
    if d > 1 and not spec.recycles:
        chain = [u for s in spec.segments for u in s.chain()]
        tp_model = chain_model(spec.name, chain, d, "tp", hw, spec.training)
        yield Candidate.of("tp", d, "as given", replace(tp_model, param_bytes=spec.param_bytes), fwd)
        if d % 2 == 0 and len([u for u in chain if u.layer]) >= d:
            chim = chain_model(spec.name, chain, d, "chimera", hw, spec.training)
            yield Candidate.of("chimera", 1, "as given", replace(chim, param_bytes=spec.param_bytes),
                               "chimera" if spec.training else "gpipe")


def tp_degrees(cluster: Cluster) -> list[int]:
    """Powers of two up to a node that divide the device count: TP groups stay inside a node."""
    per, d = cluster.hardware.devices_per_node, cluster.devices
    return [t for t in (1, 2, 4, 8, 16) if t <= per and d % t == 0 and d // t >= 1]


Build = Callable[[ModelSpec, list[Group], Hardware, int], PlacedModel | None]


def _families(spec: ModelSpec) -> list[tuple[str, Build]]:
    if spec.recycles:
        return [("recycle", _recycle)]
    out: list[tuple[str, Build]] = [("pipeline", _pipeline)]
    if any(s.pre or s.post for s in spec.segments):
        out.append(("sharded", _sharded))
    if any(len(s.after) > 1 for s in spec.segments):
        out += [("branches+join on all", _branches_join_all), ("branches+join pipelined", _branches_join_piped)]
    return out


def _pipeline(spec: ModelSpec, groups: list[Group], hw: Hardware, d: int) -> PlacedModel | None:
    chain = [u for s in spec.segments for u in s.chain()]
    if sum(u.layer for u in chain) < len(groups):
        return None
    parts = stages(chain, groups, "s")
    return PlacedModel(f"{spec.name}-pipeline-tp{len(groups[0])}", d, tuple(parts), tuple(chain_edges(parts)),
                       hw, spec.training)


def _sharded(spec: ModelSpec, groups: list[Group], hw: Hardware, d: int) -> PlacedModel | None:
    every = tuple(range(d))
    runs: list[list[Unit]] = [[]]
    items: list[Unit | None] = []   # a sharded unit, or None for the next run of layers
    for s in spec.segments:
        for u in s.chain():
            if u.layer:
                if not runs[-1]:
                    items.append(None)
                runs[-1].append(u)
            else:
                if runs[-1]:
                    runs.append([])
                items.append(u)
    runs = [r for r in runs if r]
    shares = split_groups(groups, [_weight(r) for r in runs], [len(r) for r in runs])
    if shares is None:
        return None
    parts: list[Part] = []
    k = 0
    for item in items:
        if item is not None:
            parts.append(Part(f"{item.name}{len(parts)}", every, item.cost(every)))
        else:
            parts += stages(runs[k], shares[k], f"r{k}s")
            k += 1
    return PlacedModel(f"{spec.name}-sharded-tp{len(groups[0])}", d, tuple(parts), tuple(chain_edges(parts)),
                       hw, spec.training)


def _branch_parts(spec: ModelSpec, groups: list[Group]) -> tuple[list[Part], list[tuple[str, str]], Segment] | None:
    join = next(s for s in spec.segments if len(s.after) > 1)
    roots = [s for s in spec.segments if s.name in join.after]
    shares = split_groups(groups, [_weight(s.chain()) for s in roots], [len(s.chain()) for s in roots])
    if shares is None or len(spec.segments) != len(roots) + 1:
        return None
    parts: list[Part] = []
    edges: list[tuple[str, str]] = []
    for seg, share in zip(roots, shares):
        ps = stages(seg.chain(), share, f"{seg.name}")
        parts += ps
        edges += chain_edges(ps)
    return parts, edges, join


def _branches_join_all(spec: ModelSpec, groups: list[Group], hw: Hardware, d: int) -> PlacedModel | None:
    got = _branch_parts(spec, groups)
    if got is None:
        return None
    parts, edges, join = got
    every = tuple(range(d))
    fused = Part(join.name, every, combine(*(u.cost(every) for u in join.chain())))
    ends = [p.name for p in parts if not any(a == p.name for a, _ in edges)]
    return PlacedModel(f"{spec.name}-k-tp{len(groups[0])}", d, (*parts, fused),
                       tuple(edges + [(e, join.name) for e in ends]), hw, spec.training)


def _branches_join_piped(spec: ModelSpec, groups: list[Group], hw: Hardware, d: int) -> PlacedModel | None:
    got = _branch_parts(spec, groups)
    if got is None or sum(u.layer for u in got[2].chain()) < len(groups):
        return None  # fewer joining layers than stages
    parts, edges, join = got
    fused = stages(join.chain(), groups, f"{join.name}")
    ends = [p.name for p in parts if not any(a == p.name for a, _ in edges)]
    return PlacedModel(f"{spec.name}-kpiped-tp{len(groups[0])}", d, (*parts, *fused),
                       tuple(edges + [(e, fused[0].name) for e in ends] + chain_edges(fused)), hw, spec.training)


def _recycle(spec: ModelSpec, groups: list[Group], hw: Hardware, d: int) -> PlacedModel | None:
    chain = list(spec.segments[0].chain())
    if len(chain) < len(groups):
        return None
    parts = recycle_parts(chain, groups, spec.recycles, "")
    return PlacedModel(f"{spec.name}-recycle-tp{len(groups[0])}", d, tuple(parts), tuple(chain_edges(parts)),
                       hw, spec.training)


# ---- helpers ----------------------------------------------------------------------------------------
def stages(chain: Sequence[Unit], groups: Sequence[Group], prefix: str,
           recompute: Callable[[int], bool] = lambda k: False) -> list[Part]:
    """Stages balanced by cost over `groups`, stage k's layers recomputed where `recompute(k)`."""
    parts = []
    for k, (g, r) in enumerate(zip(groups, stage_ranges(chain, len(groups), "cost"))):
        costs = [chain[i].cost(g) for i in r]
        if recompute(k):
            costs = [recomputed(c) if chain[i].layer else c for c, i in zip(costs, r)]
        parts.append(Part(f"{prefix}{k}", g, combine(*costs), tuple(chain[i].name for i in r)))
    return parts


def split_groups(groups: Sequence[Group], weights: Sequence[float],
                 caps: Sequence[int] | None = None) -> list[list[Group]] | None:
    """Consecutive shares of the groups in proportion to the weights, at least one each and at
    most `caps[i]` (a run of k units fills at most k stages); None when they cannot be filled."""
    n, m = len(groups), len(weights)
    cap = list(caps) if caps is not None else [n] * m
    if n < m or sum(cap) < n:
        return None
    total = sum(weights) or 1.0
    sizes = [min(cap[i], max(1, round(n * weights[i] / total))) for i in range(m)]
    while sum(sizes) > n:
        sizes[max(range(m), key=lambda i: sizes[i] / max(weights[i], 1e-30))] -= 1
    while sum(sizes) < n:
        open_ = [i for i in range(m) if sizes[i] < cap[i]]
        sizes[min(open_, key=lambda i: sizes[i] / max(weights[i], 1e-30))] += 1
    if min(sizes) < 1:
        return None
    out, at = [], 0
    for size in sizes:
        out.append(list(groups[at:at + size]))
        at += size
    return out


def _weight(units: Sequence[Unit]) -> float:
    return sum(_time(u.cost((0,))) for u in units)


def _time(c: BlockCost) -> float:
    return c.forward + c.backward


def with_auto_recompute(model: PlacedModel) -> PlacedModel:
    """Recompute a stage's layers only where 1F1B would keep more micro-batches of its
    activations than its device's budget holds (stage k of S keeps S - k in flight): memory
    traded for time where memory binds, nowhere else."""
    budget = model.memory_budget()
    order = _pipeline_positions(model)
    parts = []
    for p in model.parts:
        pos, depth = order.get(p.name, (0, 1))
        need = (depth - pos) * p.cost.activation / (1024 ** 2)
        if need > min(budget[d] for d in p.devices):
            p = replace(p, cost=recomputed(p.cost))
        parts.append(p)
    return replace(model, parts=tuple(parts), name=model.name + "-rc")


def _pipeline_positions(model: PlacedModel) -> dict[str, tuple[int, int]]:
    """Position of each part along its chain of distinct device groups, and the chain's depth;
    a sharded part (on every device) counts as the first position."""
    groups: dict[Group, int] = {}  # in first-seen order (a list's index() was quadratic in stages)
    where: dict[str, int] = {}
    for p in model.parts:
        if len(p.devices) == model.devices:
            where[p.name] = 0
            continue
        where[p.name] = groups.setdefault(p.devices, len(groups))
    return {name: (k, max(len(groups), 1)) for name, k in where.items()}

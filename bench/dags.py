"""A seeded family of random DAG placements: chains, branches, joins, sharded blocks, training
(forward + backward) or inference, integer or fractional costs, memory from loose to just feasible.

`random_case(seed)` is deterministic: the same seed gives the same placement, limit and N.
Used by bench/random_dags.py and the search tests.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from tessel.placement import Block, Number, Placement, make_placement
from tessel.search.fast import sequential
from tessel.search.modulo import steady_memory
from tessel.search.problem import least_memory, make_problem

MEMORY_LEVELS = ("loose", "roomy", "tight", "just")
NS = (8, 32, 128)


@dataclass(frozen=True)
class Case:
    seed: int
    placement: Placement
    memory: tuple[Number, ...] | None
    micro_batches: int
    level: str  # of memory: loose (no limit) .. just (the least limits that can work)


def _cost(rng: random.Random, fractional: bool, lo: int = 1, hi: int = 4) -> Number:
    return round(rng.uniform(lo, hi), 3) if fractional else rng.randint(lo, hi)


def _forward_graph(rng: random.Random, devices: int, blocks: int) -> tuple[list[tuple[int, ...]], list[tuple[int, int]]]:
    """Device sets of forward blocks 0..blocks-1 (in dependency order) and their edges: a main
    chain, branches that leave it and joins that come back, some blocks sharded over devices."""
    devs: list[tuple[int, ...]] = []
    edges: list[tuple[int, int]] = []
    for i in range(blocks):
        r = rng.random()
        if r < 0.15:
            k = rng.randint(2, devices)
            devs.append(tuple(sorted(rng.sample(range(devices), k))))
        else:
            devs.append((min(devices - 1, i * devices // blocks + rng.choice((0, 0, 0, 1))),))
        if i == 0:
            continue
        preds = {i - 1} if rng.random() < 0.8 else {rng.randrange(i)}
        if i >= 2 and rng.random() < 0.25:  # a join from an earlier block (a branch coming back)
            preds.add(rng.randrange(i - 1))
        edges += [(a, i) for a in sorted(preds)]
    return devs, edges


def random_placement(rng: random.Random, name: str) -> Placement:
    devices = rng.randint(3, 8)
    nf = rng.randint(devices, 2 * devices + 2)
    fractional = rng.random() < 0.4
    training = rng.random() < 0.85
    latency: Number = 0
    if rng.random() < 0.3:
        latency = round(rng.uniform(0.05, 0.5), 3) if fractional else 1
    devs, fedges = _forward_graph(rng, devices, nf)
    blocks: list[Block] = []
    edges: list[tuple[str, str]] = [(f"f{a}", f"f{b}") for a, b in fedges]
    for i, d in enumerate(devs):
        mem: Number = 0
        if training:
            mem = rng.choice((0, 1, 1, 2, 3)) if not fractional else rng.choice((0, 0.5, 1, 1.5, 2.25))
        blocks.append(Block(f"f{i}", "forward", _cost(rng, fractional), mem, d))
    if training:
        succs: dict[int, list[int]] = {i: [] for i in range(nf)}
        for a, b in fedges:
            succs[a].append(b)
        for i in reversed(range(nf)):
            f = blocks[i]
            blocks.append(Block(f"b{i}", "backward", _cost(rng, fractional, 1, 6), -f.memory, f.devices,
                                grad_of=f.id))
            edges += [(f"b{j}", f"b{i}") for j in succs[i]] or [(f.id, f"b{i}")]
        # the loss: every forward sink feeds every backward of a sink
        sinks = [i for i in range(nf) if not succs[i]]
        edges += [(f"f{a}", f"b{b}") for a in sinks for b in sinks if a != b]
    return make_placement(name, devices, blocks, edges, latency)


def random_case(seed: int) -> Case:
    rng = random.Random(seed)
    p = random_placement(rng, f"dag-{seed}")
    level = MEMORY_LEVELS[seed % len(MEMORY_LEVELS)]
    n = NS[(seed // len(MEMORY_LEVELS)) % len(NS)]
    return Case(seed, p, _limit(p, level, rng), n, level)


def _limit(p: Placement, level: str, rng: random.Random) -> tuple[Number, ...] | None:
    if level == "loose" or not p.is_training:
        return None
    problem = make_problem(p)
    # what one micro-batch at a time needs (feasible by construction), at least the proven minimum
    one = steady_memory(problem, sequential(problem))
    least = [max(a, b) / problem.memory_scale for a, b in zip(one, least_memory(problem.units))]
    factor = {"roomy": 3.0, "tight": 1.5, "just": 1.0}[level]
    out = []
    for x in least:
        v = x * factor if level != "tight" else x + rng.choice((0, 1)) * max(x / 2, 0.5)
        out.append(int(v) if float(v).is_integer() else round(v, 3))
    return tuple(max(v, x) for v, x in zip(out, least))

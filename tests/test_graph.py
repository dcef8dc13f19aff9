"""graph.py against brute-force references, and the one-home helpers its callers now share."""
from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessel import graph, library
from tessel.baselines import BASELINES
from tessel.baselines.shapes import components as block_components
from tessel.baselines.shapes import one_f_one_b
from tessel.numeric import fmt, integral, rounded, snap
from tessel.placement import Block, make_placement
from tessel.schedule import windows
from tessel.search.problem import least_memory, make_problem

Graph = tuple[list[str], list[tuple[str, str]]]


@st.composite
def dags(draw: st.DrawFn) -> Graph:
    """A random DAG: nodes in a shuffled order, edges only from a lower to a higher hidden rank."""
    n = draw(st.integers(1, 9))
    names = [f"n{i}" for i in range(n)]
    pairs = [(a, b) for a, b in itertools.combinations(range(n), 2)]
    chosen = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=len(pairs))) if pairs else []
    order = draw(st.permutations(names))
    return list(order), [(names[a], names[b]) for a, b in chosen]


def closure(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, set[str]]:
    """Reachability by Floyd–Warshall on booleans: reach[x] = every node with a path to x."""
    reach = {(a, b) for a, b in edges}
    for k, i, j in itertools.product(nodes, nodes, nodes):
        if (i, k) in reach and (k, j) in reach:
            reach.add((i, j))
    return {x: {a for a in nodes if (a, x) in reach} for x in nodes}


def preds_of(nodes: list[str], edges: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {x: [] for x in nodes}
    for a, b in edges:
        out[b].append(a)
    return out


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(dags())
def test_topo_order_respects_every_edge_and_takes_the_least_ready(g: Graph) -> None:
    nodes, edges = g
    weight = {x: i for i, x in enumerate(reversed(nodes))}
    for key in (None, weight.__getitem__):
        order = graph.topo_sorted(nodes, graph.successors(nodes, edges), key)
        assert sorted(order) == sorted(nodes)
        pos = {x: i for i, x in enumerate(order)}
        assert all(pos[a] < pos[b] for a, b in edges)
    # with a key, each step takes the least-keyed node among those whose predecessors are done
    preds = preds_of(nodes, edges)
    done: set[str] = set()
    for x in graph.topo_sorted(nodes, graph.successors(nodes, edges), weight.__getitem__):
        ready = [y for y in nodes if y not in done and all(a in done for a in preds[y])]
        assert x == min(ready, key=weight.__getitem__)
        done.add(x)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(dags())
def test_ancestors_and_descendants_equal_the_transitive_closure(g: Graph) -> None:
    nodes, edges = g
    order = graph.topo_sorted(nodes, graph.successors(nodes, edges))
    reach = closure(nodes, edges)
    anc = graph.ancestors(order, preds_of(nodes, edges))
    desc = graph.descendants(order, graph.successors(nodes, edges))
    assert {x: set(v) for x, v in anc.items()} == reach
    assert {x: set(v) for x, v in desc.items()} == {x: {y for y in nodes if x in reach[y]} for x in nodes}
    assert {x: members(order, v) for x, v in graph.ancestor_bits(order, preds_of(nodes, edges)).items()} == reach


def members(order: list[str], bits: int) -> set[str]:
    """The nodes of a bit set over `order` (graph.ancestor_bits)."""
    return {x for i, x in enumerate(order) if bits >> i & 1}


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(dags(), st.data())
def test_least_memory_equals_the_walk_over_each_blocks_ancestors(g: Graph, data: st.DataObject) -> None:
    """least_memory's popcounts per memory value against its definition, walked block by block."""
    nodes, edges = g
    memory = {x: data.draw(st.integers(-3, 3)) for x in nodes}
    devices = {x: tuple(data.draw(st.sets(st.integers(0, 2), min_size=1, max_size=2))) for x in nodes}
    p = make_placement("g", 3, [Block(x, "forward", 1, memory[x], devices[x]) for x in nodes], edges)
    reach = closure(nodes, edges)
    want = [0, 0, 0]
    for x in nodes:
        for d in devices[x] if memory[x] > 0 else ():
            want[d] = max(want[d], memory[x] + sum(memory[a] for a in reach[x] if d in devices[a]))
    assert least_memory(p) == want


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(dags())
def test_components_partition_the_nodes_into_connected_parts(g: Graph) -> None:
    nodes, edges = g
    parts = graph.components(nodes, edges)
    assert sorted(x for part in parts for x in part) == sorted(nodes)
    undirected = edges + [(b, a) for a, b in edges]
    reach = closure(nodes, undirected)
    where = {x: i for i, part in enumerate(parts) for x in part}
    for a, b in itertools.combinations(nodes, 2):
        assert (where[a] == where[b]) == (a in reach[b])
    rank = {x: i for i, x in enumerate(nodes)}
    assert all(part == sorted(part, key=rank.__getitem__) for part in parts)
    assert [rank[p[0]] for p in parts] == sorted(rank[p[0]] for p in parts)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(dags(), st.data())
def test_find_cycle_finds_a_real_cycle_exactly_when_one_exists(g: Graph, data: st.DataObject) -> None:
    nodes, edges = g
    assert graph.find_cycle(nodes, graph.successors(nodes, edges)) == []
    if not edges:
        return
    a, b = data.draw(st.sampled_from(edges))
    back = edges + [(b, a)]
    cycle = graph.find_cycle(nodes, graph.successors(nodes, back))
    assert cycle and len(set(cycle)) == len(cycle)
    assert all(e in back for e in zip(cycle, cycle[1:] + cycle[:1]))


def test_placement_and_search_use_the_same_walks() -> None:
    """Placement.topo_order, baseline components and search ancestors agree with graph.py."""
    p = library.build("nnshape", devices=4)
    ids = [b.id for b in p.blocks]
    assert list(p.topo_order) == graph.topo_sorted(ids, graph.successors(ids, p.edges),
                                                   {x: i for i, x in enumerate(ids)}.__getitem__)
    assert block_components(p) == graph.components(ids, p.edges)
    problem = make_problem(p, None)
    anc = graph.ancestors(p.topo_order, p.preds)
    assert {x: members(list(p.topo_order), bits) for x, bits in problem.ancestors.items()} == anc


def test_least_memory_counts_ancestors_on_the_same_device() -> None:
    blocks = [Block("a", "forward", 1, 2, (0,)), Block("b", "forward", 1, 3, (1,)),
              Block("c", "backward", 1, 1, (0,)), Block("d", "backward", 1, -6, (0, 1))]
    p = make_placement("m", 2, blocks, [("a", "b"), ("b", "c"), ("c", "d")])
    # c allocates on top of a (same device 0) but not b (device 1)
    assert least_memory(p) == [3, 3]


def test_one_f_one_b_runs_warm_up_pairs_and_cool_down() -> None:
    fwd = [("f", m) for m in range(4)]
    bwd = [("b", m) for m in range(4)]
    assert one_f_one_b(fwd, bwd, 0) == [k for pair in zip(fwd, bwd) for k in pair]
    assert one_f_one_b(fwd, bwd, 4) == fwd + bwd
    order = one_f_one_b(fwd, bwd, 2)
    assert order[:2] == fwd[:2] and order[-2:] == bwd[-2:] and sorted(order) == sorted(fwd + bwd)
    assert all(order.index(("f", m)) < order.index(("b", m)) for m in range(4))


def test_numbers_keep_integers_whole_and_round_the_rest() -> None:
    assert snap(2.9999999999) == 3 and isinstance(snap(2.9999999999), int) and snap(2.5) == 2.5
    assert rounded(1 / 3, 6) == 0.333333 and rounded(4.0000000001, 6) == 4
    assert integral(2.0) == 2 and isinstance(integral(2.0), int) and integral(2.5) == 2.5
    assert fmt(3.0) == "3" and fmt(1 / 3) == "0.3333" and fmt(None) == "-" and fmt([1, 2.5]) == "1,2.5"
    assert fmt(1 / 3, 2, "f") == "0.33" and fmt(None, none="–") == "–" and fmt(0.1234567, 6) == f"{0.1234567:g}"


def test_kernel_is_the_window_unroll_repeats() -> None:
    p = library.build("vshape", devices=4)
    s = BASELINES["1f1b"](p, 8, None)
    k = s.kernel()
    assert k is not None and k.whole and k.shift >= 1
    rep = s.repetend
    assert rep is not None
    inside = {(t.block, t.micro_batch) for t in s.tasks if rep.start - 1e-9 <= t.start < rep.end - 1e-9}
    assert {(t.block, t.micro_batch) for t in k.tasks} == inside
    assert len(k.tasks) == k.shift * len(p.blocks)
    longer = s.unroll(8 + 2 * k.shift)  # validated by unroll
    assert longer.micro_batches == 8 + 2 * k.shift
    assert longer.makespan == s.makespan + 2 * rep.period
    bare = replace(s, repetend=None)
    assert bare.kernel() is None


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=25), st.integers(1, 8), st.integers(1, 6))
def test_windows_are_the_spans_holding_exactly_size_tasks(raw: list[int], period: int, size: int) -> None:
    times = sorted(raw)
    got = [(times[i], j - i) for i, j in windows(times, period, size)]
    want = [(t, size) for t in sorted(set(times)) if sum(t <= x < t + period for x in times) == size]
    assert got == want
    assert all(times[i] != times[i - 1] for i, _ in windows(times, period, size) if i)

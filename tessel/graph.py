"""Directed-graph helpers over block ids: dependency order, ancestors, components, cycles.

One home for walks that placements, searches and baselines all need, so they cannot drift
apart. Nodes are given in a sequence (its order breaks ties, which keeps results
deterministic); edges are (a, b) pairs meaning a before b.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

Edges = Iterable[tuple[str, str]]


def successors(nodes: Sequence[str], edges: Edges) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {x: [] for x in nodes}
    for a, b in edges:
        out[a].append(b)
    return out


def topo_sorted(nodes: Sequence[str], succs: Mapping[str, Sequence[str]],
                key: Callable[[str], Any] | None = None) -> list[str]:
    """A dependency order that, among the nodes ready at each step, takes the least `key`
    (ties, and no key: the node that became ready first). Nodes on a cycle are left out.
    O((V + E) log V)."""
    indeg = dict.fromkeys(nodes, 0)
    for x in nodes:
        for y in succs[x]:
            indeg[y] += 1
    rank = key or (lambda _: 0)
    count = 0
    ready: list[tuple[Any, int, str]] = []
    for x in nodes:
        if indeg[x] == 0:
            heapq.heappush(ready, (rank(x), count, x))
            count += 1
    order: list[str] = []
    while ready:
        x = heapq.heappop(ready)[2]
        order.append(x)
        for y in succs[x]:
            indeg[y] -= 1
            if indeg[y] == 0:
                heapq.heappush(ready, (rank(y), count, y))
                count += 1
    return order


def ancestors(order: Sequence[str], preds: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """Every node's transitive predecessors; `order` must be a dependency order."""
    anc: dict[str, frozenset[str]] = {}
    for x in order:
        anc[x] = frozenset().union(*({a} | anc[a] for a in preds[x]))
    return anc


def ancestor_bits(order: Sequence[str], preds: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Every node's transitive predecessors as a bit set: bit i is order[i] (`order` a dependency
    order). The sets of a long chain hold V**2 / 2 members in all: as frozensets that was seconds
    and gigabytes at 8,192 blocks, as integers it is megabytes and one C-level OR per edge."""
    index = {x: i for i, x in enumerate(order)}
    anc: dict[str, int] = {}
    for x in order:
        bits = 0
        for a in preds[x]:
            bits |= anc[a] | (1 << index[a])
        anc[x] = bits
    return anc


def descendants(order: Sequence[str], succs: Mapping[str, Sequence[str]]) -> dict[str, frozenset[str]]:
    """Every node's transitive successors; `order` must be a dependency order."""
    return ancestors(list(reversed(order)), succs)


def components(nodes: Sequence[str], edges: Edges) -> list[list[str]]:
    """Weakly connected components, each in `nodes` order, ordered by their first node."""
    root = {x: x for x in nodes}

    def find(x: str) -> str:
        while root[x] != x:
            root[x] = root[root[x]]
            x = root[x]
        return x

    for a, b in edges:
        root[find(a)] = find(b)
    groups: dict[str, list[str]] = {}
    for x in nodes:
        groups.setdefault(find(x), []).append(x)
    return list(groups.values())


def find_cycle(nodes: Sequence[str], succs: Mapping[str, Sequence[str]]) -> list[str]:
    """One cycle as a list of nodes, or [] when the graph is acyclic (iterative DFS)."""
    color = dict.fromkeys(nodes, 0)
    for start in nodes:
        if color[start]:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = 1
                path.append(node)
            if i < len(succs[node]):
                stack.append((node, i + 1))
                nxt = succs[node][i]
                if color[nxt] == 1:
                    return path[path.index(nxt):]
                if color[nxt] == 0:
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return []

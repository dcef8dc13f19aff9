"""How long a micro-batch holds memory on a device: the least time from the start of an
allocating block to the end of its releasing one (Little's law in bounds.memory_lower_bound and
Problem.memory_period_bound), exact while longest paths are cheap, a path below it above that."""
from __future__ import annotations

from collections.abc import Callable

from .placement import Number, Placement


def hold_time(p: Placement, first: str, last: str) -> Number:
    """Least time from the start of `first` to the end of `last` (a descendant): the longest path."""
    dist: dict[str, Number] = {first: 0}
    for x in p.topo_order:
        if x in dist:
            for y in p.succs[x]:
                dist[y] = max(dist.get(y, 0), dist[x] + p.by_id[x].duration + p.edge_latency(x, y))
    return dist[last] + p.by_id[last].duration


HOLD_WORK = 5_000_000  # memory pairs x blocks up to which each pair's hold is its longest path (quadratic above)


def holds_of(p: Placement, pairs: int) -> Callable[[str, str], Number]:
    """hold_time while `pairs` longest paths are cheap, else chain_hold(p): a lower bound of it in O(1)."""
    return _longest_holds(p) if pairs * len(p.blocks) <= HOLD_WORK else chain_hold(p)


def _longest_holds(p: Placement) -> Callable[[str, str], Number]:
    """hold_time, its lookups done once for all pairs, the same sums in the same order (1,024 devices: 2x)."""
    order = p.topo_order
    at = {x: i for i, x in enumerate(order)}
    duration = {x: p.by_id[x].duration for x in order}
    out = {x: [(y, p.edge_latency(x, y)) for y in p.succs[x]] for x in order}

    def hold(first: str, last: str) -> Number:
        dist: dict[str, Number] = {first: 0}
        for x in order[at[first]:at[last]]:  # only these can lie on a path from first to last
            if (d := dist.get(x)) is not None:
                d += duration[x]
                for y, lat in out[x]:
                    dist[y] = max(dist.get(y, 0), d + lat)
        return dist[last] + duration[last]
    return hold


def chain_hold(p: Placement) -> Callable[[str, str], Number]:
    """A least time from the start of a to the end of r (its descendant) in O(1) after one pass:
    the length of one path from a to r, a lower bound of the longest (hold_time), along
    consecutive blocks of the topological order where each is an edge; else a's least gap to a
    successor and r's duration. For thousands of devices, where a longest path per memory pair
    is quadratic."""
    order = p.topo_order
    at = {b: i for i, b in enumerate(order)}
    run, prefix = [0], [0.0]

    def gap(x: str, y: str) -> Number:
        return p.by_id[x].duration + p.edge_latency(x, y)

    for k in range(1, len(order)):
        x, y = order[k - 1], order[k]
        linked = y in p.succs[x]
        run.append(run[-1] if linked else k)
        prefix.append(prefix[-1] + gap(x, y) if linked else 0.0)

    def hold(a: str, r: str) -> Number:
        i, j = at[a], at[r]
        path = prefix[j] - prefix[i] if run[j] <= i else min(gap(a, y) for y in p.succs[a])
        return path + p.by_id[r].duration
    return hold

"""Lower bounds of FORMAT.md: critical path, per-device head + N * load + tail."""
from __future__ import annotations

from dataclasses import dataclass

from .placement import Number, Placement


@dataclass(frozen=True)
class Paths:
    """Longest paths of one micro-batch: earliest start of each block and the least time after it."""
    earliest: dict[str, Number]
    tail: dict[str, Number]

    @property
    def critical_path(self) -> Number:
        return max(self.earliest[b] + self.tail[b] for b in self.earliest)


def paths(p: Placement) -> Paths:
    est: dict[str, Number] = {}
    for x in p.topo_order:
        est[x] = max((est[a] + p.by_id[a].duration + p.edge_latency(a, x) for a in p.preds[x]),
                     default=0)
    # tail[x] counts x's own duration: the least time from x's start to the micro-batch's end
    tail: dict[str, Number] = {}
    for x in reversed(p.topo_order):
        tail[x] = p.by_id[x].duration + max(
            (p.edge_latency(x, s) + tail[s] for s in p.succs[x]), default=0)
    return Paths(est, tail)


def device_head_tail(p: Placement, device: int, pt: Paths | None = None) -> tuple[Number, Number]:
    """Earliest any block of `device` can start, and least time that must follow one's end."""
    pt = pt or paths(p)
    on = p.blocks_on(device)
    head = min(pt.earliest[b.id] for b in on)
    tail = min(pt.tail[b.id] - b.duration for b in on)
    return head, tail


def lower_bound(p: Placement, micro_batches: int) -> Number:
    """max(critical path, max over devices of head + N * load + tail)."""
    pt = paths(p)
    lb = pt.critical_path
    for d in range(p.devices):
        if not p.blocks_on(d):
            continue
        head, tail = device_head_tail(p, d, pt)
        lb = max(lb, head + micro_batches * p.loads[d] + tail)
    return lb


def period_lower_bound(p: Placement) -> Number:
    """No steady state repeats faster than the busiest device's load per micro-batch."""
    return max(p.loads)

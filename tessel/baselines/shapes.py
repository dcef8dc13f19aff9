"""Recognise the placement shapes that hand-made schedules were written for.

A *pipeline chain* is a set of single-device blocks: forwards in a path, the last forward feeding
the first backward, backwards in a path back over the same devices in reverse, and optionally one
weight block after each backward on its device. Nothing else connects them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import graph
from ..errors import TesselError
from ..key import Key
from ..placement import Placement


class BaselineError(TesselError):
    """A baseline that does not fit the placement, or cannot meet the memory limit; says why."""


FORWARD_PHASE = ("forward", "other")


@dataclass(frozen=True)
class Chain:
    forward: tuple[str, ...]
    backward: tuple[str, ...]
    weight: dict[str, str]

    def device(self, p: Placement, block: str) -> int:
        return p.by_id[block].devices[0]

    def devices(self, p: Placement) -> list[int]:
        return [self.device(p, f) for f in self.forward]


def check_phases(p: Placement, method: str) -> None:
    """Forward-phase blocks never wait on backward-phase ones (true of every training placement)."""
    for a, b in p.edges:
        if p.by_id[a].kind not in FORWARD_PHASE and p.by_id[b].kind in FORWARD_PHASE:
            raise BaselineError(f"{method} runs all forwards before backwards, but edge {a} -> {b} "
                                f"feeds a {p.by_id[a].kind} block into a forward one")


def components(p: Placement) -> list[list[str]]:
    """Weakly connected components, each in declaration order, ordered by their first block."""
    return graph.components([b.id for b in p.blocks], p.edges)


def _path(p: Placement, ids: list[str], what: str) -> list[str]:
    inside = set(ids)
    succ = {x: [y for y in p.succs[x] if y in inside] for x in ids}
    heads = [x for x in ids if not any(a in inside for a in p.preds[x])]
    if len(heads) != 1 or any(len(v) > 1 for v in succ.values()):
        raise BaselineError(f"its {what} blocks do not form one chain")
    path = [heads[0]]
    while succ[path[-1]]:
        path.append(succ[path[-1]][0])
    if len(path) != len(ids):
        raise BaselineError(f"its {what} blocks do not form one chain")
    return path


def chain(p: Placement, ids: list[str]) -> Chain:
    """The pipeline chain made of these blocks, or BaselineError saying what differs."""
    by = p.by_id
    multi = next((x for x in ids if len(by[x].devices) != 1), None)
    if multi:
        raise BaselineError(f"block {multi} runs on several devices; a pipeline stage runs on one")
    kinds = {k: [x for x in ids if by[x].kind == k] for k in ("forward", "backward", "weight", "other")}
    if kinds["other"]:
        raise BaselineError(f"block {kinds['other'][0]} is of kind other")
    fwd = _path(p, kinds["forward"], "forward")
    bwd = _path(p, kinds["backward"], "backward") if kinds["backward"] else []
    if bwd and (len(bwd) != len(fwd) or bwd[0] not in p.succs[fwd[-1]]):
        raise BaselineError("its backward is not the forward chain reversed")
    for i, b in enumerate(bwd):
        if by[b].devices != by[fwd[-1 - i]].devices:
            raise BaselineError(f"backward {b} runs on device {by[b].devices[0]}, not on its stage's "
                                f"device {by[fwd[-1 - i]].devices[0]}")
    weight = {}
    for w in kinds["weight"]:
        src = p.preds[w]
        if len(src) != 1 or src[0] not in bwd or by[src[0]].devices != by[w].devices or p.succs[w]:
            raise BaselineError(f"weight block {w} does not follow exactly one backward on its device")
        weight[src[0]] = w
    edges = len(fwd) - 1 + len(bwd) + len(weight)
    inside = set(ids)
    if sum(1 for a, _ in p.edges if a in inside) != edges:
        raise BaselineError("it has edges besides the pipeline's own")
    return Chain(tuple(fwd), tuple(bwd), weight)


def single_chain(p: Placement, method: str) -> Chain:
    comps = components(p)
    if len(comps) != 1:
        raise BaselineError(f"{method} needs one pipeline; placement {p.name} has {len(comps)} separate parts")
    try:
        return chain(p, comps[0])
    except BaselineError as e:
        raise BaselineError(f"{method} needs a pipeline placement: {e}") from None


def one_f_one_b(fwd: Sequence[Key], bwd: Sequence[Key], warm: int) -> list[Key]:
    """The 1F1B order of one stage: `warm` forwards, then forward-backward pairs, then the
    backwards left (the cool-down)."""
    order = list(fwd[:warm])
    for k in range(len(fwd) - warm):
        order += [fwd[warm + k], bwd[k]]
    return order + list(bwd[len(fwd) - warm:])

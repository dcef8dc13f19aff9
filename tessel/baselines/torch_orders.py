"""torch.distributed.pipelining's own schedule generators as baselines (torch is optional).

Torch builds a schedule's per-rank action lists without a process group when its stages are
stand-ins: `unittest.mock.create_autospec(PipelineStage, instance=True)` with `group_rank`,
`group_size` and `num_stages` set, then `pipeline_order` holds every rank's actions. The actions
map onto a tessel placement of the same shape, block for block:

- torch stage i is the i-th stage of the placement's pipeline chain (forward `F` its forward,
  `I` its input gradient B, `W` its weight gradient, `B` a full backward: B then W back to back on
  a split placement), torch's rank r is tessel's device r; a stage torch puts on another rank
  than the placement does is refused, not remapped;
- an overlapped pair (`OVERLAP_F_B`, DualPipeV) runs its two actions back to back;
- communication, resharding and gradient-reduction actions are not compute: left out.

Every order is checked before it is timed: each device runs each of its tasks exactly once
(torch 2.13's Schedule1F1B, for one, leaves micro-batch 0's forward out on the last rank). The
orders are per-device; tessel.timing places them in time with the placement's real costs and
latency, and run_baseline validates the result like any baseline's.
"""
from __future__ import annotations

import importlib.util
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from ..key import Key
from ..placement import Placement
from .shapes import BaselineError, Chain, single_chain


@dataclass(frozen=True)
class TorchSchedule:
    """One of torch's schedule classes and the placement shape its stage mapping assumes."""
    cls: str  # class name in torch.distributed.pipelining.schedules
    style: str  # "v": stage i on rank i, then back (zbv); "loop": stage i on rank i mod p (interleaved)
    split: bool  # needs the backward split into B and W (its actions include I and W)


TORCH: dict[str, TorchSchedule] = {
    "torch-zbv": TorchSchedule("ScheduleZBVZeroBubble", "v", True),
    "torch-dualpipev": TorchSchedule("ScheduleDualPipeV", "v", True),
    "torch-interleaved-1f1b": TorchSchedule("ScheduleInterleaved1F1B", "loop", False),
    "torch-interleaved-zb": TorchSchedule("ScheduleInterleavedZeroBubble", "loop", True),
}


def torch_chain(p: Placement, method: str) -> Chain:
    """The pipeline chain torch's schedule `method` runs on this placement, or BaselineError."""
    spec = TORCH[method]
    c = single_chain(p, method)
    k, size = p.devices, len(c.forward)
    if spec.style == "v":
        want = list(range(k)) + list(range(k - 1, -1, -1))
        shape = "a V: two chunks per device, chunk 0 on devices 0..p-1 and chunk 1 back on p-1..0 (placement zbv)"
    else:
        want = [i % k for i in range(size)]
        shape = "a looped pipeline: stage i on device i mod p, >= 2 chunks per device (placement interleaved)"
    if c.devices(p) != want or (spec.style == "loop" and (size % k or size < 2 * k)):
        raise BaselineError(f"{method} needs {shape}")
    if not c.backward:
        raise BaselineError(f"{method} needs a training placement (backward blocks)")
    split = len(c.weight) == len(c.backward)
    if spec.split and not split:
        raise BaselineError(f"{method} needs every backward split into B and W (placement "
                            f"{'zbv' if spec.style == 'v' else 'interleaved-zb'})")
    if not torch_available():
        raise BaselineError(f"{method} runs torch's own generator: install torch (pip install 'tessel[torch]')")
    return c


def torch_orders(p: Placement, method: str, n: int) -> list[list[Key]]:
    """Each device's order of torch's schedule `method` for `n` micro-batches, checked complete."""
    c = torch_chain(p, method)
    k, size = p.devices, len(c.forward)
    actions = _actions(TORCH[method].cls, k, size // k, n)
    orders: list[list[Key]] = [[] for _ in range(k)]
    for rank, acts in enumerate(actions):
        for act in acts:
            for stage, kind, m in act:
                _place(p, c, method, orders, rank, stage, kind, m)
    _check_complete(p, method, n, orders)
    return orders


def _place(p: Placement, c: Chain, method: str, orders: list[list[Key]], rank: int, stage: int, kind: str,
           m: int) -> None:
    size = len(c.forward)
    if not 0 <= stage < size or not 0 <= rank < p.devices:
        raise BaselineError(f"{method}: torch's action {stage}{kind}{m} on rank {rank} is outside the placement")
    device = c.device(p, c.forward[stage])
    if device != rank:
        raise BaselineError(f"{method}: torch runs stage {stage} on rank {rank}, the placement on device {device}")
    back = c.backward[size - 1 - stage]
    if kind == "F":
        orders[rank].append((c.forward[stage], m))
    elif kind == "I":
        orders[rank].append((back, m))
    elif kind == "W":
        orders[rank].append((c.weight[back], m))
    else:  # "B": the whole backward, B then W back to back where the placement splits it
        orders[rank].append((back, m))
        if back in c.weight:
            orders[rank].append((c.weight[back], m))


def _check_complete(p: Placement, method: str, n: int, orders: Sequence[list[Key]]) -> None:
    """Each device runs each of its tasks exactly once; else one line naming the first wrong task."""
    for d, order in enumerate(orders):
        want = Counter((b.id, m) for b in p.blocks_on(d) for m in range(n))
        got = Counter(order)
        missing = sorted(want - got)
        extra = sorted(got - want)
        if missing:
            raise BaselineError(f"{method}: torch's order for device {d} never runs {missing[0][0]} of micro-batch "
                                f"{missing[0][1]} ({len(missing)} task(s) missing)")
        if extra:
            raise BaselineError(f"{method}: torch's order for device {d} runs {extra[0][0]} of micro-batch "
                                f"{extra[0][1]} twice or where it does not belong")


Action = tuple[int, str, int]  # stage, computation type (F, I, W, B), micro-batch


@lru_cache(maxsize=64)
def _actions(cls_name: str, ranks: int, per_rank: int, n: int) -> tuple[tuple[tuple[Action, ...], ...], ...]:
    """Per rank, per step: the compute actions of torch's generator (an overlapped pair is one
    step of two). Cached: run_baseline builds a few sizes while it looks for the repetend."""
    from unittest import mock  # lazily: only when a torch baseline runs

    from torch.distributed.pipelining import PipelineStage, schedules

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.num_stages, stage.submod = 0, ranks, ranks * per_rank, None
    cls = getattr(schedules, cls_name)
    try:
        order = cls([stage] * per_rank, n).pipeline_order
    except (ValueError, AssertionError, RuntimeError) as e:  # its own limits, e.g. too few micro-batches
        raise BaselineError(f"torch's {cls_name} refuses {ranks} ranks x {per_rank} stages, {n} micro-batches: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return tuple(tuple(_compute(a) for a in order.get(r, []) if a is not None and _compute(a))
                 for r in range(ranks))


def _compute(a: Any) -> tuple[Action, ...]:
    """The compute actions of one torch action (sub-actions of an overlapped pair in turn)."""
    if a.sub_actions:
        return tuple(x for sub in a.sub_actions for x in _compute(sub))
    kind = a.computation_type.value
    if kind not in ("F", "I", "W", "B") or a.microbatch_index is None:
        return ()
    return ((int(a.stage_index), str(kind), int(a.microbatch_index)),)


def torch_available() -> bool:
    """Whether torch can be imported here (an import hook that refuses it counts as absent)."""
    try:
        return importlib.util.find_spec("torch") is not None
    except ImportError:
        return False
